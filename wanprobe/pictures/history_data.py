"""What a picture reads from the daemon's history: RTT bands, events, throughput, tuning changes.

The history is read through its own read-only SQLite connection (``mode=ro``): in WAL mode a
reader never waits for the daemon's writer nor holds the lock its event loop takes to queue rows
(https://sqlite.org/wal.html §2.2), so drawing a page cannot stall probing. A band is the probe
rows of one peer and method folded into buckets by the same SQL aggregates the daemon's own
downsampling uses (``ProbeRow`` field metadata in history/store.py): min of min, mean of p50, max
of p99, loss from summed sent/received. At most MAX_POINTS buckets per window (vegeta's plot
downsamples past 4,000 points; 288 is 24 h in smokeping's 5-minute steps).
"""

from __future__ import annotations

import sqlite3
import time
import urllib.parse
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any

from wanprobe import units
from wanprobe.errors import UsageError, shown
from wanprobe.history.store import PROBE_COLUMNS, ProbeRow, StoreError

MIN_WINDOW_S = 300.0
MAX_WINDOW_S = 90 * 86400.0       # the default retention of downsampled history
DEFAULT_WINDOW_S = 86400.0
MAX_POINTS = 288
NICE_BUCKETS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
                  43200, 86400)
MAX_EVENTS = 200                   # per page: the newest
MAX_CHANGES = 100
TITLE_CHARS = 240

_FOLDS = ", ".join(f.metadata["fold"] for f in fields(ProbeRow))
_BAND = (f"SELECT {_FOLDS} FROM probes WHERE peer = :peer AND method = :method AND ts >= :since "
         "AND ts < :until GROUP BY CAST(ts / :b AS INTEGER) ORDER BY 1")


def parse_window(text: str, what: str = "window") -> float:
    """``?window=`` / ``--since``: a duration with its unit, 5 min to 90 days."""
    seconds = units.parse_duration_s(text, allow_zero=False, maximum_s=MAX_WINDOW_S)
    if seconds < MIN_WINDOW_S:
        raise UsageError(f"{what} {shown(text)} is shorter than 5 minutes")
    return seconds


def bucket_s(window_s: float) -> float:
    """The smallest round bucket that keeps a window within MAX_POINTS points."""
    return float(next((b for b in NICE_BUCKETS_S if window_s / b <= MAX_POINTS),
                      NICE_BUCKETS_S[-1]))


@dataclass(frozen=True)
class Band:
    """One peer's RTT band over a window: bucketed rows (oldest first)."""

    peer: str
    method: str | None
    since: float
    until: float
    bucket_s: float
    rows: tuple[ProbeRow, ...]


class HistoryReader:
    """Read-only view of ``history.sqlite3``; one per page render (a connection is per thread)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise StoreError(f"no history at {self.path} (is the daemon's state_dir right?)")
        uri = f"file:{urllib.parse.quote(str(self.path.resolve()))}?mode=ro"
        try:
            self._db = sqlite3.connect(uri, uri=True, timeout=5.0)
            self._db.execute("SELECT 1 FROM probes LIMIT 1").fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read history {self.path}: {exc}") from None

    def __enter__(self) -> HistoryReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._db.close()

    def _rows(self, sql: str, params: Any) -> list[tuple]:
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read history {self.path}: {exc}") from None

    def main_method(self, peer: str, since: float) -> str | None:
        """The method with the most sessions for ``peer`` since ``since`` (None: no rows)."""
        got = self._rows("SELECT method, count(*) AS n FROM probes WHERE peer = ? AND ts >= ? "
                         "GROUP BY method ORDER BY n DESC, method LIMIT 1", (peer, since))
        return got[0][0] if got else None

    def band(self, peer: str, method: str | None, *, since: float, until: float,
             bucket: float) -> Band:
        method = method or self.main_method(peer, since)
        rows = () if method is None else tuple(
            ProbeRow(**dict(zip(PROBE_COLUMNS, r, strict=True)))
            for r in self._rows(_BAND, {"peer": peer, "method": method, "since": since,
                                        "until": until, "b": bucket}))
        return Band(peer, method, since, until, bucket, rows)

    def events(self, peer: str | None, since: float) -> list[dict[str, Any]]:
        """Findings the daemon filed (path events, regressions, counter health), newest
        MAX_EVENTS, oldest first; ``peer`` None: all of them."""
        where, params = ("WHERE ts >= ?", [since]) if peer is None else (
            "WHERE ts >= ? AND peer = ?", [since, peer])
        rows = self._rows(f"SELECT ts, peer, finding_id, severity, title FROM findings {where} "
                          f"ORDER BY ts DESC LIMIT {MAX_EVENTS}", params)
        return [{"ts": ts, "peer": p, "id": fid, "severity": sev, "title": title[:TITLE_CHARS]}
                for ts, p, fid, sev, title in reversed(rows)]

    def throughput(self, peer: str, since: float) -> list[dict[str, Any]]:
        rows = self._rows("SELECT ts, bits_per_second, limited_by, error FROM throughput "
                          "WHERE peer = ? AND ts >= ? ORDER BY ts DESC LIMIT ?",
                          (peer, since, MAX_POINTS))
        return [{"ts": ts, "bits_per_second": bps, "limited_by": lim, "error": err}
                for ts, bps, lim, err in reversed(rows)]


def _iso_ts(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp()
    except (TypeError, ValueError):
        return None


def tuning_changes(state_dir: Path, since: float) -> list[dict[str, Any]]:
    """Tuning transactions journalled in the tuner's ``state_dir/journal`` (``wanprobe tune
    apply`` and the auto-apply unit; readable, never written, by the daemon) since ``since``: one mark when applied, one more when rolled back. Journal
    names start with their UTC creation time, so older files are not even opened."""
    from tuners.journal import JournalStore

    store = JournalStore(state_dir)
    cutoff = time.strftime("%Y%m%dT%H%M%S", time.gmtime(since))
    try:
        names = sorted(p.stem for p in store.dir.glob("*.json"))
    except OSError:
        return []
    out: list[dict[str, Any]] = []
    for jid in [n for n in names if n[:15] >= cutoff][-MAX_CHANGES:]:
        try:
            j = store.load(jid)
        except Exception:  # noqa: BLE001 - a torn or foreign file is skipped, as JournalStore.all
            continue
        keys = ", ".join(f"{e.change.tuner} {e.change.key}" for e in j.entries[:4])
        more = f" and {len(j.entries) - 4} more" if len(j.entries) > 4 else ""
        created = _iso_ts(j.created_at)
        if created is not None and created >= since:
            out.append({"ts": created, "label": f"tune {j.state}: {keys}{more}"[:TITLE_CHARS]})
        updated = _iso_ts(j.updated_at)
        if j.state in ("rolled_back", "recovered") and updated is not None and updated >= since:
            out.append({"ts": updated, "label": f"rolled back: {keys}{more}"[:TITLE_CHARS]})
    return sorted(out, key=lambda c: c["ts"])
