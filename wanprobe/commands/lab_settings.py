"""Parsing and describing lab link settings, and the options that change a running lab's link,
shared by ``lab`` and ``lab multipath``."""

from __future__ import annotations

from typing import Annotated

import typer

from wanprobe.units import MAX_RTT_S, format_rate, parse_duration_ms, parse_rate_bps, parse_ratio

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]
# `lab update` and `lab multipath path`: a new value for one impairment of a running link
NewRtt = Annotated[str | None, typer.Option(help="New round-trip delay.")]
NewJitter = Annotated[str | None, typer.Option(help="New jitter.")]
NewLoss = Annotated[str | None, typer.Option(help="New loss, both directions.")]
# one-way delays (`lab up`, `lab update`, `lab path`): asymmetric paths; the RTT is their sum
DelayAb = Annotated[str | None, typer.Option(
    "--delay-ab", help="One-way delay a→b, e.g. 10ms (with --delay-ba; the RTT is the sum).")]
DelayBa = Annotated[str | None, typer.Option(
    "--delay-ba", help="One-way delay b→a, e.g. 50ms.")]
QueueAb = Annotated[str | None, typer.Option(
    "--queue-ab", help="Mean queueing delay a→b only, e.g. 15ms.")]
QueueBa = Annotated[str | None, typer.Option(
    "--queue-ba", help="Mean queueing delay b→a only, e.g. 15ms.")]


def _opt(text: str | None, parse):
    return None if text is None else parse(text)


def _ms(text: str) -> float:
    """A delay or jitter in ms; a bare number is ms (as tc's netem); at most MAX_RTT_S."""
    return parse_duration_ms(text, default_unit="ms", maximum_s=MAX_RTT_S)


def settings_kwargs(*, rtt=None, jitter=None, loss=None, loss_ab=None, loss_ba=None, rate=None,
                    black_hole_mtu=None, bleach_dscp=None, reorder=None, delay_ab=None,
                    delay_ba=None, queue_ab=None, queue_ba=None) -> dict:
    """Parse the CLI's unit strings into Lab keyword arguments (only those given)."""
    out = {
        "delay_ab_ms": _opt(delay_ab, _ms), "delay_ba_ms": _opt(delay_ba, _ms),
        "queue_ab_ms": _opt(queue_ab, _ms), "queue_ba_ms": _opt(queue_ba, _ms),
        "rtt_ms": _opt(rtt, _ms), "jitter_ms": _opt(jitter, _ms), "loss": _opt(loss, parse_ratio),
        "loss_ab": _opt(loss_ab, parse_ratio), "loss_ba": _opt(loss_ba, parse_ratio),
        "rate_bps": _opt(rate, parse_rate_bps), "black_hole_mtu": black_hole_mtu,
        "bleach_dscp": bleach_dscp, "reorder": _opt(reorder, parse_ratio),
    }
    return {k: v for k, v in out.items() if v is not None}


def describe(settings) -> str:
    s = settings
    parts = [f"rtt {s.rtt_ms:g} ms"]
    if s.asymmetric:
        parts[0] += f" (a→b {s.delay_ms('ab'):g} ms, b→a {s.delay_ms('ba'):g} ms)"
    if s.queue_ab_ms is not None or s.queue_ba_ms is not None:
        parts.append(f"queue a→b {s.queue_of('ab'):g} ms b→a {s.queue_of('ba'):g} ms")
    if s.jitter_ms:
        parts.append(f"jitter {s.jitter_ms:g} ms")
    if s.loss_ab == s.loss_ba:
        parts.append(f"loss {s.loss_ab * 100:g}%")
    else:
        parts.append(f"loss a→b {s.loss_ab * 100:g}% b→a {s.loss_ba * 100:g}%")
    parts.append(f"rate {format_rate(s.rate_bps) if s.rate_bps else 'unlimited'}")
    parts.append(f"mtu {s.mtu}")
    if s.black_hole_mtu:
        parts.append(f"black-hole mtu {s.black_hole_mtu}")
    if s.bleach_dscp:
        parts.append("DSCP bleached")
    if s.reorder:
        parts.append(f"reorder {s.reorder * 100:g}%")
    return ", ".join(parts)
