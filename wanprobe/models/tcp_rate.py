"""Throughput ceilings of one TCP flow: Mathis, Padhye, CUBIC, BBR, and what a host achieves.

Sources: Mathis, Semke, Mahdavi, Ott, CCR 27(3)
1997; Padhye, Firoiu, Towsley, Kurose, SIGCOMM 1998 eq. 31; RFC 8312/9438 (CUBIC); Cardwell et
al., "BBR: Congestion-Based Congestion Control", ACM Queue 14(5) 2016, and the BBRv1 loss
ceiling 1.25·(1−p) ≥ 1 ⇒ p ≤ 20 % (bbr-dev). Units: bits/s, seconds, bytes, loss as a fraction.
"""

from __future__ import annotations

import math

from wanprobe.errors import UsageError
from wanprobe.models.bdp import window_limited_rate_bps

MATHIS_C = math.sqrt(1.5)            # periodic loss, no delayed ACKs
CUBIC_C = 0.4                        # RFC 9438 §5.1
CUBIC_BETA = 0.7                     # RFC 9438 §4.6
BBR_V1_MAX_LOSS = 0.2                # 1.25 · (1 − p) ≥ 1
DEFAULT_MSS_BYTES = 1448             # 1500-byte MTU, IPv4 + TCP timestamps
CONGESTION_CONTROLS = ("reno", "cubic", "bbr")


def _check(mss_bytes: float, rtt_s: float, loss: float) -> None:
    if not (math.isfinite(mss_bytes) and mss_bytes > 0):
        raise UsageError(f"MSS must be > 0 bytes, got {mss_bytes!r}")
    if not (math.isfinite(rtt_s) and rtt_s > 0):
        raise UsageError(f"RTT must be > 0 s, got {rtt_s!r}")
    if not (0.0 <= loss <= 1.0):
        raise UsageError(f"loss must be a fraction in [0, 1], got {loss!r}")


def mathis_rate_bps(mss_bytes: float, rtt_s: float, loss: float, c: float = MATHIS_C) -> float:
    """Mathis et al. 1997 bound for Reno: ``rate = (MSS·8 / RTT) · C / √p``, C = √(3/2).

    MSS 1448 B, RTT 100 ms, p = 1e-3 → ≈ 4.49 Mbit/s. ``inf`` without loss (the model then
    says nothing: the window or the link limits instead).
    """
    _check(mss_bytes, rtt_s, loss)
    if loss == 0:
        return math.inf
    return mss_bytes * 8.0 / rtt_s * c / math.sqrt(loss)


def _padhye_q(p: float, w: float) -> float:
    """Padhye eq. 31's Q̂(w): probability that a loss is detected by timeout."""
    q = 1.0 - p
    denominator = 1.0 - q ** w
    if denominator <= 0:
        return 1.0
    return min(1.0, (1.0 - q ** 3) * (1.0 + q ** 3 * (1.0 - q ** (w - 3.0))) / denominator)


def padhye_rate_bps(mss_bytes: float, rtt_s: float, loss: float, *, rto_s: float = 1.0,
                    wmax_packets: float | None = None) -> float:
    """Padhye et al. 1998 full model (eq. 31, b = 2 packets per ACK), in bits/s.

    With ``w(p) = (2/3)(1 + √(3(1−p)/p + 1))``, ``G(p) = 1+p+2p²+4p³+8p⁴+16p⁵+32p⁶``:
    if ``w(p) < wmax``: ``pkts/s = [(1−p)/p + w + Q/(1−p)] / [RTT(w+1) + Q·G·T0/(1−p)]``;
    else the same with ``wmax`` and denominator ``RTT(wmax/4 + (1−p)/(p·wmax) + 2) + Q·G·T0/(1−p)``.
    ``T0 = rto_s`` (Linux minimum RTO 200 ms + RTT; default 1 s, the RFC 6298 initial RTO).
    More accurate than Mathis above about 2 % loss.
    """
    _check(mss_bytes, rtt_s, loss)
    if loss == 0:
        if wmax_packets is None:
            return math.inf
        return wmax_packets * mss_bytes * 8.0 / rtt_s
    if loss >= 1:
        return 0.0
    p = loss
    g = 1 + p + 2 * p**2 + 4 * p**3 + 8 * p**4 + 16 * p**5 + 32 * p**6
    w = (2.0 / 3.0) * (1.0 + math.sqrt(3.0 * (1 - p) / p + 1.0))
    if wmax_packets is None or w < wmax_packets:
        q = _padhye_q(p, w)
        pkts = ((1 - p) / p + w + q / (1 - p)) / (rtt_s * (w + 1) + q * g * rto_s / (1 - p))
    else:
        wm = float(wmax_packets)
        q = _padhye_q(p, wm)
        pkts = ((1 - p) / p + wm + q / (1 - p)) / (
            rtt_s * (0.25 * wm + (1 - p) / (p * wm) + 2) + q * g * rto_s / (1 - p))
    return pkts * mss_bytes * 8.0


def cubic_rate_bps(mss_bytes: float, rtt_s: float, loss: float, *, c: float = CUBIC_C,
                   beta: float = CUBIC_BETA) -> float:
    """CUBIC's average rate under random loss, never below its Reno-friendly (Mathis) rate.

    RFC 8312 §5.1: average window ``(C(3+β)/(4(1−β)))^¼ · RTT^¾ / p^¾`` packets
    (≈ 1.054·RTT^¾/p^¾ for C = 0.4, β = 0.7); the Reno-friendly region (RFC 9438 §4.3) gives
    the Mathis window 1.22/√p. MSS 1448, RTT 100 ms: p = 1e-4 → 21.7 Mbit/s, p = 1e-3 → 4.5.
    """
    _check(mss_bytes, rtt_s, loss)
    if loss == 0:
        return math.inf
    window_pkts = (c * (3 + beta) / (4 * (1 - beta))) ** 0.25 * rtt_s ** 0.75 / loss ** 0.75
    cubic = window_pkts * mss_bytes * 8.0 / rtt_s
    return max(cubic, mathis_rate_bps(mss_bytes, rtt_s, loss))


def bbr_rate_bps(link_bps: float, loss: float) -> float:
    """BBRv1 under random loss: ``(1 − p) · link`` while ``1.25·(1 − p) ≥ 1`` (p ≤ 20 %).

    BBR ignores loss as a signal; it delivers the link times the delivered fraction (ACM Queue
    2016, Fig. 10: "BBR meets this limit up to a 5% loss and is close up to 15%"). Above 20 %
    its 1.25× probe no longer sees more bandwidth and the estimate decays: 0 is returned.
    """
    if not (math.isfinite(link_bps) and link_bps > 0):
        raise UsageError(f"link rate must be > 0 bit/s, got {link_bps!r}")
    if not 0.0 <= loss <= 1.0:
        raise UsageError(f"loss must be a fraction in [0, 1], got {loss!r}")
    if loss > BBR_V1_MAX_LOSS:
        return 0.0
    return (1.0 - loss) * link_bps


def cc_limited_rate_bps(cc: str, link_bps: float, mss_bytes: float, rtt_s: float,
                        loss: float) -> float:
    """Per-flow loss-limited rate of congestion control ``cc`` (reno, cubic or bbr)."""
    name = str(cc).strip().lower()
    if name == "reno":
        return mathis_rate_bps(mss_bytes, rtt_s, loss)
    if name == "cubic":
        return cubic_rate_bps(mss_bytes, rtt_s, loss)
    if name == "bbr":
        _check(mss_bytes, rtt_s, loss)
        return bbr_rate_bps(link_bps, loss)
    raise UsageError(f"unknown congestion control {cc!r} (use {', '.join(CONGESTION_CONTROLS)})")


def achievable_rate_bps(link_bps: float, rtt_s: float, loss: float,
                        mss_bytes: float = DEFAULT_MSS_BYTES, cc: str = "cubic",
                        window_bytes: float | None = None, streams: int = 1, *,
                        mss: float | None = None) -> float:
    """Rate ``streams`` parallel flows reach on a path:
    ``min(link, streams · min(window-limited, cc-loss-limited))``.

    ``window_bytes`` is the per-flow window (e.g. :func:`bdp.window_from_buffer_bytes` of
    ``tcp_rmem[2]``); ``None`` means unlimited. ``mss`` is an alias of ``mss_bytes``.
    """
    if mss is not None:
        mss_bytes = mss
    if not (math.isfinite(link_bps) and link_bps > 0):
        raise UsageError(f"link rate must be > 0 bit/s, got {link_bps!r}")
    if int(streams) != streams or streams < 1:
        raise UsageError(f"streams must be a whole number ≥ 1, got {streams!r}")
    per_flow = cc_limited_rate_bps(cc, link_bps, mss_bytes, rtt_s, loss)
    if window_bytes is not None:
        per_flow = min(per_flow, window_limited_rate_bps(window_bytes, rtt_s))
    return min(float(link_bps), streams * per_flow)
