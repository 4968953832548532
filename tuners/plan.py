"""The plan document: data only. ``tune plan`` writes it, ``tune apply`` validates and applies it.

A plan names the host it was made for (machine-id + hostname), the namespace it was read in,
the report it came from, and an ordered list of changes. Anything a human edits by hand is
re-validated before the first write: one line says what is wrong and nothing changes.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuners.knob import Change, Manual, Skip
from tuners.registry import APPLIABLE
from wanprobe.errors import ConfigError, shown
from wanprobe.userfiles import read_json

PLAN_VERSION = 1


def host_id(etc_root: Path = Path("/etc")) -> str:
    """``<machine-id>/<hostname>``: a plan made on one host is refused on another."""
    try:
        machine = (Path(etc_root) / "machine-id").read_text().strip() or "unknown"
    except OSError:
        machine = "unknown"
    return f"{machine}/{socket.gethostname()}"


@dataclass(frozen=True)
class Plan:
    host_id: str
    netns_inode: int
    created_at: str
    changes: tuple[Change, ...]
    skipped: tuple[Skip, ...] = ()
    manual: tuple[Manual, ...] = ()
    source_report: dict[str, Any] = field(default_factory=dict)
    version: int = PLAN_VERSION
    for_host: str = "local"            # "local" | "peer": the end of the measured path
    host_address: str | None = None    # that host's address as the measuring host saw it
    unknown: tuple[str, ...] = ()      # what the planner could not know (peer sent no facts)

    @property
    def id(self) -> str:
        """Content hash of the changes and host: stable across re-serialisation."""
        body = json.dumps([self.host_id, [c.to_json() for c in self.changes]], sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return {
            "plan_version": self.version, "id": self.id, "host_id": self.host_id,
            "netns_inode": self.netns_inode, "created_at": self.created_at,
            "source_report": self.source_report,
            "changes": [c.to_json() for c in self.changes],
            "skipped": [s.to_json() for s in self.skipped],
            "manual": [m.to_json() for m in self.manual],
            "for_host": self.for_host, "host_address": self.host_address,
            "unknown": list(self.unknown),
        }

    @classmethod
    def from_json(cls, d: Any) -> Plan:
        try:
            return cls._from_json(d)
        except (TypeError, ValueError, AttributeError) as exc:  # hand edits: wrong types
            raise ConfigError(f"malformed plan: {exc}") from None

    @classmethod
    def _from_json(cls, d: Any) -> Plan:
        if not isinstance(d, dict):
            raise ConfigError("plan must be a JSON object")
        if d.get("plan_version") != PLAN_VERSION:
            raise ConfigError(f"unsupported plan_version {shown(d.get('plan_version'))} (this wanprobe reads {PLAN_VERSION})")
        for key in ("host_id", "changes"):
            if key not in d:
                raise ConfigError(f"plan has no {shown(key)}")
        if not isinstance(d["changes"], list):
            raise ConfigError("plan 'changes' must be a list")
        changes = tuple(Change.from_json(c) for c in d["changes"])
        for c in changes:
            if c.tuner not in APPLIABLE:
                raise ConfigError(f"unknown tuner {shown(c.tuner)} for key {shown(c.key)} (one of {', '.join(APPLIABLE)})")
        seen: set[tuple[str, str]] = set()
        for c in changes:
            if (c.tuner, c.key) in seen:
                raise ConfigError(f"{c.tuner} key {shown(c.key)} appears twice in the plan")
            seen.add((c.tuner, c.key))
        manual = tuple(Manual(str(m.get("tuner")), str(m.get("key")), str(m.get("value")),
                              str(m.get("reason", "")), tuple(m.get("commands") or ()))
                       for m in d.get("manual") or [] if isinstance(m, dict))
        skipped = tuple(Skip(str(s.get("tuner")), str(s.get("key")), str(s.get("reason")))
                        for s in d.get("skipped") or [] if isinstance(s, dict))
        plan = cls(host_id=str(d["host_id"]), netns_inode=int(d.get("netns_inode") or 0),
                   created_at=str(d.get("created_at", "")), changes=changes, skipped=skipped,
                   manual=manual, source_report=dict(d.get("source_report") or {}),
                   for_host=str(d.get("for_host") or "local"),
                   host_address=_address(d.get("host_address")),
                   unknown=tuple(str(u) for u in d.get("unknown") or ()))
        return plan  # a stale "id" after a hand edit is recomputed; the content is re-validated


def load(path: str | Path) -> Plan:
    """Read a plan file; every problem is one ConfigError line."""
    return Plan.from_json(read_json(path, "plan"))


def save(plan: Plan, path: str | Path) -> Path | None:
    """Write under the output policy (``atomic_file``: a file atomically, a FIFO or /dev/null in
    place, ``-`` to stdout); a failed write is one line (exit 2 refused, 74 I/O)."""
    from wanprobe.atomic_file import write_error, write_output

    try:
        return write_output(path, json.dumps(plan.to_json(), indent=2) + "\n")
    except OSError as exc:
        raise write_error(exc, f"plan {path}") from None


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _address(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return str(ipaddress.ip_address(str(value)))
    except ValueError:
        raise ConfigError(f"plan host_address {value!r} is not an IP address") from None


def check_address(plan: Plan, addresses: frozenset[str] | None = None) -> None:
    """Refuse a plan whose ``host_address`` is not one of this host's addresses."""
    if plan.host_address is None:
        return
    if addresses is None:
        from collectors.route import local_addresses
        addresses = local_addresses()
    if plan.host_address not in addresses:
        raise ConfigError(f"plan is for the {plan.for_host} host {plan.host_address}, which is "
                          "not an address of this host; apply it on that host")


def check_host(plan: Plan, expected_host_id: str) -> None:
    check_address(plan)
    if plan.host_id and plan.host_id != expected_host_id:
        raise ConfigError(f"plan was made for host {shown(plan.host_id)}, this is {shown(expected_host_id)}; "
                          "make a new plan here")


def report_ref(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.exists() else ""
    return {"id": data.get("id") or data.get("report_id") or digest, "path": os.fspath(path),
            "sha256_16": digest}
