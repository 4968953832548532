"""Render a report as Markdown for pasting into a ticket (pure: Report -> str).

A ticket a carrier accepts (issue 36): the path's table (report/ticket.py: both addresses,
UTC times, loss per direction with its sample and interval, RTT percentiles, one-way delay,
capacity, MTU, DSCP, both directions' rates), then each finding with its evidence as a table
(nested figures flattened to dotted names, never Python text), its knobs with the host each is
for, and no internal rule ids or references to files the reader does not have.

Every string of the report is data (issue 19): control characters are escaped
(``safe_text.clean``: no escape sequence reaches a terminal that cats the file), ``<``/``>``
become entities (no HTML a renderer might run), ``|`` is escaped in table cells and a backtick
cannot close a code span. ``max_findings`` bounds the work on a huge report: the first N
findings and the count of the rest."""

from __future__ import annotations

from typing import Any

from wanprobe.report.document import Report
from wanprobe.report.ticket import path_rows, plain
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
        return "-" if value is None else ("yes" if value else "no")
    if isinstance(value, (int, float)):
        if key.endswith(("_bps", "bits_per_second")):
            return format_rate(value)
        if key.endswith("_bytes"):
            return format_bytes(value)
        if key.endswith(("_ratio", "_share", "_slo")):
            return f"{value:.3%}"
        return f"{value:.4g}" if isinstance(value, float) else str(value)
    if isinstance(value, list | tuple):
        if key.endswith("ci95") and len(value) == 2:
            return " – ".join(_fmt("x_ratio", v) for v in value)
        return ", ".join(_fmt(key, v) for v in value)
    return plain(value, str(value))


def _flat(evidence: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested figures as dotted names (``host_facts.tcp_rmem``), in order."""
    out: list[tuple[str, Any]] = []
    for k, v in evidence.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out += _flat(v, f"{name}.")
        else:
            out.append((name, v))
    return out


def evidence_rows(evidence: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(name, value, source) for each piece of evidence, nested ones flattened."""
    sources = evidence.get("sources") or {}
    sources = sources if isinstance(sources, dict) else {}
    return [(k, _fmt(k, v), plain(sources.get(k, "")) if sources.get(k) else "")
            for k, v in _flat({k: v for k, v in evidence.items() if k != "sources"})]


def render_markdown(report: Report, total_findings: int | None = None) -> str:
    """The whole report: the path's table, findings with evidence tables and knobs, the plan.
    ``total_findings``: how many the report holds when ``report`` carries only the first ones."""
    r = report
    src = r.host.get("address") or r.host.get("hostname", "?")
    lines = [f"# Network path report: {_text(src)} → {_text(r.peer.get('address'))}", "",
             f"wanprobe {_text(r.tool.get('version'))}, report `{_code(r.id)}` (schema "
             f"{_text(r.schema_version)}), kernel {_text(r.host.get('kernel'))}", "",
             "| path | measured |", "|---|---|"]
    lines += [f"| {_cell(k)} | {_cell(v)} |" for k, v in path_rows(r)]
    lines.append("")
    m = r.measured
    for part, why in m.errors.items():
        lines.append(f"- not measured: **{_text(part)}**: {_cell(plain(why))}")
    if m.errors:
        lines.append("")
    total = len(r.findings) if total_findings is None else total_findings
    lines += [f"## Findings ({total})", ""]
    if not r.findings:
        lines += ["No problems found.", ""]
    for i, f in enumerate(r.findings, 1):
        lines += [f"### {i}. [{_text(f.severity.upper())}] {_text(plain(f.title))}", "",
                  f"**Recommendation:** {_text(plain(f.recommendation))}", ""]
        if f.expected_effect:
            lines += [f"**Expected effect:** {_text(plain(f.expected_effect))}", ""]
        rows = evidence_rows(dict(f.evidence))
        if rows:
            lines += ["| evidence | value | source |", "|---|---|---|"]
            lines += [f"| {_cell(k)} | {_cell(v)} | {_cell(s)} |" for k, v, s in rows]
            lines.append("")
        if f.knobs:
            lines += ["| host | setting | value | why |", "|---|---|---|---|"]
            lines += [f"| {_cell(k.for_host or 'both')} | `{_code(k.key)}`"
                      f"{' on ' + _cell(k.iface) if k.iface else ''} | "
                      f"`{_code(k.value)}` | {_cell(plain(k.reason, plain(f.title)))} |"
                      for k in f.knobs]
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
