"""The history: SQLite in WAL mode in the state dir, one row per probe summary, throughput test,
ring test, counter-rate sample, finding and report.

Durability: rows are buffered and committed together once per flush (the daemon flushes every
second and on stop), with ``journal_mode=WAL`` and ``synchronous=FULL``. In WAL mode FULL syncs the
WAL at every commit, so a committed batch survives both ``kill -9`` and power loss, and a crash
loses only rows not yet flushed, i.e. at most the last flush interval; SQLite's WAL replay keeps
the file consistent either way (https://sqlite.org/wal.html, https://sqlite.org/pragma.html#pragma_synchronous).
One fsync per second is cheap; FULL per probe (NORMAL's point) would not be needed for that.
"""

from __future__ import annotations

import itertools
import json
import operator
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from wanprobe.errors import OutputError, WanprobeError

# 2 (issue 36): probes gain each direction's lost and sample counts, so a folded or a windowed
# loss is a ratio of sums with its interval, not a mean of ratios; a version-1 file gains the
# columns (NULL in its old rows) when it is opened
# 3 (issue 39): ring_runs, the daemon's scheduled ring tests; an older file gains the table
# when it is opened (the schema's CREATE ... IF NOT EXISTS)
SCHEMA_VERSION = 3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS probes (
  id INTEGER PRIMARY KEY, ts REAL NOT NULL, peer TEXT NOT NULL, method TEXT NOT NULL,
  resolution_s REAL NOT NULL DEFAULT 0, sessions INTEGER NOT NULL DEFAULT 1,
  sent INTEGER, received INTEGER, loss_ratio REAL, loss_forward_ratio REAL,
  loss_reverse_ratio REAL, rtt_min_ms REAL, rtt_p50_ms REAL, rtt_p90_ms REAL, rtt_p99_ms REAL,
  rtt_max_ms REAL, rtt_mean_ms REAL, jitter_ms REAL, error TEXT, loss_forward_lost INTEGER,
  loss_forward_of INTEGER, loss_reverse_lost INTEGER, loss_reverse_of INTEGER);
CREATE INDEX IF NOT EXISTS probes_peer_ts ON probes(peer, ts);
CREATE TABLE IF NOT EXISTS throughput (
  id INTEGER PRIMARY KEY, ts REAL NOT NULL, peer TEXT NOT NULL, bits_per_second REAL,
  bytes INTEGER, duration_s REAL, limited_by TEXT, error TEXT, doc TEXT);
CREATE INDEX IF NOT EXISTS throughput_peer_ts ON throughput(peer, ts);
CREATE TABLE IF NOT EXISTS counter_rates (
  id INTEGER PRIMARY KEY, ts REAL NOT NULL, interval_s REAL, rates TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS counter_rates_ts ON counter_rates(ts);
CREATE TABLE IF NOT EXISTS findings (
  id INTEGER PRIMARY KEY, ts REAL NOT NULL, peer TEXT, finding_id TEXT NOT NULL,
  severity TEXT NOT NULL, title TEXT NOT NULL, evidence TEXT, report_path TEXT);
CREATE INDEX IF NOT EXISTS findings_ts ON findings(ts);
CREATE TABLE IF NOT EXISTS ring_runs (
  id INTEGER PRIMARY KEY, ts REAL NOT NULL, hosts TEXT NOT NULL, ok INTEGER NOT NULL,
  ring_bits_per_second REAL, duration_s REAL, error TEXT, doc TEXT);
CREATE INDEX IF NOT EXISTS ring_runs_ts ON ring_runs(ts);
"""

# what throughput() and findings() select (a finding's id is stored as finding_id)
_THROUGHPUT_SELECT = ("ts", "peer", "bits_per_second", "bytes", "duration_s", "limited_by", "error")
_FINDINGS_SELECT = ("ts", "peer", "finding_id AS id", "severity", "title", "evidence", "report_path")


class StoreError(WanprobeError):
    """The history database cannot be opened or written."""


# SQLite result codes (sqlite3.h) of a write that may pass later: SQLITE_IOERR, SQLITE_FULL
_TRANSIENT_SQLITE = (10, 13)


def _exit_code(exc: sqlite3.Error) -> int:
    """74 (OutputError: systemd restarts the daemon) for a full disk or an I/O error, else 1."""
    code = getattr(exc, "sqlite_errorcode", None)
    return OutputError.exit_code if code is not None and code & 0xFF in _TRANSIENT_SQLITE else 1


def _column(source: tuple[str, ...], fold: str, **default: Any) -> Any:
    """A column of ``probes``: the keys to it in ``ProbeResult.to_json()`` (empty: not from the
    result) and the SQL aggregate that downsample() folds a bucket of rows into."""
    return field(metadata={"source": source, "fold": fold}, **default)


def _pick(doc: dict[str, Any], keys: tuple[str, ...]) -> Any:
    """``doc[k0][k1]...``, None where a level is missing or None."""
    for key in keys:
        doc = (doc or {}).get(key)
    return doc


@dataclass(frozen=True)
class ProbeRow:
    """One probe session summary (or a downsampled bucket when ``resolution_s`` > 0). The
    fields are the columns of ``probes`` in their order, each with its source and its fold
    (``:b`` is the bucket length in seconds): the one list of them."""

    ts: float = _column((), "CAST(ts / :b AS INTEGER) * :b")
    peer: str = _column((), "peer")
    method: str = _column((), "method")
    resolution_s: float = _column((), ":b", default=0.0)
    sessions: int = _column((), "count(*)", default=1)
    sent: int | None = _column(("loss", "sent"), "sum(sent)", default=None)
    received: int | None = _column(("loss", "received"), "sum(received)", default=None)
    # the sessions' own (path) loss ratios weighted by probes sent: 1 - received/sent would count
    # a reflector's drops (issue 20) as loss again
    loss_ratio: float | None = _column(
        ("loss", "ratio"), "CASE WHEN sum(sent) > 0 THEN sum(loss_ratio * sent) / sum(sent) END",
        default=None)
    # a direction's ratio folds as lost / of over the bucket (rows of schema 1, without the
    # counts, as the mean of their ratios)
    loss_forward_ratio: float | None = _column(
        ("loss", "forward_ratio"), "CASE WHEN sum(loss_forward_of) > 0 THEN "
        "1.0 * sum(loss_forward_lost) / sum(loss_forward_of) ELSE avg(loss_forward_ratio) END",
        default=None)
    loss_reverse_ratio: float | None = _column(
        ("loss", "reverse_ratio"), "CASE WHEN sum(loss_reverse_of) > 0 THEN "
        "1.0 * sum(loss_reverse_lost) / sum(loss_reverse_of) ELSE avg(loss_reverse_ratio) END",
        default=None)
    rtt_min_ms: float | None = _column(("rtt_ms", "min"), "min(rtt_min_ms)", default=None)
    rtt_p50_ms: float | None = _column(("rtt_ms", "p50"), "avg(rtt_p50_ms)", default=None)
    rtt_p90_ms: float | None = _column(("rtt_ms", "p90"), "max(rtt_p90_ms)", default=None)
    rtt_p99_ms: float | None = _column(("rtt_ms", "p99"), "max(rtt_p99_ms)", default=None)
    rtt_max_ms: float | None = _column(("rtt_ms", "max"), "max(rtt_max_ms)", default=None)
    rtt_mean_ms: float | None = _column(("rtt_ms", "mean"), "avg(rtt_mean_ms)", default=None)
    jitter_ms: float | None = _column(("jitter_ms",), "avg(jitter_ms)", default=None)
    error: str | None = _column(
        (), "CASE WHEN count(error) > 0 THEN count(error) || ' errors' END", default=None)
    # probes lost on the way out and the probes that could tell (probe/result.py LossStats):
    # the sample size behind the forward ratio; likewise back
    loss_forward_lost: int | None = _column(("loss", "forward_lost"), "sum(loss_forward_lost)",
                                            default=None)
    loss_forward_of: int | None = _column(("loss", "forward_of"), "sum(loss_forward_of)",
                                          default=None)
    loss_reverse_lost: int | None = _column(("loss", "reverse_lost"), "sum(loss_reverse_lost)",
                                            default=None)
    loss_reverse_of: int | None = _column(("loss", "reverse_of"), "sum(loss_reverse_of)",
                                          default=None)

    def to_json(self) -> dict[str, Any]:
        return {c: getattr(self, c) for c in PROBE_COLUMNS}

    @classmethod
    def from_probe_json(cls, ts: float, peer: str, method: str, doc: dict[str, Any]) -> ProbeRow:
        """Flatten a ProbeResult ``to_json()`` (``rtt_ms.*``, ``loss.*``, ``jitter_ms``)."""
        return cls(ts=ts, peer=peer, method=method,
                   **{name: _pick(doc, keys) for name, keys in _SOURCES})


PROBE_COLUMNS = tuple(f.name for f in fields(ProbeRow))
_SOURCES = tuple((f.name, f.metadata["source"]) for f in fields(ProbeRow) if f.metadata["source"])
_ROW_VALUES = operator.attrgetter(*PROBE_COLUMNS)   # a row's column values, in order
_INSERT_PROBE = (f"INSERT INTO probes ({', '.join(PROBE_COLUMNS)}) VALUES "
                 f"({', '.join('?' * len(PROBE_COLUMNS))})")
_DOWNSAMPLE_PROBES = (  # one row per peer, method and bucket of :b seconds, from rows before :cut
    f"INSERT INTO probes ({', '.join(PROBE_COLUMNS)}) "
    f"SELECT {', '.join(f.metadata['fold'] for f in fields(ProbeRow))} "
    "FROM probes WHERE resolution_s = 0 AND ts < :cut GROUP BY peer, method, CAST(ts / :b AS INTEGER)")


class Store:
    """The history database. Writers call ``add_*`` (buffered, thread-safe) and ``flush()``."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                       timeout=10.0)
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise StoreError(f"{self.path}: cannot switch to WAL mode (got {mode})")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            self._migrate()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open history {self.path}: {exc}",
                             exit_code=_exit_code(exc)) from None
        self._lock = threading.Lock()
        self._pending: list[tuple[str, tuple]] = []

    def _migrate(self) -> None:
        """Bring a history written by an older daemon to SCHEMA_VERSION: add the columns it
        lacks (SQLite's ADD COLUMN leaves old rows NULL, which every fold reads as unknown)."""
        have = {r[1] for r in self._db.execute("PRAGMA table_info(probes)")}
        types = {"int": "INTEGER", "float": "REAL", "str": "TEXT"}
        for f in fields(ProbeRow):
            if f.name not in have:
                sql_type = next(v for k, v in types.items() if str(f.type).startswith(k))
                self._db.execute(f"ALTER TABLE probes ADD COLUMN {f.name} {sql_type}")
        self._db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)",
                         (str(SCHEMA_VERSION),))

    # -- writes -------------------------------------------------------------------------------
    def add_probe(self, row: ProbeRow) -> None:
        self._queue(_INSERT_PROBE, _ROW_VALUES(row))

    def add_throughput(self, ts: float, peer: str, doc: dict[str, Any] | None,
                       error: str | None = None) -> None:
        doc = doc or {}
        limited = doc.get("limited_by")
        verdict = limited.get("verdict") if isinstance(limited, dict) else limited
        self._queue("INSERT INTO throughput (ts, peer, bits_per_second, bytes, duration_s, "
                    "limited_by, error, doc) VALUES (?,?,?,?,?,?,?,?)",
                    (ts, peer, doc.get("bits_per_second"), link_bytes(doc),
                     doc.get("duration_s"), verdict, error, json.dumps(doc) if doc else None))

    def add_ring(self, ts: float, hosts: tuple[str, ...], doc: dict[str, Any] | None,
                 error: str | None = None, duration_s: float | None = None) -> None:
        """One ring test: the RingResult JSON (ring/model.py) of a run, or None and its error."""
        self._queue("INSERT INTO ring_runs (ts, hosts, ok, ring_bits_per_second, duration_s, "
                    "error, doc) VALUES (?,?,?,?,?,?,?)",
                    (ts, json.dumps(list(hosts)), int(doc is not None and error is None),
                     (doc or {}).get("ring_bits_per_second"), duration_s, error,
                     json.dumps(doc) if doc is not None else None))

    def add_counter_rates(self, ts: float, interval_s: float, rates: dict[str, Any]) -> None:
        self._queue("INSERT INTO counter_rates (ts, interval_s, rates) VALUES (?,?,?)",
                    (ts, interval_s, json.dumps(rates, separators=(",", ":"), default=str)))

    def add_finding(self, ts: float, finding: dict[str, Any], *, peer: str | None = None,
                    report_path: str | None = None) -> None:
        self._queue("INSERT INTO findings (ts, peer, finding_id, severity, title, evidence, "
                    "report_path) VALUES (?,?,?,?,?,?,?)",
                    (ts, peer, str(finding.get("id", "unknown")),
                     str(finding.get("severity", "info")), str(finding.get("title", "")),
                     json.dumps(finding.get("evidence"), default=str), report_path))

    def _queue(self, sql: str, params: tuple) -> None:
        with self._lock:
            self._pending.append((sql, params))

    def flush(self) -> int:
        """Commit every buffered row in one transaction; return how many."""
        with self._lock:
            batch, self._pending = self._pending, []
            if not batch:
                return 0
            try:
                self._db.execute("BEGIN IMMEDIATE")
                # consecutive rows of one table go in one executemany (one prepared statement)
                for sql, rows in itertools.groupby(batch, key=lambda item: item[0]):
                    self._db.executemany(sql, [params for _, params in rows])
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self._pending[:0] = batch  # keep them for the next try
                raise StoreError(f"cannot write history {self.path}: {exc}") from None
            return len(batch)

    # -- maintenance --------------------------------------------------------------------------
    def downsample(self, *, now: float, raw_s: float, bucket_s: float) -> int:
        """Fold raw probe rows older than ``raw_s`` into one row per peer, method and
        ``bucket_s`` bucket: sums of sent/received, loss from those sums, mean of p50/mean/jitter,
        max of p90/p99/max, min of min. Returns the number of raw rows folded."""
        cutoff = now - raw_s
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                n = self._db.execute("SELECT count(*) FROM probes WHERE resolution_s = 0 "
                                     "AND ts < ?", (cutoff,)).fetchone()[0]
                self._db.execute(_DOWNSAMPLE_PROBES, {"b": bucket_s, "cut": cutoff})
                self._db.execute("DELETE FROM probes WHERE resolution_s = 0 AND ts < ?", (cutoff,))
                self._db.execute("COMMIT")
            except sqlite3.Error:
                self._db.execute("ROLLBACK")
                raise
        return n

    def expire(self, *, now: float, raw_s: float, downsampled_s: float) -> int:
        """Delete downsampled probe rows older than ``downsampled_s`` and other rows older than
        ``raw_s`` (findings, throughput and ring tests are kept as long as downsampled history).
        Returns rows deleted."""
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            deleted = 0
            for sql, cutoff in (
                ("DELETE FROM probes WHERE ts < ?", now - downsampled_s),
                ("DELETE FROM throughput WHERE ts < ?", now - downsampled_s),
                ("DELETE FROM ring_runs WHERE ts < ?", now - downsampled_s),
                ("DELETE FROM counter_rates WHERE ts < ?", now - raw_s),
                ("DELETE FROM findings WHERE ts < ?", now - downsampled_s),
            ):
                deleted += cur.execute(sql, (cutoff,)).rowcount
            cur.execute("COMMIT")
        return deleted

    def checkpoint(self) -> None:
        with self._lock:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    # -- reads --------------------------------------------------------------------------------
    def probes(self, peer: str | None = None, *, since: float | None = None,
               limit: int | None = None) -> list[ProbeRow]:
        """Probe rows, oldest first (the newest ``limit`` when given)."""
        where, params = _where(peer=peer, since=since)
        sql = f"SELECT {', '.join(PROBE_COLUMNS)} FROM probes {where} ORDER BY ts DESC, id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self._lock:
            rows = self._db.execute(sql, params).fetchall()
        return [ProbeRow(**dict(zip(PROBE_COLUMNS, r, strict=True))) for r in reversed(rows)]

    def throughput(self, peer: str | None = None, *, since: float | None = None) -> list[dict]:
        return self._dicts("throughput", _THROUGHPUT_SELECT, peer=peer, since=since)

    def rings(self, *, since: float | None = None, limit: int | None = None) -> list[dict]:
        """Ring runs, oldest first (the newest ``limit`` when given): ts, hosts, ok,
        ring_bits_per_second, duration_s, error and doc (the RingResult JSON; None if failed)."""
        where, params = _where(peer=None, since=since)
        sql = ("SELECT ts, hosts, ok, ring_bits_per_second, duration_s, error, doc FROM "
               f"ring_runs {where} ORDER BY ts DESC, id DESC")
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self._lock:
            rows = self._db.execute(sql, params).fetchall()
        return [{"ts": ts, "hosts": json.loads(hosts), "ok": bool(ok),
                 "ring_bits_per_second": bps, "duration_s": took, "error": error,
                 "doc": json.loads(doc) if doc else None}
                for ts, hosts, ok, bps, took, error, doc in reversed(rows)]

    def peers(self) -> list[str]:
        """Every peer with probe or throughput history, sorted."""
        with self._lock:
            rows = self._db.execute("SELECT peer FROM probes UNION SELECT peer FROM throughput "
                                    "ORDER BY 1").fetchall()
        return [r[0] for r in rows]

    def throughput_bytes_since(self, since: float) -> int:
        with self._lock:
            return int(self._db.execute("SELECT coalesce(sum(bytes), 0) FROM throughput "
                                        "WHERE ts >= ?", (since,)).fetchone()[0])

    def findings(self, peer: str | None = None, *, since: float | None = None) -> list[dict]:
        out = self._dicts("findings", _FINDINGS_SELECT, peer=peer, since=since)
        for f in out:
            f["evidence"] = json.loads(f["evidence"]) if f["evidence"] else None
        return out

    def _dicts(self, table: str, columns: tuple[str, ...], *, peer: str | None,
               since: float | None) -> list[dict]:
        """Rows of ``table``, oldest first, as dicts keyed by column name (or its ``AS`` name)."""
        where, params = _where(peer=peer, since=since)
        with self._lock:
            cur = self._db.execute(f"SELECT {', '.join(columns)} FROM {table} {where} ORDER BY ts",
                                   params)
            keys = tuple(d[0] for d in cur.description)
            rows = cur.fetchall()
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def count(self, table: str) -> int:
        if table not in ("probes", "throughput", "counter_rates", "findings", "ring_runs"):
            raise ValueError(table)
        with self._lock:
            return int(self._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])

    def integrity_check(self) -> str:
        with self._lock:
            return self._db.execute("PRAGMA integrity_check").fetchone()[0]

    def close(self) -> None:
        try:
            self.flush()
        finally:
            with self._lock:
                self._db.close()


def link_bytes(doc: dict[str, Any]) -> int | None:
    """Bytes a throughput test put on the link (both directions), for the daily budget."""
    parts = [doc.get(k) for k in ("bytes_sent", "bytes_received")]
    reverse = doc.get("reverse") or {}
    if doc.get("mode") == "bidir" and isinstance(reverse, dict):
        parts = [max(parts[0] or 0, parts[1] or 0),
                 max(reverse.get("bytes_sent") or 0, reverse.get("bytes_received") or 0)]
        return int(sum(parts))
    known = [p for p in parts if isinstance(p, (int, float))]
    if known:
        return int(max(known))
    return doc.get("bytes")


def _where(*, peer: str | None, since: float | None) -> tuple[str, tuple]:
    clauses: list[str] = []
    params: list[Any] = []
    if peer is not None:
        clauses.append("peer = ?")
        params.append(peer)
    if since is not None:
        clauses.append("ts >= ?")
        params.append(since)
    return ("WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)


def open_readonly(path: Path | str) -> Store:
    """Open an existing history for reading (``wanprobe history``); refuse a missing file."""
    path = Path(path)
    if not path.exists():
        raise StoreError(f"no history at {path} (is the daemon's state_dir right?)")
    return Store(path)


class Flusher:
    """Commits a :class:`Store` every ``interval_s`` from one long-lived thread, so the event
    loop is never woken for it (a thread started and a loop wake-up every second were a visible
    share of the daemon's CPU at 1,000 peers: bench/daemon_footprint.py). ``on_flush`` gets None
    or the StoreError of each attempt, in that thread; rows that failed stay queued (Store.flush)."""

    def __init__(self, store: Store, interval_s: float,
                 on_flush: Callable[[StoreError | None], None]) -> None:
        self.store, self.interval_s, self.on_flush = store, interval_s, on_flush
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wanprobe-flush", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop the thread (a flush in progress finishes; the caller flushes what is left)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.store.flush()
            except StoreError as exc:
                self.on_flush(exc)
            else:
                self.on_flush(None)

