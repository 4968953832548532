"""The diagnose report: frozen dataclasses <-> one versioned JSON document.

The JSON Schema shipped beside this module (``schema.json``) is the contract with the tuners and
the impact model: ``Report.from_json`` validates against it before building anything, so a
hand-edited or truncated file is refused with one line naming the first problem.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources
from pathlib import Path
from typing import Any

from wanprobe.atomic_file import write_error, write_output
from wanprobe.diagnose.finding import SEVERITIES as SEVERITIES
from wanprobe.diagnose.finding import Finding as Finding
from wanprobe.diagnose.finding import Knob as Knob
from wanprobe.diagnose.host_inputs import Host
from wanprobe.diagnose.measured import Measured
from wanprobe.errors import ConfigError, shown
from wanprobe.report.codec import host_of, measured_of
from wanprobe.userfiles import read_json

# SEVERITIES, Finding and Knob are re-exported (``X as X``): the one Finding type, which the
# report's readers import from here

# 1.1 (issue 13): knobs carry "host"; findings may carry "host" and "direction";
# measurements add "throughput_reverse", "peer_facts", "capacity"; path adds
# "capacity_bits_per_second"/"capacity_source"; host adds "facts" and "address". Only optional
# keys were added, so 1.0 readers still read 1.1 documents.
SCHEMA_VERSION = "1.4"
TUNERS = ("sysctl", "link", "dscp", "roce", "nccl")


@cache
def schema() -> dict[str, Any]:
    """The report JSON Schema (draft 2020-12) shipped as package data."""
    text = resources.files("wanprobe.report").joinpath("schema.json").read_text(encoding="utf-8")
    doc: dict[str, Any] = json.loads(text)  # the shipped schema: one JSON object
    return doc


MAX_ERRORS = 100  # validation errors looked at for the one line


@cache
def _validator(strict: bool) -> Any:
    """The schema's validator, built once: building it (its reference registry) cost more than
    validating a whole report."""
    import jsonschema  # a declared dependency: every report is checked against the schema

    return jsonschema.Draft202012Validator(schema() if strict else shape_schema())


def validate(data: Any, *, strict: bool = True) -> None:
    """Raise ConfigError (one line) unless ``data`` is a valid report document.

    ``strict=False`` checks only the shape (``shape_schema``): every part that is present has the
    right container type, so a reader may rely on ``.get`` working; nothing is required."""
    validator = _validator(strict)
    # the first errors only: a hostile 60,000-finding file has 60,000 errors to collect and sort
    errors = sorted(itertools.islice(validator.iter_errors(data), MAX_ERRORS),
                    key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        err = errors[0]
        where = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        raise ConfigError(f"not a valid wanprobe report: at {shown(where)}: {err.message}")


_SHAPE_KEYS = ("$schema", "$id", "$ref", "items", "additionalProperties")
_SHAPE_MAPS = ("$defs", "properties")  # name -> schema


def _shape(node: Any) -> Any:
    """A schema reduced to container types (``shape_schema``)."""
    return _shape_object(node) if isinstance(node, dict) else node


def _shape_object(node: dict[str, Any]) -> dict[str, Any]:
    """One schema object of ``_shape``: its structural keys, reduced in turn."""
    out = {k: _shape(v) for k, v in node.items() if k in _SHAPE_KEYS}
    out.update({k: {name: _shape(sub) for name, sub in node[k].items()}
                for k in _SHAPE_MAPS if isinstance(node.get(k), dict)})
    kinds = node.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds or []
    if "object" in kinds or "array" in kinds:
        out["type"] = node["type"]
    return out


@cache
def shape_schema() -> dict[str, Any]:
    """The report schema reduced to its containers: objects stay objects, arrays stay arrays;
    no key is required and scalars may be of any type (hand-written and older reports)."""
    return _shape_object(schema())


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
        return cls.from_valid(d)

    @classmethod
    def from_valid(cls, d: Any) -> Report:
        """From a document ``validate`` has passed (not validated again)."""
        return cls(id=d["id"], created_at=d["created_at"], tool=d["tool"], host=d["host"],
                   peer=d["peer"], measurements=d["measurements"],
                   findings=tuple(Finding.from_json(f) for f in d["findings"]),
                   timestamps=d["timestamps"], plan=d.get("plan"),
                   schema_version=d["schema_version"])

    @cached_property
    def measured(self) -> Measured:
        """The measurements, typed once by the one parser (report/codec.py): what every
        reader of a report's figures takes."""
        return measured_of(self.measurements)

    @cached_property
    def local_host(self) -> Host | None:
        """The diagnosing host, typed (report/codec.py); None without host facts."""
        return host_of(self.host)

    @property
    def top(self) -> Finding | None:
        """The finding the engine ranked first (the main fault), if any."""
        return self.findings[0] if self.findings else None


def load_json(path: str | Path, *, strict: bool = True) -> dict[str, Any]:
    """The one report loader: read ``path`` as strict JSON (``wanprobe.userfiles``: no NaN, depth
    and size bounded) and validate it (``strict``: the full schema; otherwise its shape only).
    Every failure is one ConfigError line naming the file."""
    p = Path(path)
    doc = read_json(p, "report")
    try:
        validate(doc, strict=strict)
    except ConfigError as exc:
        raise ConfigError(f"report {p}: {exc}") from None
    valid: dict[str, Any] = doc  # both schemas' top level is an object
    return valid


def load(path: str | Path) -> Report:
    """Read and validate a report file into a :class:`Report`."""
    return load_first(path, None)[0]


def load_first(path: str | Path, max_findings: int | None) -> tuple[Report, int]:
    """The report with its first ``max_findings`` findings (None: all) and how many it holds:
    a 43 MB file of 60,000 findings is read, but only what is shown is validated and built
    (validating all of them took 27 s and 500 MB; rendering them, minutes)."""
    p = Path(path)
    doc = read_json(p, "report")
    findings = doc.get("findings") if isinstance(doc, dict) else None
    total = len(findings) if isinstance(findings, list) else 0
    if isinstance(findings, list) and max_findings is not None and total > max_findings:
        doc = {**doc, "findings": findings[:max_findings]}
    try:
        validate(doc)
        return Report.from_valid(doc), total
    except ConfigError as exc:
        raise ConfigError(f"report {p}: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"report {p}: not a valid wanprobe report: {exc}") from None


def with_measurement(doc: Mapping[str, Any], name: str, value: Any) -> dict[str, Any]:
    """The report document ``doc`` with ``measurements[name]`` set to ``value``: a part measured
    after the report was written (the verify of ``tune apply --report-out``)."""
    measurements = doc.get("measurements")
    return {**doc, "measurements": {**(measurements if isinstance(measurements, Mapping)
                                       else {}), name: value}}


def dumps(doc: Mapping[str, Any]) -> str:
    """A report document's text, the one serialisation of every report written: ``save``'s and
    the daemon's tickets (``report/regression.py`` builds them)."""
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def save(report: Report, path: str | Path) -> Path | None:
    """Write the report under the output policy (``atomic_file``: a file atomically, a FIFO
    or /dev/null in place, ``-`` to stdout); a failed write is one line (exit 2 refused, 74 I/O)."""
    data = dumps(report.to_json())
    try:
        return write_output(path, data, mode=0o600)
    except OSError as exc:
        raise write_error(exc, f"report {path}") from None

