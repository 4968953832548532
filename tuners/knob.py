"""The tuner protocol and the records every tuner exchanges: a frozen ``Change``, a ``Skip``
with its reason, a ``Manual`` step where the host has no interface for a knob.

Design after tuned's plugin base (get/set pairs; the original saved before a write, restored in
reverse order; verify compares the wanted value with the live one), with the original kept on
disk (``tuners.journal``) instead of in RAM (tcp-tuning.md §2.2, R-24).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from wanprobe.errors import ConfigError


@dataclass(frozen=True)
class Change:
    """One planned or journalled write: ``key`` of ``tuner`` goes from ``old`` to ``new``.

    ``old`` is None when the setting does not exist yet (e.g. no nft table). ``netns_inode`` is
    the namespace the change belongs to (0 in a plan not yet bound to a namespace).
    """

    tuner: str
    key: str
    old: str | None
    new: str
    reason: str = ""
    netns_inode: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Any) -> Change:
        if not isinstance(d, dict):
            raise ConfigError(f"a change must be an object, got {type(d).__name__}")
        try:
            old = d.get("old")
            return cls(tuner=str(d["tuner"]), key=str(d["key"]),
                       old=None if old is None else str(old), new=str(d["new"]),
                       reason=str(d.get("reason", "")), netns_inode=int(d.get("netns_inode", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"bad change {d!r:.80}: missing or bad field {exc}") from None


@dataclass(frozen=True)
class Skip:
    """A knob the planner or the validator left out, with the one-line reason."""

    tuner: str
    key: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Manual:
    """A recommendation wanprobe cannot apply here; the exact commands go in the plan."""

    tuner: str
    key: str
    value: str
    reason: str
    commands: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"tuner": self.tuner, "key": self.key, "value": self.value,
                "reason": self.reason, "commands": list(self.commands)}


class WrittenValue(ABC):
    """``apply`` and ``verify`` for tuners whose knob is one value that ``_write`` sets and
    ``current`` reads back (sysctl, link, roce): verify compares the live value with the wanted
    one, as tuned's ``verify`` does."""

    @abstractmethod
    def current(self, key: str) -> str | None:
        """The live value of ``key`` (normalised), None when absent."""

    @abstractmethod
    def _write(self, key: str, value: str) -> None:
        """Write ``value`` to ``key``; raise TuneError on failure."""

    def apply(self, change: Change) -> None:
        self._write(change.key, change.new)

    def verify(self, key: str, wanted: str | None) -> bool:
        return same_value(self.current(key), wanted)


class Tuner(Protocol):
    """current / plan / apply / verify / rollback for one area (sysctl, link, dscp, roce)."""

    name: str

    def current(self, key: str) -> str | None:
        """The live value of ``key`` (normalised), None when absent."""

    def plan(self, key: str, value: Any, reason: str) -> Change | Skip | Manual:
        """Turn a recommended knob into a validated change, a skip with a reason, or a manual
        step (roce: no kernel interface here)."""

    def validate(self, change: Change) -> None:
        """Raise ConfigError with one line when ``change`` may not be applied here."""

    def apply(self, change: Change) -> None:
        """Write ``change.new``; raise TuneError on failure."""

    def verify(self, key: str, wanted: str | None) -> bool:
        """True when the live value equals ``wanted`` (normalised)."""

    def rollback(self, change: Change) -> None:
        """Write ``change.old`` back (or remove what ``apply`` created when old is None)."""


def normalise(value: str | None) -> str | None:
    """Whitespace-normalised text: tab-separated tcp_rmem compares equal to space-separated."""
    return None if value is None else " ".join(str(value).split())


def same_value(a: str | None, b: str | None) -> bool:
    """tuned-style verify: normalise whitespace, compare field-wise as ints where both are ints."""
    a, b = normalise(a), normalise(b)
    if a is None or b is None:
        return a is b
    fa, fb = a.split(), b.split()
    if len(fa) == len(fb):
        try:
            return [int(x) for x in fa] == [int(x) for x in fb]
        except ValueError:
            pass
    return a == b
