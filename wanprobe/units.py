"""The only parser of human units: "60ms", "100mbit", "0.5%", "64MiB", "AF31".

Every function raises UsageError with a one-line message naming the bad text (cut to a readable
length), so the CLI can print it as is. Rates follow SI (1 mbit = 10**6 bit/s); sizes accept SI
(k, M, G = 10**3...) and IEC (KiB, MiB, GiB = 2**10...); a bare size is bytes, as iperf3's
``-w 131072``. Unlike tc(8), ``bps`` here means *bits* per second. NaN, infinities and values
beyond each parser's ``maximum`` are refused with the limit named.
"""

from __future__ import annotations

import math
import re

from wanprobe.errors import UsageError, shown

# Upper bounds no caller can mean: past them floats lose the unit's precision or overflow the
# kernel's and asyncio's integer time and size types. Callers pass tighter, named limits.
MAX_DURATION_S = 366 * 86400.0   # a year
MAX_RATE_BPS = 1e15              # 1 Pbit/s
MAX_SIZE_BYTES = 2**60           # 1 EiB
MAX_RTT_S = 10.0                 # a round trip over the longest satellite hop is under 1 s
IFNAMSIZ = 16                    # linux/if.h: 15 characters and the NUL

_NUM = r"([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"

_DURATION_S = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0,
    "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0,
}
_RATE_BPS = {
    "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
    "bps": 1, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "tbps": 1e12,
    "b/s": 1, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12,
    "bit/s": 1, "kbit/s": 1e3, "mbit/s": 1e6, "gbit/s": 1e9, "tbit/s": 1e12,
    "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
}
_SIZE_BYTES = {
    "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
# RFC 2474 class selectors, RFC 2597 AF, RFC 3246 EF, RFC 5865 VOICE-ADMIT, RFC 8622 LE.
DSCP_NAMES: dict[str, int] = {
    "BE": 0, "DF": 0, "CS0": 0, "LE": 1, "EF": 46, "VA": 44, "VOICE-ADMIT": 44,
    **{f"CS{i}": 8 * i for i in range(1, 8)},
    **{f"AF{c}{d}": 8 * c + 2 * d for c in range(1, 5) for d in range(1, 4)},
}


def _split(text: str, what: str) -> tuple[float, str]:
    text = str(text)
    m = re.fullmatch(_NUM + r"\s*([A-Za-zµ/%]*)", text.strip()) if len(text) <= 64 else None
    if not m:
        raise UsageError(f"cannot parse {what} {shown(text)}")
    value = float(m.group(1))
    if not math.isfinite(value):
        raise UsageError(f"{what} {shown(text)} is not a finite number")
    return value, m.group(2)


def _limit(value: float, maximum: float, what: str, text: str, shown_max: str) -> None:
    if value > maximum:
        raise UsageError(f"{what} {shown(text)} is above the limit of {shown_max}")


def _scaled(text: str, what: str, units: dict[str, float], *, default_unit: str | None,
            needs_unit: str, known_units: str, allow_zero: bool, maximum: float,
            shown_max: str) -> float:
    """``text`` as a number times its unit's factor in ``units``, with the checks every unit
    parser makes, each with one message: a unit given (or ``default_unit``), a known one, the
    sign, the limit."""
    value, unit = _split(text, what)
    unit = unit.lower()
    if not unit:
        if default_unit is None:
            raise UsageError(f"{what} {shown(text)} needs a unit{needs_unit}")
        unit = default_unit
    if unit not in units:
        raise UsageError(f"unknown {what} unit in {shown(text)} (use {known_units})")
    if value < 0 or (value == 0 and not allow_zero):
        raise UsageError(f"{what} {shown(text)} must be {'≥' if allow_zero else '>'} 0")
    scaled = value * units[unit]
    _limit(scaled, maximum, what, text, shown_max)
    return scaled


def parse_duration_s(text: str, *, default_unit: str | None = None, allow_zero: bool = True,
                     maximum_s: float = MAX_DURATION_S) -> float:
    """Parse a duration such as ``"60ms"``, ``"1.5s"``, ``"250us"`` into seconds.

    A bare number takes ``default_unit`` (e.g. ``"s"``); without one it is an error. More than
    ``maximum_s`` is refused with the limit named.
    """
    return _scaled(text, "duration", _DURATION_S, default_unit=default_unit,
                   needs_unit=" (ns, us, ms, s, m, h, d)", known_units="ns, us, ms, s, m, h, d",
                   allow_zero=allow_zero, maximum=maximum_s, shown_max=format_duration(maximum_s))


def parse_duration_ms(text: str, *, default_unit: str | None = None, allow_zero: bool = True,
                      maximum_s: float = MAX_DURATION_S) -> float:
    """Like :func:`parse_duration_s`, in milliseconds."""
    return parse_duration_s(text, default_unit=default_unit, allow_zero=allow_zero,
                            maximum_s=maximum_s) * 1e3


def parse_rate_bps(text: str, *, allow_zero: bool = False, maximum_bps: float = MAX_RATE_BPS) -> float:
    """Parse a bit rate such as ``"100mbit"``, ``"10gbit"``, ``"2.5Gbps"`` into bits per second.

    A bare number is refused: a rate without a unit is ambiguous (bits? bytes? per second?).
    """
    return _scaled(text, "rate", _RATE_BPS, default_unit=None,
                   needs_unit=", e.g. 100mbit or 10gbit", known_units="bit, kbit, mbit, gbit, tbit",
                   allow_zero=allow_zero, maximum=maximum_bps, shown_max=format_rate(maximum_bps))


def parse_ratio(text: str) -> float:
    """Parse a probability: ``"0.5%"`` → 0.005, ``"0.005"`` → 0.005. Must lie in [0, 1]."""
    value, unit = _split(text, "ratio")
    if unit == "%":
        value /= 100.0
    elif unit:
        raise UsageError(f"cannot parse ratio {shown(text)} (use e.g. 0.5% or 0.005)")
    if not 0.0 <= value <= 1.0:
        raise UsageError(f"ratio {shown(text)} must lie between 0 and 100%")
    return value


def parse_bytes(text: str, *, allow_bare: bool = True, allow_zero: bool = False,
                maximum: int = MAX_SIZE_BYTES) -> int:
    """Parse a size: ``"64MiB"``, ``"4M"`` (SI), ``"131072"`` (bytes, if ``allow_bare``, the
    default: iperf3's ``-w 131072`` means bytes too)."""
    size = _scaled(text, "size", _SIZE_BYTES, default_unit="b" if allow_bare else None,
                   needs_unit=", e.g. 4MiB or 512KiB", known_units="B, KiB, MiB, GiB, k, M, G",
                   allow_zero=allow_zero, maximum=maximum,
                   shown_max=format_bytes(maximum) if maximum % 1024 == 0 else f"{maximum} bytes")
    return int(round(size))


def parse_dscp(text: str | int) -> int:
    """Parse a DSCP code point: a number 0–63 or a name (EF, AF31, CS5, BE, LE)."""
    s = str(text).strip().upper()
    if s in DSCP_NAMES:
        return DSCP_NAMES[s]
    try:
        value = int(s, 0) if len(s) <= 8 and s.isascii() else None
    except ValueError:
        value = None
    if value is None:
        raise UsageError(f"unknown DSCP {shown(text)} (use 0-63 or a name such as EF, AF31, CS5)")
    if not 0 <= value <= 63:
        raise UsageError(f"DSCP {shown(text)} out of range 0-63")
    return value


def dscp_name(value: int) -> str:
    """Canonical name of a DSCP value, or its number as text."""
    for name, v in DSCP_NAMES.items():
        if v == value and name not in ("DF", "CS0", "VOICE-ADMIT"):
            return name
    return str(value)


def parse_ifname(text: str) -> str:
    """A Linux interface name: 1-15 characters, none of them '/', ':', whitespace or control
    (net/core/dev.c: dev_valid_name)."""
    s = str(text)
    if (not 0 < len(s) < IFNAMSIZ or s in (".", "..") or not s.isascii()
            or any(c in "/:" or not c.isprintable() or c.isspace() for c in s)):
        raise UsageError(f"interface name {shown(s)} is not valid (1-15 characters, no '/', ':' "
                         "or spaces)")
    return s


def parse_port(text: str | int) -> int:
    """Parse a UDP/TCP port 1–65535."""
    s = str(text).strip()
    if not (s.isascii() and s.isdigit() and len(s) <= 8):
        raise UsageError(f"port {shown(text)} is not a number"
                         + (" in range 1-65535" if s.lstrip("-").isdigit() else ""))
    value = int(s)
    if not 1 <= value <= 65535:
        raise UsageError(f"port {shown(text)} out of range 1-65535")
    return value


def format_duration(seconds: float) -> str:
    """``86400`` → ``"24h"``, ``60`` → ``"60s"``: a limit as the user would type it."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    return f"{seconds:g}s"


def format_rate(bits_per_second: float) -> str:
    """``123456789`` → ``"123.5 Mbit/s"``."""
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if abs(bits_per_second) >= scale:
            return f"{bits_per_second / scale:.1f} {unit}"
    return f"{bits_per_second:.0f} bit/s"


def format_bytes(n: float) -> str:
    """``6291456`` → ``"6.0 MiB"``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"
