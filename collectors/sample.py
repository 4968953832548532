"""Typed samples shared by every collector: counter sets with units and widths, per-source status
and per-counter errors.

Conventions (docs/conventions.md §3, §4): a counter the driver does not expose is *missing* from
``CounterSet.values`` (never 0); a file that exists but cannot be parsed is an entry in
``errors``; every group carries the path it was read from. Values are the raw integers the
kernel/driver prints; ``units`` names the unit of each value where it is not a plain count
(e.g. ``port_xmit_data`` counts 4-byte words, ``*_pause_duration`` is microseconds) and
``scale`` gives the factor to that unit's base (×4 → bytes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Status = Literal["ok", "no_data", "error"]

COUNT = "count"


@dataclass(frozen=True)
class CollectError:
    """One thing that could not be read: a counter file, a whole source, an ioctl."""

    source: str
    path: str
    reason: str
    counter: str | None = None

    def to_json(self) -> dict:
        out = {"source": self.source, "path": self.path, "reason": self.reason}
        if self.counter is not None:
            out["counter"] = self.counter
        return out


@dataclass(frozen=True)
class SourceStatus:
    """Outcome of one collector for one object: ``ok``, ``no_data`` (absent) or ``error``."""

    source: str
    status: Status
    path: str
    detail: str = ""

    def to_json(self) -> dict:
        out = {"source": self.source, "status": self.status, "path": self.path}
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass(frozen=True)
class CounterSet:
    """A group of monotonically increasing counters read from one place.

    ``widths`` maps a counter to the bit width at which the hardware/kernel wraps it (32, 64);
    a counter without a width (None) is treated as non-wrapping, so a decrease is a reset.
    ``gauges`` are values in the group that are not counters (e.g. ``lifespan``, ``CurrEstab``)
    and get no rate. ``units``/``scale`` describe non-plain-count values (see module doc).
    ``per_file`` says each counter is its own file under ``path`` (sysfs); ``locations``
    overrides the path of individual counters (mlx4 ``counters_ext``).
    """

    path: str
    values: Mapping[str, int]
    widths: Mapping[str, int | None] = field(default_factory=dict)
    units: Mapping[str, str] = field(default_factory=dict)
    scale: Mapping[str, int] = field(default_factory=dict)
    gauges: frozenset[str] = frozenset()
    per_file: bool = False
    locations: Mapping[str, str] = field(default_factory=dict)

    def counter_path(self, name: str) -> str:
        """Where ``name`` was read: ``<dir>/<name>`` for one-file-per-counter groups (sysfs),
        ``<source>#<name>`` for counters parsed out of one file or ioctl reply."""
        if name in self.locations:
            return self.locations[name]
        return f"{self.path}/{name}" if self.per_file else f"{self.path}#{name}"

    def get(self, name: str) -> int | None:
        """The raw value, or None when the counter is absent."""
        return self.values.get(name)

    def width(self, name: str) -> int | None:
        return self.widths.get(name)

    def in_base_unit(self, name: str) -> int | None:
        """Value × scale (e.g. ``port_xmit_data`` words × 4 = bytes); None when absent."""
        v = self.values.get(name)
        return None if v is None else v * self.scale.get(name, 1)

    def to_json(self) -> dict:
        return dict(sorted(self.values.items()))


def units_json(cs: CounterSet | None) -> dict:
    """``{counter: unit}`` for the counters whose unit is not a plain count."""
    if cs is None:
        return {}
    return {k: cs.units[k] for k in sorted(cs.units) if k in cs.values}
