"""The HTML of a picture page: escaping, tables, chart slots, one document.

Everything from outside — peer and site names from config and mesh files, finding titles and
evidence from reports, journal entries — goes through :func:`esc` (HTML text and attributes) or
:func:`script_json` (the chart data, read by charts.js with ``JSON.parse``). Markup built here is
a :class:`Markup`; nothing else is inserted unescaped. The document carries a Content Security
Policy that allows no fetch from anywhere (a file) or only from its own origin (the daemon), so
even a mistake here could not make the browser contact another host.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from wanprobe.pictures.assets import Assets
from wanprobe.safe_text import clean_lines

_ENTITIES = {ord(k): v for k, v in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"),
                                     ('"', "&quot;"), ("'", "&#x27;"))}
# a file fetches nothing; the daemon's page loads its script from its own origin only
CSP_FILE = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
            "img-src data:; font-src data:; base-uri 'none'; form-action 'none'")
CSP_SERVED = CSP_FILE.replace("script-src 'unsafe-inline'", "script-src 'self'")


class Markup(str):
    """HTML built by this module from escaped parts: inserted as is."""


def esc(value: Any) -> Markup:
    """``value`` as HTML text: ``<>&"'`` escaped as html.escape does; control characters, the
    invisible format characters (a U+202E in a peer name would reverse the text after it:
    "Trojan Source") and lone surrogates shown as ``\\xNN`` / ``\\uNNNN``, as the terminal shows
    them (safe_text.clean_lines; a 1,000-peer page escapes ~15,000 cells in a few ms)."""
    return Markup(clean_lines(value).translate(_ENTITIES))


def cell(value: Any) -> Markup:
    return value if isinstance(value, Markup) else esc("-" if value is None else value)


def link(href: str, text: Any) -> Markup:
    """``<a>`` to ``href`` (built by the caller from quoted parts) showing escaped ``text``."""
    return Markup(f'<a href="{esc(href)}">{esc(text)}</a>')


def finite(value: Any) -> Any:
    """JSON has no NaN or infinity: None instead, recursively; strings (chart titles and legends
    name peers) with their control and format characters shown as in :func:`esc`."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return clean_lines(value)
    if isinstance(value, dict):
        return {clean_lines(k): finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def number(doc: Any, *keys: str) -> float | None:
    """The finite number at ``doc[k0][k1]...`` of a JSON document; None when a level is
    missing or the value is not a number (absent is None, docs/conventions.md §3)."""
    for k in keys:
        doc = doc.get(k) if isinstance(doc, Mapping) else None
    ok = isinstance(doc, int | float) and not isinstance(doc, bool) and math.isfinite(doc)
    return float(doc) if ok else None


def script_json(value: Any) -> str:
    """JSON safe inside a ``<script type="application/json">`` element: no ``<``, ``>`` or
    ``&`` (so no ``</script>`` or ``<!--``), no line separators."""
    text = json.dumps(finite(value), separators=(",", ":"), allow_nan=False)
    for ch, sub in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                    ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, sub)
    return text


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, numeric: Iterable[int] = (),
          cls: str = "", row_classes: Sequence[str] | None = None) -> Markup:
    """A table; ``numeric`` column indexes are right-aligned; cells pass through :func:`cell`."""
    nums = set(numeric)
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        tds = "".join(f'<td class="num">{cell(v)}</td>' if j in nums else f"<td>{cell(v)}</td>"
                      for j, v in enumerate(row))
        rc = f' class="{esc(row_classes[i])}"' if row_classes and row_classes[i] else ""
        body.append(f"<tr{rc}>{tds}</tr>")
    attr = f' class="{esc(cls)}"' if cls else ""
    return Markup(f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody>"
                  "</table>")


class Page:
    """One document: a title, sections of markup, and chart slots filled by charts.js."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []
        self.charts: list[dict[str, Any]] = []

    def add(self, markup: Markup) -> None:
        self.parts.append(markup)

    def h(self, level: int, text: Any) -> None:
        self.parts.append(f"<h{level}>{esc(text)}</h{level}>")

    def p(self, text: Any, cls: str = "") -> None:
        self.parts.append(f'<p class="{esc(cls)}">{cell(text)}</p>' if cls else f"<p>{cell(text)}</p>")

    def chart(self, spec: dict[str, Any]) -> None:
        """A slot for one chart; ``spec`` (kind and data, see charts.js) is drawn there."""
        target = f"chart{len(self.charts)}"
        self.charts.append({**spec, "target": target})
        self.parts.append(f'<div class="chart" id="{target}"></div>')

    def render(self, assets: Assets, *, script_src: str | None = None) -> str:
        """The whole document: assets inline, or (``script_src``) loaded from the serving daemon."""
        csp = CSP_SERVED if script_src else CSP_FILE
        script = (f'<script src="{esc(script_src)}"></script>' if script_src
                  else f"<script>{assets.script}</script>")
        return "".join([
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
            f'<meta http-equiv="Content-Security-Policy" content="{esc(csp)}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(self.title)}</title><style>{assets.css}</style></head><body>",
            *self.parts,
            f'<script type="application/json" id="wanprobe-charts">{script_json(self.charts)}'
            "</script>", script, "</body></html>\n"])
