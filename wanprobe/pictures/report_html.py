"""``wanprobe report show REPORT --format html``: one self-contained page for a ticket.

The path's table a carrier asks for (report/ticket.py, as the Markdown ticket), the findings with
their evidence (the markdown renderer's rows, render_md.evidence_rows) in plain words, the RTT
distribution of the probe (a histogram of ``rtt_samples_ms`` when the report keeps them, else the
quantiles it has), per-stream throughput over time in each direction (partial intervals left
out), and before/after when the report carries a verify (``diagnose/verify.Verification``).
Every figure is read from the report's typed view (``report.measured``, built by
report/codec.py), never from its measurements by key. Bounded whatever the report holds: the first MAX_FINDINGS
findings (the count of the rest is said), MAX_EVIDENCE_ROWS rows each, values cut to
MAX_VALUE_CHARS, at most MAX_SERIES_POINTS points per series; samples are binned here.
"""

from __future__ import annotations

import json
import math
from typing import Any

from wanprobe.diagnose.measured import AttemptMeasured, Measured, PathMeasured, ThroughputMeasured
from wanprobe.pictures.html import Markup, Page, esc, table
from wanprobe.report.document import Finding, Report
from wanprobe.report.render_md import evidence_rows
from wanprobe.report.ticket import path_rows, plain
from wanprobe.units import format_rate

MAX_FINDINGS = 50
MAX_EVIDENCE_ROWS = 40
MAX_VALUE_CHARS = 400
MAX_SERIES_POINTS = 2000
MAX_PLAN_CHARS = 20_000
HIST_BINS = 40
DIRECTIONS = ("forward: this host sends", "reverse: the peer sends")


def _cut(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def _rate(bps: float | None) -> str:
    return "-" if bps is None else format_rate(bps)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} ms"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.3f} %"


def summary_rows(report: Report, m: Measured) -> list[tuple[str, str]]:
    """The path's table: the ticket's rows (report/ticket.py)."""
    return path_rows(report)


def rtt_spec(path: PathMeasured) -> dict[str, Any] | None:
    """A histogram of the probe's RTT samples, marked at p50 and p99; without samples (reports
    written before they were kept) the quantiles as a step histogram between them."""
    samples = path.rtt_samples_ms
    quantiles = (("min", path.rtt_min_ms), ("p50", path.rtt_p50_ms), ("p90", path.rtt_p90_ms),
                 ("p99", path.rtt_p99_ms), ("max", path.rtt_max_ms))
    marks = [{"x": v, "label": k} for k, v in quantiles if k in ("p50", "p99") and v]
    title = f"RTT distribution ({len(samples)} probes)"
    if samples:
        import numpy as np

        counts, edges = np.histogram(samples, bins=min(HIST_BINS, max(5, len(samples) // 5)))
        return {"kind": "hist", "title": title, "x_label": "RTT (ms)", "y_label": "probes",
                "left": edges[:-1].tolist(), "right": edges[1:].tolist(),
                "count": counts.tolist(), "marks": marks}
    qs = [(k, v) for k, v in quantiles if v]
    if len(qs) < 2:
        return None
    share = {"p50": 0.5, "p90": 0.4, "p99": 0.09, "max": 0.01}   # of the probes between marks
    left, right = [v for _, v in qs[:-1]], [v for _, v in qs[1:]]
    dens = [share[k] / max(r - lo, 1e-6) for (k, _), lo, r in zip(qs[1:], left, right, strict=True)]
    return {"kind": "hist", "title": "RTT quantiles (the report keeps no samples): share of "
            "probes per ms between min, p50, p90, p99 and max", "x_label": "RTT (ms)",
            "y_label": "share per ms", "left": left, "right": right, "count": dens,
            "marks": marks}


def streams_spec(tput: ThroughputMeasured, title: str) -> dict[str, Any] | None:
    """Receiver goodput per stream per interval (Mbit/s at each interval's end); intervals
    marked partial (cut short by the end of the test) are left out."""
    intervals = [iv for iv in tput.intervals if not iv.partial]
    step = max(1, math.ceil(len(intervals) / MAX_SERIES_POINTS))
    intervals = intervals[::step]
    per: dict[str, tuple[list[float], list[float]]] = {}
    for iv in intervals:
        for sid, bps in iv.streams:
            xs, ys = per.setdefault(f"stream {sid}", ([], []))
            xs.append(iv.end_s)
            ys.append(bps / 1e6)
    if not per:
        return None
    series = [{"name": name, "x": xs, "y": ys, "points": len(xs) < 30}
              for name, (xs, ys) in sorted(per.items())]
    if len(series) > 1:
        series.append({"name": "all streams", "width": 3, "points": False,
                       "x": [iv.end_s for iv in intervals],
                       "y": [(iv.bits_per_second or 0) / 1e6 for iv in intervals]})
    return {"kind": "lines", "title": title, "x_label": "seconds into the test",
            "y_label": "Mbit/s", "series": series}


def _method(duration_s: float | None, omit_s: float | None) -> str:
    if not duration_s:
        return "a test of unknown length"
    return f"{duration_s - (omit_s or 0):g} s measured after {omit_s or 0:g} s of ramp-up"


def verify_spec(m: Measured) -> dict[str, Any] | None:
    """Before (the diagnosed forward rate past its ramp-up) and after (the verify's test that
    was measured the same way, if one was: tune apply --verify measures as the report's test
    did, services/tune.source_method; else its last), by one method: the title says whether
    both tests had the same length and ramp-up left out, and each bar's note says what it
    measured (issue 36: a 2 s test with its ramp-up was drawn against a 6 s one without)."""
    after = m.verify
    if after is None or m.throughput is None or m.throughput.bits_per_second is None:
        return None
    attempts = after.attempts
    before = _method(m.throughput.requested_duration_s, m.throughput.omit_s)
    like = [a for a in attempts if _method(a.duration_s, a.omit_s) == before]
    last = (like or attempts or (AttemptMeasured(),))[-1]
    after_how = _method(last.duration_s, last.omit_s)
    after_bps = (last.bits_per_second_after_omit or last.bits_per_second
                 or after.bits_per_second_after_omit or after.bits_per_second)
    if after_bps is None:
        return None
    same = before == after_how
    return {"kind": "bars", "title": "Throughput before and after tuning, "
            + ("by one method: " + before if same else "by different methods (compare with care)"),
            "y_label": "Mbit/s",
            "labels": ["before", "after"],
            "values": [m.throughput.bits_per_second / 1e6, after_bps / 1e6],
            "notes": [f"{before}; limited by {m.throughput.verdict or '?'}",
                      f"{after_how}; limited by {after.verdict or '?'}; next: "
                      f"{_cut(plain(after.next_step or '-', '-'), 200)}"]}


def finding_markup(i: int, f: Finding) -> Markup:
    rows = evidence_rows(dict(f.evidence))
    title = plain(f.title, f.title)
    parts = [f'<div class="finding {esc(f.severity)}"><h3>{i}. <span class="sev-'
             f'{esc(f.severity)}">[{esc(f.severity.upper())}]</span> {esc(title)}</h3>',
             f"<p><b>Recommendation:</b> {esc(plain(f.recommendation, f.recommendation))}</p>"]
    if f.expected_effect:
        parts.append(f"<p><b>Expected effect:</b> {esc(plain(f.expected_effect))}</p>")
    if rows:
        parts.append(table(["evidence", "value", "source"],
                           [(_cut(k, 120), _cut(v), _cut(s)) for k, v, s in
                            rows[:MAX_EVIDENCE_ROWS]]))
        if len(rows) > MAX_EVIDENCE_ROWS:
            parts.append(f"<p class=\"note\">{len(rows) - MAX_EVIDENCE_ROWS} more evidence "
                         "rows in the JSON</p>")
    if f.knobs:
        parts.append(table(["host", "setting", "value", "why"],
                           [(k.for_host, k.key + (f" on {k.iface}" if k.iface else ""),
                             _cut(str(k.value)), _cut(plain(k.reason, title)))
                            for k in f.knobs[:20]]))
    return Markup("".join(parts) + "</div>")


def report_page(report: Report, total_findings: int | None = None) -> Page:
    """The page of one report (validated by ``report.document.load``)."""
    r, m = report, report.measured
    title = (f"Network path report: {r.host.get('address') or r.host.get('hostname', '?')} → "
             f"{r.peer.get('address', '?')}")
    page = Page(title)
    page.h(1, title)
    page.p(f"report {r.id} (schema {r.schema_version}), {r.created_at}, "
           f"{r.tool.get('name', 'wanprobe')} {r.tool.get('version', '?')}; kernel "
           f"{r.host.get('kernel', '?')}", cls="meta")
    if r.top is not None:
        page.p(Markup(f"<b>Top finding:</b> {esc(r.top.title)}"))
    page.add(table(["measurement", "value"], summary_rows(r, m)))
    for part, why in list(m.errors.items())[:20]:
        page.p(f"not measured: {part}: {_cut(str(why))}", cls="note")
    if m.path is not None and (spec := rtt_spec(m.path)):
        page.chart(spec)
    for tput, label in ((m.throughput, DIRECTIONS[0]), (m.throughput_reverse, DIRECTIONS[1])):
        if tput is not None and (spec := streams_spec(tput, f"Per-stream throughput, {label}")):
            page.chart(spec)
    if spec := verify_spec(m):
        page.chart(spec)
    total = max(total_findings or 0, len(r.findings))   # load_first may have cut the list
    page.h(2, f"Findings ({total})")
    if not r.findings:
        page.p("No problems found.")
    shown = r.findings[:MAX_FINDINGS]
    for i, f in enumerate(shown, 1):
        page.add(finding_markup(i, f))
    if total > len(shown):
        page.p(f"{total - len(shown)} more findings not shown (the report holds "
               f"{total}; `wanprobe report show --format json` prints them all)",
               cls="note")
    if r.plan:
        page.h(2, "Plan")
        page.add(Markup(f"<pre>{esc(_cut(json.dumps(r.plan, indent=2), MAX_PLAN_CHARS))}</pre>"))
    return page
