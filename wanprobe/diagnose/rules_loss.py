"""Path loss against the loss SLO, per direction, whatever the congestion control (issue 36).

Loss on a long path is the headline problem of training across sites, and its fix is the
carrier's: the finding carries what a carrier asks for (each direction's lost and sent probes
with their 95 % interval, the SLO it breaks, the RTT) and what the loss costs a stream at this
RTT with the sending host's congestion control — Mathis et al. 1997 for Reno (CUBIC in its Reno
region, models/tcp_rate.py), (1 − p) × the link for BBR up to its ~20 % ceiling.

A run resolves the SLO when the probes' 95 % Wilson interval (probe/stats.py) lies wholly above
it (``above``: a finding) or wholly below it (``within``); otherwise it is ``unresolved``, and
a finding says so with how many probes would resolve it. With no loss seen, the interval's top
is about z² / n (the "rule of three" with z = 1.96), so 0.1 % needs about 3,840 probes.
"""

from __future__ import annotations

import math
from typing import Any

from wanprobe.diagnose import inputs as I
from wanprobe.diagnose.finding import Finding
from wanprobe.diagnose.host_inputs import Host
from wanprobe.diagnose.inputs import DiagnoseConfig
from wanprobe.diagnose.measured import LossSample, Measured
from wanprobe.diagnose.rule import mbit, rule
from wanprobe.models.tcp_rate import cc_limited_rate_bps
from wanprobe.probe.stats import Z95

DIRECTIONS = {"forward": "this host → the peer", "reverse": "the peer → this host",
              "round_trip": "the round trip"}
SEVERE_LOSS = 0.01           # ≥ 1 %: a loss-based stream at a long RTT gets a few Mbit/s


def assess(s: LossSample, slo: float) -> str:
    """``above`` (the interval lies above ``slo``), ``within`` (below it) or ``unresolved``."""
    lo, hi = s.ci95
    if lo > slo:
        return "above"
    return "within" if hi < slo else "unresolved"


AT_THE_SLO = 0.1             # a loss within 10 % of the SLO: no sample size tells them apart


def probes_to_resolve(s: LossSample, slo: float) -> int | None:
    """About how many probes would put the 95 % interval clear of ``slo`` at the loss seen:
    z²·p(1−p)/(p − slo)² (normal approximation), z²/slo where little loss was seen, None where
    the loss sits at the SLO itself."""
    p = s.ratio
    if p <= slo / 2:
        return math.ceil(Z95 ** 2 / slo)
    if abs(p - slo) <= AT_THE_SLO * slo:
        return None
    return math.ceil(Z95 ** 2 * p * (1 - p) / (p - slo) ** 2)


def _samples(m: Measured) -> list[tuple[str, LossSample]]:
    """Each direction the reflector split, else the round trip."""
    path = m.path
    if path is None:
        return []
    split = [(d, s) for d in ("forward", "reverse") if (s := path.loss_of(d)) is not None]
    if split:
        return split
    rt = path.loss_round_trip
    return [("round_trip", rt)] if rt is not None else []


def _sender_cc(m: Measured, host: Host | None, direction: str) -> str | None:
    """The congestion control of the host that sends in ``direction``."""
    if direction == "reverse":
        facts = m.peer_facts
        tput = m.throughput_reverse
        return (tput.cc if tput and tput.cc else None) or (facts.cc_current if facts else None)
    tput = m.throughput
    return (tput.cc if tput and tput.cc else None) or (host.cc_current if host else None)


def _cost(m: Measured, host: Host | None, config: DiagnoseConfig, direction: str,
          p: float) -> tuple[dict[str, Any], str]:
    """What ``p`` costs one stream of the sender's cc at the measured RTT, and the prose."""
    rtt, _ = I.rtt_s(m)
    cc = _sender_cc(m, host, direction)
    target, target_src, assumed = I.target_rate_bps(m, host, config)
    if rtt is None or cc not in ("reno", "cubic", "bbr") or p <= 0:
        return {"cc": cc}, ""
    rate = min(cc_limited_rate_bps(cc, target, m.mss_bytes, rtt, min(p, 1.0)), target)
    model = ("Mathis et al. 1997: MSS·8/RTT·1.22/√p" if cc != "bbr"
             else "BBR: (1 − p) × the link, to ~20 % loss")
    prose = (f"a {cc} stream at {rtt * 1e3:.0f} ms carries at most ≈ {mbit(rate)} of "
             f"{mbit(target)}{' (assumed)' if assumed else ''} at this loss ({model})")
    return {"cc": cc, "rtt_ms": rtt * 1e3, "stream_rate_bound_bps": rate, "link_rate_bps": target,
            "link_rate_assumed": assumed, "model": model,
            "sources": {"link_rate_bps": target_src}}, prose


def _evidence(direction: str, s: LossSample, slo: float) -> dict[str, Any]:
    lo, hi = s.ci95
    return {"direction": direction, "lost": s.lost, "sent": s.of, "loss_ratio": s.ratio,
            "ci95": [lo, hi], "loss_slo": slo,
            "sources": {"loss": "STAMP probes (RFC 8762), per direction from the reflector's "
                                "receive count (RFC 8972 §4.5)"}}


@rule("path.loss_above_slo")
def loss_above_slo(m: Measured, host: Host | None, config: DiagnoseConfig) -> list[Finding] | None:
    """Each direction whose loss lies above the SLO (its 95 % interval wholly above it)."""
    out: list[Finding] = []
    for direction, s in _samples(m):
        if assess(s, config.loss_slo) != "above":
            continue
        lo, hi = s.ci95
        cost, prose = _cost(m, host, config, direction, s.ratio)
        where = DIRECTIONS[direction]
        out.append(Finding(
            id="path.loss_above_slo",
            severity="critical" if lo >= SEVERE_LOSS else "warning",
            title=(f"The path loses {s.ratio:.2%} of packets {where} (95 % interval "
                   f"{lo:.2%}–{hi:.2%}, {s.lost} of {s.of}), above the {config.loss_slo:.2%} SLO"),
            evidence={**_evidence(direction, s, config.loss_slo), **cost},
            recommendation=("The loss is the path's, not the hosts': raise it with the carrier "
                            "or the network team, with this report's ticket (`wanprobe report "
                            "show REPORT --format markdown`: both addresses, the times, the loss "
                            "per direction with its interval). Host tuning only limits its cost "
                            "(bbr instead of a loss-based control)."),
            expected_effect=prose or f"{s.ratio:.2%} of the packets {where} are lost",
            impact=min(1.0, s.ratio) if not prose else
            max(0.0, 1 - cost["stream_rate_bound_bps"] / cost["link_rate_bps"]),
            direction=None if direction == "round_trip" else direction))
    return out or None


@rule("path.loss_unresolved")
def loss_unresolved(m: Measured, host: Host | None,
                    config: DiagnoseConfig) -> list[Finding] | None:
    """Each direction whose probes could not tell whether its loss is within the SLO."""
    out: list[Finding] = []
    for direction, s in _samples(m):
        if assess(s, config.loss_slo) != "unresolved":
            continue
        lo, hi = s.ci95
        need = probes_to_resolve(s, config.loss_slo)
        out.append(Finding(
            id="path.loss_unresolved", severity="info",
            title=(f"{s.of} probes cannot tell whether the loss {DIRECTIONS[direction]} is within "
                   f"the {config.loss_slo:.2%} SLO: {s.lost} lost, 95 % interval "
                   f"{lo:.2%}–{hi:.2%}"),
            evidence={**_evidence(direction, s, config.loss_slo), "probes_needed": need},
            recommendation=(f"Probe longer: about {need:,} probes resolve it (`wanprobe probe "
                            f"PEER --count {need} --interval 1ms`, or `diagnose --full`); the "
                            "daemon's windowed loss answers it over time." if need else
                            "The loss sits at the SLO itself: no longer run tells the two "
                            "apart; the daemon's windowed loss shows which way it moves."),
            expected_effect="", direction=None if direction == "round_trip" else direction))
    return out or None


RULES = (loss_above_slo, loss_unresolved)
