"""What the local daemon's history says about a job's paths: reroutes it reported in the last
hour (``path.rerouted`` findings, diagnose/path_findings.py), each peer's RTT floor over that
hour (the minimum of its probe sessions' ``rtt_min_ms``, as the fleet rule
``WanprobeRttFloorStep`` compares), and what each path carries: the fastest of its scheduled
throughput tests over the capacity window (default the fleet rules' throughput baseline, 7 days)
whose verdict was ``network`` — no host limit found, the path's bottleneck set the rate
(diagnose/rules_throughput.py). A test a host's window, send buffer, pacing or CPU held back says
nothing about the path, and judging a host's buffers against what its own buffers allowed would
pass any buffer. Read-only: the file is opened with SQLite's ``mode=ro`` URI, so a preflight
never writes the daemon's store nor waits long on its lock (https://sqlite.org/uri.html).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from wanprobe.history.store import SCHEMA_VERSION


@dataclass(frozen=True)
class Reroute:
    peer: str
    address: str | None
    ts: float
    title: str


@dataclass(frozen=True)
class Capacity:
    """The fastest network-limited throughput test to a peer: what its path carried."""

    bits_per_second: float
    ts: float


@dataclass(frozen=True)
class History:
    """Reroutes and RTT floors since ``since`` (unix seconds) and path capacities since
    ``capacity_since``, keyed by peer name (lower case)."""

    path: str
    since: float
    reroutes: tuple[Reroute, ...] = ()
    floor_ms: dict[str, float] = field(default_factory=dict)
    capacity: dict[str, Capacity] = field(default_factory=dict)

    def reroutes_of(self, names: tuple[str, ...], address: str | None) -> list[Reroute]:
        keys = {n.lower() for n in names}
        return [r for r in self.reroutes if r.peer.lower() in keys
                or (address is not None and r.address == address)]

    def first(self, table: dict, names: tuple[str, ...]):
        """The entry of ``table`` (floor_ms, capacity) under the first of ``names`` it has."""
        return next((table[n.lower()] for n in names if n.lower() in table), None)


def _capacities(db: sqlite3.Connection, since: float) -> dict[str, Capacity]:
    best: dict[str, Capacity] = {}
    for peer, bps, ts in db.execute(
            "SELECT peer, bits_per_second, ts FROM throughput WHERE ts >= ? AND error IS NULL "
            "AND limited_by = 'network' AND bits_per_second > 0", (since,)):
        key = str(peer).lower()
        if key not in best or float(bps) > best[key].bits_per_second:
            best[key] = Capacity(float(bps), float(ts))
    return best


def read_history(path: Path, since: float, capacity_since: float | None = None) -> History:
    """The reroutes and floors since ``since``, the capacities since ``capacity_since`` (default
    ``since``); sqlite3.Error or ValueError when the file is not a wanprobe history the caller
    can read."""
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
        capacity = _capacities(db, since if capacity_since is None else capacity_since)
    finally:
        db.close()
    return History(str(path), since, tuple(reroutes), floors, capacity)
