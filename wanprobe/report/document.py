"""The diagnose report: frozen dataclasses <-> one versioned JSON document.

The JSON Schema shipped beside this module (``schema.json``) is the contract with the tuners and
the impact model: ``Report.from_json`` validates against it before building anything, so a
hand-edited or truncated file is refused with one line naming the first problem.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from wanprobe.errors import ConfigError

# 1.1 (issue 13): knobs carry "host"; findings may carry "host" and "direction";
# measurements add "throughput_reverse", "peer_facts", "capacity"; path adds
# "capacity_bits_per_second"/"capacity_source"; host adds "facts" and "address". Only optional
# keys were added, so 1.0 readers still read 1.1 documents.
SCHEMA_VERSION = "1.1"
SEVERITIES = ("critical", "warning", "info")
TUNERS = ("sysctl", "link", "dscp", "roce", "nccl")


@cache
def schema() -> dict[str, Any]:
    """The report JSON Schema (draft 2020-12) shipped as package data."""
    text = resources.files("wanprobe.report").joinpath("schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def validate(data: Any) -> None:
    """Raise ConfigError (one line) unless ``data`` is a valid report document."""
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - jsonschema ships with the test extra
        _validate_minimal(data)
        return
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        where = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        raise ConfigError(f"not a valid wanprobe report: at {where}: {err.message}")


def _validate_minimal(data: Any) -> None:
    """Fallback check of the required top-level keys when jsonschema is not installed."""
    if not isinstance(data, dict):
        raise ConfigError("not a valid wanprobe report: top level is not an object")
    for key in schema()["required"]:
        if key not in data:
            raise ConfigError(f"not a valid wanprobe report: missing key {key!r}")


@dataclass(frozen=True)
class Knob:
    """One setting a tuner can plan: ``tuner`` names the tuners/ module, ``key`` its knob."""

    tuner: str
    key: str
    value: str
    reason: str
    side: str | None = None   # "local" | "peer" | "both": which end of the path to set it on
    iface: str | None = None  # link / roce knobs: the interface
    host: str | None = None   # "local" | "peer": the host to set it on (schema 1.1)

    @property
    def for_host(self) -> str:
        """The host this knob is for: explicit ``host``, else ``peer`` for a peer-side knob and
        ``local`` for the rest (host-config and fabric rules judge the host that ran them)."""
        return self.host or ("peer" if self.side == "peer" else "local")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tuner": self.tuner, "key": self.key, "value": self.value,
                               "reason": self.reason}
        if self.host is not None:
            out["host"] = self.host
        if self.side is not None:
            out["side"] = self.side
        if self.iface is not None:
            out["iface"] = self.iface
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Knob:
        return cls(tuner=d["tuner"], key=d["key"], value=d["value"], reason=d["reason"],
                   side=d.get("side"), iface=d.get("iface"), host=d.get("host"))


@dataclass(frozen=True)
class Finding:
    """What is wrong, the numbers that show it, what to do and what it should buy."""

    id: str
    severity: str
    title: str
    evidence: Mapping[str, Any]
    recommendation: str
    expected_effect: str
    knobs: tuple[Knob, ...] = ()
    impact: float | None = None  # modelled share of the achievable rate lost (0..1)
    host: str | None = None       # "local" | "peer": the host the finding is about (1.1)
    direction: str | None = None  # "forward" (local sends) | "reverse" (peer sends) (1.1)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} not in {SEVERITIES}")
        if self.impact is not None:
            object.__setattr__(self, "impact", round(min(1.0, max(0.0, float(self.impact))), 4))

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "severity": self.severity, "title": self.title,
                "evidence": dict(self.evidence), "recommendation": self.recommendation,
                "expected_effect": self.expected_effect,
                "knobs": [k.to_json() for k in self.knobs], "impact": self.impact,
                **{k: v for k, v in (("host", self.host), ("direction", self.direction)) if v}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Finding:
        return cls(id=d["id"], severity=d["severity"], title=d["title"],
                   evidence=dict(d["evidence"]), recommendation=d["recommendation"],
                   expected_effect=d["expected_effect"],
                   knobs=tuple(Knob.from_json(k) for k in d["knobs"]), impact=d.get("impact"),
                   host=d.get("host"), direction=d.get("direction"))


@dataclass(frozen=True)
class Report:
    """The whole document; ``to_json``/``from_json`` round-trip exactly."""

    id: str
    created_at: str
    tool: Mapping[str, str]
    host: Mapping[str, Any]
    peer: Mapping[str, Any]
    measurements: Mapping[str, Any]
    findings: tuple[Finding, ...]
    timestamps: Mapping[str, str]
    plan: Mapping[str, Any] | None = None
    schema_version: str = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "id": self.id,
                "created_at": self.created_at, "tool": dict(self.tool), "host": dict(self.host),
                "peer": dict(self.peer), "measurements": dict(self.measurements),
                "findings": [f.to_json() for f in self.findings], "plan": self.plan,
                "timestamps": dict(self.timestamps)}

    @classmethod
    def from_json(cls, d: Any) -> Report:
        validate(d)
        return cls(id=d["id"], created_at=d["created_at"], tool=d["tool"], host=d["host"],
                   peer=d["peer"], measurements=d["measurements"],
                   findings=tuple(Finding.from_json(f) for f in d["findings"]),
                   timestamps=d["timestamps"], plan=d.get("plan"),
                   schema_version=d["schema_version"])

    @property
    def top(self) -> Finding | None:
        """The finding the engine ranked first (the main fault), if any."""
        return self.findings[0] if self.findings else None


def load(path: str | Path) -> Report:
    """Read and validate a report file; every failure is one ConfigError line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"report {p}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"report {p}: is a directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"report {p}: cannot read: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"report {p}: not JSON: {exc.msg} at line {exc.lineno}") from None
    try:
        return Report.from_json(data)
    except ConfigError as exc:
        raise ConfigError(f"report {p}: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"report {p}: not a valid wanprobe report: {exc}") from None


def save(report: Report, path: str | Path) -> Path:
    """Write the report atomically (temp file in the same directory, then rename)."""
    p = Path(path)
    data = json.dumps(report.to_json(), indent=2, sort_keys=False) + "\n"
    directory = p.parent if str(p.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=directory)
    except OSError as exc:
        raise ConfigError(f"cannot write report {p}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(data)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p

