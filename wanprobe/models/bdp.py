"""Bandwidth-delay product and the rate a window allows.

Units: rates in bits per second, times in seconds, sizes in bytes.
"""

from __future__ import annotations

import math

from wanprobe.errors import UsageError

# Linux advertises only part of the receive buffer as window: before 6.6 this was
# 1 - 2**-tcp_adv_win_scale (default 1 → 1/2); since 6.6 it is the measured
# skb->len / skb->truesize "scaling_ratio", which starts at 1/2 (TCP_DEFAULT_SCALING_RATIO).
DEFAULT_WINDOW_SCALING_RATIO = 0.5


def _positive(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise UsageError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def bdp_bytes(rate_bps: float, rtt_s: float) -> float:
    """Bandwidth-delay product: the bytes in flight needed to fill the path.

    ``BDP = rate · RTT / 8`` (bits → bytes). 10 Gbit/s × 100 ms = 125 MB.
    """
    return _positive("rate_bps", rate_bps) * _positive("rtt_s", rtt_s) / 8.0


def window_limited_rate_bps(window_bytes: float, rtt_s: float) -> float:
    """Highest rate one TCP flow reaches with at most ``window_bytes`` in flight.

    ``rate = window · 8 / RTT`` (one window per round trip). 6 MiB over 130 ms ≈ 387 Mbit/s.
    """
    return _positive("window_bytes", window_bytes) * 8.0 / _positive("rtt_s", rtt_s)


def window_from_buffer_bytes(buffer_bytes: float,
                             scaling_ratio: float = DEFAULT_WINDOW_SCALING_RATIO) -> float:
    """Receive window a socket buffer of ``buffer_bytes`` (e.g. ``tcp_rmem[2]``) can advertise.

    ``window = buffer · scaling_ratio``; Linux keeps the rest for skb overhead
    (net/ipv4/tcp_input.c ``tcp_win_from_space``; tcp_adv_win_scale before 6.6).
    """
    if not 0 < scaling_ratio <= 1:
        raise UsageError(f"scaling_ratio must lie in (0, 1], got {scaling_ratio!r}")
    return _positive("buffer_bytes", buffer_bytes) * scaling_ratio


def buffer_needed_bytes(rate_bps: float, rtt_s: float, *,
                        scaling_ratio: float = DEFAULT_WINDOW_SCALING_RATIO,
                        headroom: float = 1.0) -> int:
    """Socket buffer (``tcp_rmem[2]``/``tcp_wmem[2]``) that lets one flow fill the path.

    ``buffer = headroom · BDP / scaling_ratio``: with the default ratio 1/2 this is the ESnet
    rule "about 2×BDP" (tcp-tuning.md §1, §4.7). Rounded up to whole bytes.
    """
    if not 0 < scaling_ratio <= 1:
        raise UsageError(f"scaling_ratio must lie in (0, 1], got {scaling_ratio!r}")
    _positive("headroom", headroom)
    return int(math.ceil(headroom * bdp_bytes(rate_bps, rtt_s) / scaling_ratio))
