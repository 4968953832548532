"""What the local daemon's history says about a job's paths over the last hour: reroutes it
reported (``path.rerouted`` findings, diagnose/path_findings.py) and each peer's RTT floor (the
minimum of its probe sessions' ``rtt_min_ms``, as the fleet rule ``WanprobeRttFloorStep``
compares). Read-only: the file is opened with SQLite's ``mode=ro`` URI, so a preflight never
writes the daemon's store nor waits long on its lock (https://sqlite.org/uri.html).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from wanprobe.daemon.store import SCHEMA_VERSION


@dataclass(frozen=True)
class Reroute:
    peer: str
    address: str | None
    ts: float
    title: str


@dataclass(frozen=True)
class History:
    """Reroutes and RTT floors since ``since`` (unix seconds), keyed by peer name (lower case)."""

    path: str
    since: float
    reroutes: tuple[Reroute, ...] = ()
    floor_ms: dict[str, float] = field(default_factory=dict)

    def reroutes_of(self, name: str, address: str | None) -> list[Reroute]:
        return [r for r in self.reroutes if r.peer.lower() == name.lower()
                or (address is not None and r.address == address)]


def read_history(path: Path, since: float) -> History:
    """The reroutes and floors since ``since``; sqlite3.Error or ValueError when the file is
    not a wanprobe history the caller can read."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is not None and str(row[0]) != str(SCHEMA_VERSION):
            raise ValueError(f"history schema {row[0]}, this wanprobe reads {SCHEMA_VERSION}")
        reroutes = []
        for peer, ts, title, evidence in db.execute(
                "SELECT peer, ts, title, evidence FROM findings WHERE finding_id = "
                "'path.rerouted' AND ts >= ? ORDER BY ts", (since,)):
            try:
                ev = json.loads(evidence) if evidence else {}
            except ValueError:
                ev = {}
            address = ev.get("address") if isinstance(ev, dict) else None
            reroutes.append(Reroute(str(peer or ""), address if isinstance(address, str) else None,
                                    float(ts), str(title)))
        floors = {str(peer).lower(): float(low) for peer, low in db.execute(
            "SELECT peer, min(rtt_min_ms) FROM probes WHERE ts >= ? AND rtt_min_ms > 0 "
            "GROUP BY peer", (since,)) if low is not None}
    finally:
        db.close()
    return History(str(path), since, tuple(reroutes), floors)
