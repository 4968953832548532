#!/usr/bin/env python3
"""Which plotting library draws wanprobe's pictures: page weight, offline use, render cost.

For every candidate importable here (bokeh with INLINE resources, plotly with its JS inline,
pygal's server-side SVG, matplotlib's SVG) this draws the chart the daemon page and the history
file draw most — a smokeping-style RTT band (min, p50, p99) over 24 h in 5-minute buckets
(288 points), loss marked, four path events — and measures:

- the weight of one self-contained HTML file holding it (bytes),
- references to any other host left in that file (``src=``/``href=`` to http(s), CSS url()),
- the time to build the page in Python, median of ``--runs``, for 1 and for 12 such charts
  (the daemon's overview draws at most 12 bands however many peers it has).

"BokehJS API" is what wanprobe does (pictures/charts.js): the same BokehJS, but the page carries
the data as JSON and the browser builds the plot, instead of bokeh's Python models serialised by
the daemon. Install the other candidates into a scratch venv to compare them (``pip install bokeh
plotly pygal matplotlib``, with this checkout on PYTHONPATH); wanprobe itself depends only on the
chosen one (docs/pictures.md).

    PYTHONPATH=. python bench/pictures_libraries.py [--runs 5]
"""

from __future__ import annotations

import importlib.util
import io
import math
import re
import sys
from collections.abc import Callable

from common import parser, span, timed

POINTS = 288
EVENT_AT = (60, 140, 200, 250)
FOREIGN = re.compile(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//|url\(\s*["']?(?:https?:)?//""",
                     re.I)


def band_data() -> dict[str, list[float]]:
    """A deterministic 24 h band: 40 ms floor with a diurnal bump, p99 spread, some loss."""
    t0 = 1_700_000_000.0
    ts = [t0 + 300 * i for i in range(POINTS)]
    p50 = [40 + 3 * math.sin(i / 30) + (8 if 140 <= i < 200 else 0) for i in range(POINTS)]
    return {"ts": ts, "min": [x - 0.5 for x in p50], "p50": p50,
            "p99": [x + 4 + 2 * math.cos(i / 7) for i, x in enumerate(p50)],
            "loss": [0.02 if i % 37 == 0 else 0.0 for i in range(POINTS)]}


def page_bokeh(n: int) -> str:
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models import ColumnDataSource, Span
    from bokeh.plotting import figure
    from bokeh.resources import INLINE

    d = band_data()
    figs = []
    for _ in range(n):
        src = ColumnDataSource({k: [x * 1000 for x in v] if k == "ts" else v for k, v in d.items()})
        f = figure(x_axis_type="datetime", height=220, width=900, tools="xpan,xwheel_zoom,reset")
        f.varea(x="ts", y1="min", y2="p99", source=src, fill_alpha=0.3)
        f.line(x="ts", y="p50", source=src)
        lossy = {k: [v[i] for i in range(POINTS) if d["loss"][i] > 0] for k, v in src.data.items()}
        f.scatter(x="ts", y="p50", source=ColumnDataSource(lossy), color="red", size=6)
        for i in EVENT_AT:
            f.add_layout(Span(location=d["ts"][i] * 1000, dimension="height"))
        figs.append(f)
    return file_html(column(*figs), INLINE, "band")


def page_bokehjs(n: int) -> str:
    """What wanprobe does: the data as JSON, drawn in the browser through BokehJS's own API."""
    from wanprobe.pictures import assets
    from wanprobe.pictures.html import Page

    d = band_data()
    page = Page("band")
    for _ in range(n):
        page.chart({"kind": "band", "title": "band", "y_top": 60.0,
                    "data": {"x": [t * 1e3 for t in d["ts"]], "min": d["min"], "p50": d["p50"],
                             "p99": d["p99"], "loss": d["loss"], "fwd": d["loss"],
                             "rev": d["loss"], "sessions": [1] * POINTS},
                    "events": [{"x": d["ts"][i] * 1e3, "label": "event"} for i in EVENT_AT]})
    return page.render(assets.load())


def page_plotly(n: int) -> str:
    import plotly.graph_objects as go

    d = band_data()
    parts = []
    for i in range(n):
        fig = go.Figure([go.Scatter(x=d["ts"], y=d["p99"], line={"width": 0}),
                         go.Scatter(x=d["ts"], y=d["min"], fill="tonexty", line={"width": 0}),
                         go.Scatter(x=d["ts"], y=d["p50"])])
        for j in EVENT_AT:
            fig.add_vline(x=d["ts"][j])
        parts.append(fig.to_html(full_html=False, include_plotlyjs="inline" if i == 0 else False))
    return "<html><body>" + "".join(parts) + "</body></html>"


def page_pygal(n: int) -> str:
    import pygal

    d = band_data()
    svgs = []
    for _ in range(n):
        chart = pygal.XY(js=[], show_dots=False, width=900, height=220)  # js=[]: no CDN script
        for key in ("min", "p50", "p99"):
            chart.add(key, list(zip(d["ts"], d[key], strict=True)))
        svgs.append(chart.render(is_unicode=True))
    return "<html><body>" + "".join(svgs) + "</body></html>"


def page_matplotlib(n: int) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = band_data()
    svgs = []
    for _ in range(n):
        fig, ax = plt.subplots(figsize=(9, 2.2))
        ax.fill_between(d["ts"], d["min"], d["p99"], alpha=0.3)
        ax.plot(d["ts"], d["p50"])
        for j in EVENT_AT:
            ax.axvline(d["ts"][j])
        buf = io.StringIO()
        fig.savefig(buf, format="svg")
        plt.close(fig)
        svgs.append(buf.getvalue())
    return "<html><body>" + "".join(svgs) + "</body></html>"


CANDIDATES: dict[str, tuple[str, Callable[[int], str]]] = {
    "bokeh (INLINE)": ("bokeh", page_bokeh),
    "BokehJS API (wanprobe)": ("bokeh", page_bokehjs),
    "plotly (inline JS)": ("plotly", page_plotly),
    "pygal (SVG, no JS)": ("pygal", page_pygal),
    "matplotlib (SVG)": ("matplotlib", page_matplotlib),
}


def row(name: str, module: str, fn: Callable[[int], str], runs: int) -> str:
    """The table's row of one candidate: page weights, foreign references, build times."""
    version = getattr(__import__(module), "__version__", "?")
    fn(1)  # imports and first-use caches out of the timing
    s1, one = timed(lambda: fn(1), runs)
    s12, twelve = timed(lambda: fn(12), runs)
    return (f"{name:22} {version:9} {len(one.encode()) / 1024:11.0f} "
            f"{len(twelve.encode()) / 1024:13.0f} {len(FOREIGN.findall(twelve)):12d} "
            f"{span((s * 1e3 for s in s1), '6.0f', hi_fmt='<6.0f')} "
            f"{span((s * 1e3 for s in s12), '7.0f', hi_fmt='<6.0f')}")


def main() -> int:
    args = parser(__doc__, ("--runs", 5)).parse_args()
    print(f"one RTT band: {POINTS} points x 3 series, loss marks, {len(EVENT_AT)} events; "
          f"{args.runs} runs each, range min-max")
    print(f"{'library':22} {'version':9} {'1 chart KiB':>11} {'12 charts KiB':>13} "
          f"{'foreign refs':>12} {'1 chart ms':>13} {'12 charts ms':>14}")
    for name, (module, fn) in CANDIDATES.items():
        installed = importlib.util.find_spec(module) is not None
        print(row(name, module, fn, args.runs) if installed else f"{name:22} not installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
