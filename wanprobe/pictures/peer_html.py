"""One peer over a window: the RTT band with loss, path events and tuning changes on its time
axis, throughput tests, and the events as a table. The daemon's ``/peer/NAME`` page and
``wanprobe history PEER --format html`` are this section in a page."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from wanprobe.pictures.history_data import (
    Band,
    HistoryReader,
    bucket_s,
    tuning_changes,
)
from wanprobe.pictures.html import Page, table

EVENT_ROWS = 50   # events listed under a chart (all of them are marked on it, up to MAX_EVENTS)


def utc(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def span(seconds: float) -> str:
    """``300`` → ``"5 min"``, ``86400`` → ``"24 h"``, ``604800`` → ``"7 d"``."""
    if seconds >= 2 * 86400 and seconds % 86400 == 0:
        return f"{seconds / 86400:g} d"
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= 2 * size or (seconds >= size and seconds % size == 0):
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:g} s"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f} %"


def band_spec(band: Band, title: str, events: list[dict], changes: list[dict]) -> dict[str, Any]:
    """The chart spec (charts.js ``band``): bucket centres in ms since the epoch, a gap (null)
    wherever a bucket has no answered session so the line does not bridge an outage."""
    cols: dict[str, list] = {k: [] for k in ("x", "min", "p50", "p99", "loss", "fwd", "rev",
                                             "sessions")}
    last = None
    for r in band.rows:
        if last is not None and r.ts - last > 1.5 * band.bucket_s:
            for k in cols:
                cols[k].append((last + band.bucket_s) * 1e3 if k == "x" else None)
        last = r.ts
        for k, v in (("x", (r.ts + band.bucket_s / 2) * 1e3), ("min", r.rtt_min_ms),
                     ("p50", r.rtt_p50_ms), ("p99", r.rtt_p99_ms), ("loss", r.loss_ratio),
                     ("fwd", r.loss_forward_ratio), ("rev", r.loss_reverse_ratio),
                     ("sessions", r.sessions)):
            cols[k].append(v)
    top = max((v for v in cols["p99"] if v is not None), default=1.0) * 1.08
    return {"kind": "band", "title": title, "x_label": "time (UTC)", "y_label": "RTT (ms)",
            "data": cols, "y_top": top, "x_start": band.since * 1e3, "x_end": band.until * 1e3,
            "events": [{"x": e["ts"] * 1e3, "label": e["title"]} for e in events],
            "changes": [{"x": c["ts"] * 1e3, "label": c["label"]} for c in changes]}


def throughput_spec(rows: list[dict], title: str, since: float,
                    until: float) -> dict[str, Any] | None:
    done = [r for r in rows if r["bits_per_second"]]
    if not done:
        return None
    return {"kind": "lines", "title": title, "datetime": True, "x_label": "time (UTC)",
            "x_start": since * 1e3, "x_end": until * 1e3,
            "y_label": "Mbit/s", "series": [{"name": "goodput", "points": True,
                                             "x": [r["ts"] * 1e3 for r in done],
                                             "y": [r["bits_per_second"] / 1e6 for r in done]}]}


@dataclass(frozen=True)
class PeerView:
    """What one peer section needs: from the history, and from the daemon if it serves it."""

    name: str
    site: str = ""
    address: str = ""
    method: str | None = None      # the peer's primary method (None: the busiest in the store)


def summary_rows(band: Band) -> list[tuple[str, str]]:
    answered = [r for r in band.rows if r.rtt_p50_ms is not None]
    sent = sum(r.sent or 0 for r in band.rows)
    received = sum(r.received or 0 for r in band.rows)
    p50s = sorted(r.rtt_p50_ms for r in answered)
    return [("sessions", str(sum(r.sessions for r in band.rows))),
            ("RTT min (ms)", ms(min((r.rtt_min_ms for r in answered if r.rtt_min_ms is not None),
                                    default=None))),
            ("RTT median of p50 (ms)", ms(p50s[len(p50s) // 2] if p50s else None)),
            ("RTT max of p99 (ms)", ms(max((r.rtt_p99_ms for r in answered
                                            if r.rtt_p99_ms is not None), default=None))),
            ("loss (sent / received)", f"{pct(1 - received / sent) if sent else '-'} "
                                       f"({sent} / {received})"),
            ("buckets with errors", str(sum(1 for r in band.rows if r.error)))]


def add_peer_section(page: Page, reader: HistoryReader, peer: PeerView, *, window_s: float,
                     now: float, state_dir: Path | None) -> None:
    """Append one peer's pictures and tables for the last ``window_s`` to ``page``."""
    since = now - window_s
    band = reader.band(peer.name, peer.method, since=since, until=now, bucket=bucket_s(window_s))
    events = reader.events(peer.name, since)
    changes = tuning_changes(state_dir, since) if state_dir is not None else []
    where = f" ({peer.site})" if peer.site else ""
    page.p(f"{peer.name}{where} {peer.address} — last {span(window_s)}, "
           f"{band.method or 'no'} probes in {span(band.bucket_s)} buckets, "
           f"{utc(since)} to {utc(now)} UTC", cls="meta")
    if not band.rows:
        page.p(f"no probe sessions for {peer.name} in this window", cls="note")
    page.add(table(["figure", "value"], summary_rows(band), numeric=[1]))
    page.chart(band_spec(band, f"RTT to {peer.name}{where}: min to p99 band, p50 line, loss "
                               "marks", events, changes))
    tput = throughput_spec(reader.throughput(peer.name, since), f"Throughput tests to {peer.name}",
                           since, now)
    if tput:
        page.chart(tput)
    add_event_tables(page, events, changes)


def add_event_tables(page: Page, events: list[dict], changes: list[dict]) -> None:
    if events:
        page.h(3, f"Path events and findings ({len(events)})")
        shown = events[-EVENT_ROWS:]
        page.add(table(["time (UTC)", "peer", "severity", "finding", "title"],
                       [(utc(e["ts"]), e["peer"], e["severity"], e["id"], e["title"])
                        for e in reversed(shown)]))
        if len(events) > len(shown):
            page.p(f"{len(events) - len(shown)} older events marked on the chart, not listed",
                   cls="note")
    if changes:
        page.h(3, f"Tuning changes ({len(changes)})")
        page.add(table(["time (UTC)", "change"], [(utc(c["ts"]), c["label"])
                                                  for c in reversed(changes)]))


def history_page(db_path: Path, peer: str, *, window_s: float, state_dir: Path | None,
                 now: float | None = None) -> Page:
    """``wanprobe history PEER --format html``: the peer section in a page of its own."""
    now = time.time() if now is None else now
    page = Page(f"wanprobe history: {peer}")
    page.h(1, f"wanprobe history: {peer}")
    with HistoryReader(db_path) as reader:
        add_peer_section(page, reader, PeerView(peer), window_s=window_s, now=now,
                         state_dir=state_dir)
    page.p(f"read from {db_path} at {utc(now)} UTC", cls="meta")
    return page
