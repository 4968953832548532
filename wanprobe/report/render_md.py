"""Render a report as Markdown for pasting into a ticket (pure: Report -> str)."""

from __future__ import annotations

from typing import Any

from wanprobe.report.document import Report
from wanprobe.units import format_bytes, format_rate


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


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


def render_markdown(report: Report) -> str:
    """The whole report: summary, findings with evidence tables and knobs, measurements."""
    r = report
    host = r.host
    lines = [f"# wanprobe diagnose: {host.get('hostname', '?')} → {r.peer.get('address')}", "",
             f"- report `{r.id}` (schema {r.schema_version}), {r.created_at}, "
             f"{r.tool.get('name')} {r.tool.get('version')}",
             f"- kernel {host.get('kernel')}, netns inode {host.get('netns_inode')}", ""]
    path = (r.measurements or {}).get("path") or {}
    tput = (r.measurements or {}).get("throughput") or {}
    if path or tput:
        lines += ["| measurement | value |", "|---|---|"]
        if path.get("rtt_ms"):
            rtt = path["rtt_ms"]
            lines.append("| RTT min / p50 / p99 | " + " / ".join(
                _fmt("rtt_ms", rtt.get(k)) for k in ("min", "p50", "p99")) + " ms |")
        if path.get("loss"):
            lines.append(f"| loss | {_fmt('loss_ratio', path['loss'].get('ratio'))} |")
        if tput.get("bits_per_second") is not None:
            lb = tput.get("limited_by") or {}
            lines.append(f"| throughput | {format_rate(tput['bits_per_second'])} "
                         f"(limited by {lb.get('verdict', '?')}) |")
        lines.append("")
    errors = (r.measurements or {}).get("errors") or {}
    for part, why in errors.items():
        lines.append(f"- not measured: **{part}**: {_cell(why)}")
    if errors:
        lines.append("")
    lines += [f"## Findings ({len(r.findings)})", ""]
    if not r.findings:
        lines += ["No problems found.", ""]
    for i, f in enumerate(r.findings, 1):
        lines += [f"### {i}. [{f.severity.upper()}] {f.title}", "", f"`{f.id}`", "",
                  f"**Recommendation:** {f.recommendation}", ""]
        if f.expected_effect:
            lines += [f"**Expected effect:** {f.expected_effect}", ""]
        rows = evidence_rows(dict(f.evidence))
        if rows:
            lines += ["| evidence | value | source |", "|---|---|---|"]
            lines += [f"| {_cell(k)} | {_cell(v)} | {_cell(s)} |" for k, v, s in rows]
            lines.append("")
        if f.knobs:
            lines += ["| tuner | key | value | reason |", "|---|---|---|---|"]
            lines += [f"| {k.tuner} | `{_cell(k.key)}`{' on ' + k.iface if k.iface else ''} | "
                      f"`{_cell(k.value)}` | {_cell(k.reason)} |" for k in f.knobs]
            lines.append("")
    if r.plan:
        lines += ["## Plan", "", "```json", _cell_json(r.plan), "```", ""]
    return "\n".join(lines)


def _cell_json(obj: Any) -> str:
    import json

    return json.dumps(obj, indent=2)
