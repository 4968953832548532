"""Render a report as Markdown for pasting into a ticket (pure: Report -> str).

Every string of the report is data (issue 19): control characters are escaped
(``safe_text.clean``: no escape sequence reaches a terminal that cats the file), ``<``/``>``
become entities (no HTML a renderer might run), ``|`` is escaped in table cells and a backtick
cannot close a code span. ``max_findings`` bounds the work on a huge report: the first N
findings and the count of the rest."""

from __future__ import annotations

from typing import Any

from wanprobe.report.document import Report
from wanprobe.safe_text import clean
from wanprobe.units import format_bytes, format_rate


def _text(value: Any) -> str:
    """Inline Markdown text: one line, no control characters, no HTML."""
    return clean(value).replace("<", "&lt;").replace(">", "&gt;")


def _cell(value: Any) -> str:
    return _text(value).replace("|", "\\|")


def _code(value: Any) -> str:
    """The inside of a code span (a backtick would end it)."""
    return _cell(value).replace("`", "'")


def _fmt(key: str, value: Any) -> str:
    """Numbers with their unit from the key name (names carry units, docs/conventions.md §4)."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (int, float)):
        if key.endswith(("_bps", "bits_per_second")):
            return format_rate(value)
        if key.endswith("_bytes"):
            return format_bytes(value)
        if key.endswith(("_ratio", "_share")):
            return f"{value:.3%}"
        return f"{value:.4g}" if isinstance(value, float) else str(value)
    return str(value)


def evidence_rows(evidence: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(name, value, source) for each piece of evidence."""
    sources = evidence.get("sources") or {}
    return [(k, _fmt(k, v), str(sources.get(k, ""))) for k, v in evidence.items()
            if k != "sources"]


def render_markdown(report: Report, total_findings: int | None = None) -> str:
    """The whole report: summary, findings with evidence tables and knobs, measurements.
    ``total_findings``: how many the report holds when ``report`` carries only the first ones."""
    r = report
    host = r.host
    lines = [f"# wanprobe diagnose: {_text(host.get('hostname', '?'))} → "
             f"{_text(r.peer.get('address'))}", "",
             f"- report `{_code(r.id)}` (schema {_text(r.schema_version)}), "
             f"{_text(r.created_at)}, {_text(r.tool.get('name'))} {_text(r.tool.get('version'))}",
             f"- kernel {_text(host.get('kernel'))}, netns inode {_text(host.get('netns_inode'))}",
             ""]
    m = r.measured
    if m.path is not None or m.throughput is not None:
        lines += ["| measurement | value |", "|---|---|"]
        if m.path is not None:
            p = m.path
            lines.append("| RTT min / p50 / p99 | " + " / ".join(
                _fmt("rtt_ms", v) for v in (p.rtt_min_ms, p.rtt_p50_ms, p.rtt_p99_ms)) + " ms |")
            lines.append(f"| loss | {_fmt('loss_ratio', p.loss_ratio)} |")
        t = m.throughput
        if t is not None and t.bits_per_second is not None:
            lines.append(f"| throughput | {format_rate(t.bits_per_second)} "
                         f"(limited by {_cell(t.verdict or '?')}) |")
        lines.append("")
    for part, why in m.errors.items():
        lines.append(f"- not measured: **{_text(part)}**: {_cell(why)}")
    if m.errors:
        lines.append("")
    total = len(r.findings) if total_findings is None else total_findings
    lines += [f"## Findings ({total})", ""]
    if not r.findings:
        lines += ["No problems found.", ""]
    for i, f in enumerate(r.findings, 1):
        lines += [f"### {i}. [{_text(f.severity.upper())}] {_text(f.title)}", "",
                  f"`{_code(f.id)}`", "", f"**Recommendation:** {_text(f.recommendation)}", ""]
        if f.expected_effect:
            lines += [f"**Expected effect:** {_text(f.expected_effect)}", ""]
        rows = evidence_rows(dict(f.evidence))
        if rows:
            lines += ["| evidence | value | source |", "|---|---|---|"]
            lines += [f"| {_cell(k)} | {_cell(v)} | {_cell(s)} |" for k, v, s in rows]
            lines.append("")
        if f.knobs:
            lines += ["| tuner | key | value | reason |", "|---|---|---|---|"]
            lines += [f"| {_cell(k.tuner)} | `{_code(k.key)}`"
                      f"{' on ' + _cell(k.iface) if k.iface else ''} | "
                      f"`{_code(k.value)}` | {_cell(k.reason)} |" for k in f.knobs]
            lines.append("")
    if total > len(r.findings):
        lines += [f"… and {total - len(r.findings):,} more findings not shown "
                  "(`--limit 0` shows all, `--format json` has them all).", ""]
    if r.plan:
        lines += ["## Plan", "", "```json", _cell_json(r.plan), "```", ""]
    return "\n".join(lines)


def _cell_json(obj: Any) -> str:
    import json

    return json.dumps(obj, indent=2)
