"""The pictures' assets: BokehJS from the bokeh wheel, and this package's charts.js and page.css.

BokehJS (``bokeh.min.js`` and ``bokeh-api.min.js``) ships inside the bokeh wheel and is read
from there through ``bokeh.resources`` (mode ``inline``), so a page never names another host:
an HTML file carries it inline; the daemon serves it once under ``/static/`` with a content hash
in the name and a year-long cache. bokeh is the optional ``pictures`` extra (docs/pictures.md
says why this library and why its JS API rather than its Python models).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources

from wanprobe.errors import WanprobeError

EXTRA_HINT = "pip install 'wanprobe[pictures]'"


class PicturesUnavailable(WanprobeError):
    """The plotting library (the ``pictures`` extra) is not installed."""

    exit_code = 3


@dataclass(frozen=True)
class Assets:
    """The script every page runs (BokehJS, then charts.js), its hashed name, and the CSS."""

    script: str
    css: str
    bokeh_version: str

    @cached_property
    def script_bytes(self) -> bytes:
        return self.script.encode()

    @cached_property
    def script_name(self) -> str:
        """The name it is served under: changes with its content (cached for a year)."""
        return f"wanprobe-pictures.{hashlib.sha256(self.script_bytes).hexdigest()[:12]}.js"


def _package_text(name: str) -> str:
    return resources.files("wanprobe.pictures").joinpath(name).read_text(encoding="utf-8")


@cache
def load() -> Assets:
    """Read the assets once; raise PicturesUnavailable (one line) without bokeh."""
    try:
        import bokeh
        from bokeh.resources import Resources
    except ImportError:
        raise PicturesUnavailable(f"HTML pictures need the plotting library bokeh: "
                                  f"{EXTRA_HINT}") from None
    bokehjs = Resources(mode="inline", components=["bokeh", "bokeh-api"]).js_raw
    # js_raw ends with bokeh's own set_log_level("info") line; charts.js sets "warn"
    script = "\n".join([*bokehjs, _package_text("charts.js")])
    # inline in a <script> element: its text must never close the element early
    script = script.replace("</script", "<\\/script")
    return Assets(script=script, css=_package_text("page.css"), bokeh_version=bokeh.__version__)
