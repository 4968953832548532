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


# -- buffer sizing under a congestion control and loss ------------------------------------------
# BBR keeps up to cwnd_gain × BDP in flight (net/ipv4/tcp_bbr.c: bbr_cwnd_gain = BBR_UNIT * 2;
# Cardwell et al., "BBR: Congestion-Based Congestion Control", ACM Queue 2016). Loss-based cc
# (reno/cubic) needs at least one BDP in flight to fill the pipe (Jacobson 1988; RFC 5681).
CC_INFLIGHT_GAIN = {"bbr": 2.0, "bbr2": 2.0, "bbr3": 2.0}
DEFAULT_INFLIGHT_GAIN = 1.0
DEFAULT_MSS_BYTES = 1448


def cc_inflight_gain(cc: str | None) -> float:
    """In-flight data the congestion control keeps, in BDPs (see CC_INFLIGHT_GAIN)."""
    return CC_INFLIGHT_GAIN.get((cc or "").lower(), DEFAULT_INFLIGHT_GAIN)


def loss_in_rtt_probability(loss: float, packets_per_rtt: float) -> float:
    """Chance that at least one of a round trip's packets is lost: ``1 - (1 - p)^n`` (random,
    independent loss). 0.1 % over 1122 packets (100 Mbit/s × 130 ms) ≈ 0.67."""
    if not 0 <= loss < 1:
        raise UsageError(f"loss must lie in [0, 1), got {loss!r}")
    return 1.0 - (1.0 - loss) ** max(packets_per_rtt, 0.0)


def recovery_headroom(loss: float, bdp: float, mss_bytes: int = DEFAULT_MSS_BYTES) -> float:
    """Extra receive buffer for loss recovery, as a factor ≥ 1.

    While a hole is repaired (one RTT, SACK recovery RFC 6675) the sender keeps the window full
    and the receiver holds everything above the hole in its out-of-order queue, charged to the
    same sk_rcvbuf (net/ipv4/tcp_input.c ``tcp_data_queue_ofo`` → ``tcp_try_rmem_schedule``).
    A round trip with a loss therefore needs up to two windows of buffer; weighted by how often
    a round trip sees a loss: ``1 + P(loss in an RTT)``.
    """
    return 1.0 + loss_in_rtt_probability(loss, bdp / max(mss_bytes, 1))


def tuned_buffer_bytes(rate_bps: float, rtt_s: float, *, cc: str | None, loss: float,
                       scaling_ratio: float = DEFAULT_WINDOW_SCALING_RATIO,
                       mss_bytes: int = DEFAULT_MSS_BYTES) -> int:
    """``tcp_rmem[2]``/``tcp_wmem[2]`` for one flow to fill ``rate_bps`` × ``rtt_s``:

    ``BDP × cc_inflight_gain(cc) × recovery_headroom(loss) / scaling_ratio``

    where ``scaling_ratio`` is the share of the buffer the kernel advertises as window — measured
    live where possible (window seen by the sender ÷ the receiver's buffer), else the kernel's
    starting value 1/2 (TCP_DEFAULT_SCALING_RATIO, include/net/tcp.h, 6.6+). BBR, 0.1 %,
    130 ms, 100 Mbit/s, ratio 1/2: 1.63 MB × 2 × 1.67 / 0.5 ≈ 10.9 MB (6.7 × BDP), where the
    issue measured 2×BDP → 61 Mbit/s and 4×BDP → 84-94 Mbit/s.
    """
    bdp = bdp_bytes(rate_bps, rtt_s)
    return buffer_needed_bytes(rate_bps, rtt_s, scaling_ratio=scaling_ratio,
                               headroom=cc_inflight_gain(cc) * recovery_headroom(loss, bdp,
                                                                                 mss_bytes))


def per_flow_budget_bytes(tcp_mem_pressure_bytes: float, flows: int) -> int:
    """Memory one flow may take: the host's TCP memory pressure threshold (``tcp_mem[1]`` in
    bytes; above it the kernel trims every socket's buffers, net/core/sock.c
    ``__sk_mem_raise_allocated``) shared by the ``flows`` expected at once."""
    if flows < 1:
        raise UsageError(f"flows must be ≥ 1, got {flows!r}")
    return int(_positive("tcp_mem_pressure_bytes", tcp_mem_pressure_bytes) // flows)


def measured_scaling_ratio(window_bytes: float | None, buffer_bytes: float | None) -> float | None:
    """Share of a receive buffer advertised as window, from a live transfer that filled it:
    the peer's largest advertised window (sender's tcpi_snd_wnd) ÷ its tcp_rmem[2]. None when
    either is unknown or the ratio is not in (0, 1] (the buffer was not the limit)."""
    if not window_bytes or not buffer_bytes:
        return None
    ratio = window_bytes / buffer_bytes
    return ratio if 0 < ratio <= 1 else None
