"""Text that came from outside (a file, a peer, a config) is data, never terminal control.

A finding title, a peer's error string, a mesh host name or an interface name may hold escape
sequences: ``ESC ] 0 ; title BEL`` sets the window title, ``ESC [ 2 J`` clears the screen, OSC 52
writes the clipboard, and bidirectional overrides (U+202E; "Trojan Source", CVE-2021-42574) make
text read differently from what it is. rich strips only BEL, BS, VT, FF and CR (``rich.control``),
so ``ESC`` itself reaches the terminal. :func:`clean` escapes every C0 and C1 control, DEL, the
invisible format characters (Unicode category Cf: the bidi controls, zero-width spaces and joiners,
tag characters) and lone surrogates as visible ``\\xNN`` / ``\\uNNNN`` text (the HTML pages show
them the same way, pictures/html.py); :class:`SafeConsole`
is a rich Console that applies it to every text segment it prints (rich's own styling is
emitted afterwards, from the segments' styles, and is kept).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.segment import Segment

# Unicode category Cf ("format": invisible; ALM, LRM/RLM, LRE..RLO, LRI..PDI reorder text, the
# zero-width ones and the tag characters hide it), as of Unicode 15.1; a test holds it to unicodedata
FORMAT_CHARS = ("\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
                "\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
                "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
                "\U000e0020-\U000e007f")
# C0 but TAB and LF, DEL, C1, the format characters, lone surrogates
_UNSAFE = f"\x00-\x08\x0b-\x1f\x7f-\x9f{FORMAT_CHARS}\ud800-\udfff"
_UNSAFE_RE = re.compile(f"[{_UNSAFE}]")
_UNSAFE_NL_RE = re.compile(f"[{_UNSAFE}\t\n]")


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"


def clean(value: Any, *, newlines: bool = False) -> str:
    """``str(value)`` with every control character escaped as visible text; TAB and LF are
    escaped too unless ``newlines`` (multi-line text)."""
    text = value if isinstance(value, str) else str(value)
    return (_UNSAFE_RE if newlines else _UNSAFE_NL_RE).sub(_escape, text)


def clean_lines(value: Any) -> str:
    """:func:`clean` for multi-line text: newlines are kept."""
    return clean(value, newlines=True)


class SafeConsole(Console):
    """A rich Console whose printed text cannot carry terminal control sequences: each text
    segment passes :func:`clean` (newlines kept) before rich styles it. Build text from
    outside data with :func:`clean` first where the column width matters; this is the net."""

    def render(self, renderable: Any, options: Any = None) -> Iterable[Segment]:
        for seg in super().render(renderable, options):
            if seg.control is None and _UNSAFE_RE.search(seg.text):
                yield Segment(clean_lines(seg.text), seg.style)
            else:
                yield seg
