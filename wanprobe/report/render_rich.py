"""Render a report for a terminal with rich (tables per finding, severity in colour).

Every string of the report is data: it goes through ``safe_text.clean`` into a ``Text`` (never
markup), so a finding title cannot set the window title or clear the screen (issue 19)."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from wanprobe.report.document import Finding, Report
from wanprobe.report.render_md import _fmt, evidence_rows
from wanprobe.safe_text import clean
from wanprobe.units import format_rate


def _t(value: object, style: str = "") -> Text:
    return Text(clean(value), style=style)

STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def finding_panel(i: int, f: Finding) -> Panel:
    parts: list[RenderableType] = [_t(f.recommendation)]
    if f.expected_effect:
        parts.append(_t(f"Expected: {f.expected_effect}", style="green"))
    rows = evidence_rows(dict(f.evidence))
    if rows:
        t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        for col in ("evidence", "value", "source"):
            t.add_column(col)
        for row in rows:
            t.add_row(*(_t(c) for c in row))
        parts.append(t)
    if f.knobs:
        k = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        for col in ("host", "tuner", "key", "value", "reason"):
            k.add_column(col)
        for knob in f.knobs:
            k.add_row(*(_t(c) for c in (knob.for_host, knob.tuner, knob.key, knob.value,
                                        knob.reason)))
        parts.append(k)
    title = Text.assemble((f"{i}. {f.severity.upper()} ", STYLE[f.severity]), clean(f.title),
                          (f"  [{clean(f.id)}]", "dim"))
    return Panel(Group(*parts), title=title, title_align="left", border_style=STYLE[f.severity])


def render_rich(report: Report, console: Console, total_findings: int | None = None) -> None:
    """Print ``report``; ``total_findings``: how many the report holds when ``report`` carries
    only the first ones (``document.load_first``)."""
    r = report
    head = Table.grid(padding=(0, 2))
    head.add_row("peer", _t(r.peer.get("address")), "host", _t(r.host.get("hostname")))
    head.add_row("report", _t(r.id), "created", _t(r.created_at))
    m = r.measured
    if m.path is not None:
        p = m.path
        head.add_row("rtt min/p50/p99 ms", _t(" / ".join(_fmt("rtt_ms", v) for v in
                                                         (p.rtt_min_ms, p.rtt_p50_ms, p.rtt_p99_ms))),
                     "loss", _t(p.loss_ratio))
    for name, t in (("throughput", m.throughput), ("reverse (peer sends)", m.throughput_reverse)):
        if t is not None and t.bits_per_second is not None:
            head.add_row(name, format_rate(t.bits_per_second), "limited by", _t(t.verdict))
    if m.path is not None and m.path.capacity_source:
        cap = m.path.capacity
        shown = (("≥ " if cap.lower_bound else "") + format_rate(cap.bits_per_second)
                 if cap else "unknown")
        head.add_row("path capacity", shown, "from", _t(m.path.capacity_source
                                                        + (" (a lower bound: a host held the "
                                                           "bursts)" if cap and cap.lower_bound
                                                           else "")))
    console.print(Panel(head, title="wanprobe diagnose", title_align="left"))
    for part, why in m.errors.items():
        console.print(_t(f"not measured: {part}: {why}", style="dim"))
    if not r.findings:
        console.print("[green]No problems found.[/]")
    for i, f in enumerate(r.findings, 1):
        console.print(finding_panel(i, f))
    more = (total_findings or 0) - len(r.findings)
    if more > 0:
        console.print(_t(f"… and {more:,} more findings not shown (--limit 0 shows all, "
                         "--format json has them all)", style="bold"))
