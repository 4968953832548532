"""Probe rates against the reflector's own limit (issue 20): learn the limit before sending, pace
or refuse a rate above it, and say so when loss may be the reflector's.

A wanprobe reflector answers at most ``--rate-limit`` probes per second per source address
(5,000 by default) and advertises that number in the Reflector Report TLV of every reply
(reflector_report.py). Before a run faster than ``ASK_ABOVE_PPS`` the sender asks with one probe;
above the limit it paces to ``PACE_SHARE`` of it (the default), refuses, or sends anyway (the
reflector's drops are then counted apart from the path's loss: loss_split.py). ``--interval``
is per flow in ``paths``: 16 flows at 1 ms are 16,000 probes/s from one source address.

A third-party reflector cannot say what it dropped. Some answer only a few hundred probes per
second per session by default (Huawei's TWAMP Light responder: 256 pps, its
``twamp-light base-session max-rate`` command), so above ``TYPICAL_LIMIT_PPS`` per session any
loss is reported with a note that it may be the reflector's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from wanprobe.errors import UsageError, WanprobeError

TYPICAL_LIMIT_PPS = 256     # per session; see the module docstring
ASK_ABOVE_PPS = 50.0        # slower runs are not worth the extra round trip
PACE_SHARE = 0.8            # pace below the limit: the bucket is per source, timers bunch probes
POLICIES = ("pace", "refuse", "send")


@dataclass(frozen=True)
class RatePlan:
    """The rate asked for (probes/s from this host to the reflector), the reflector's limit if
    it said, and the per-flow interval to use (longer than asked when paced)."""

    asked_pps: float
    limit_pps: int | None
    interval_s: float
    paced: bool = False

    @property
    def paced_pps(self) -> float | None:
        return PACE_SHARE * self.limit_pps if self.paced and self.limit_pps else None

    def to_json(self) -> dict:
        paced = self.paced_pps
        return {"asked_pps": round(self.asked_pps, 3),
                "paced_pps": None if paced is None else round(paced, 3)}


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise UsageError(f"--above-limit must be one of {', '.join(POLICIES)}, got {policy!r}")
    return policy


async def ask_limit_pps(addr: str, port: int, *, timeout_s: float,
                        hmac_key: bytes | None = None) -> int | None:
    """The reflector's advertised limit (probes/s per source) from one probe; None when it did
    not answer or does not say (a third-party reflector)."""
    from wanprobe.probe.sender import probe_stamp

    try:
        res = await probe_stamp(addr, port=port, count=1, interval_s=0.01,
                                timeout_s=min(timeout_s, 2.0), hmac_key=hmac_key)
    except WanprobeError:
        return None
    return res.reflector.limit_pps if res.reflector is not None else None


def plan(asked_pps: float, interval_s: float, limit_pps: int | None, policy: str, *,
         peer: str) -> RatePlan:
    """Pace, refuse (UsageError naming both rates) or keep a rate against the limit."""
    if limit_pps is None or asked_pps <= limit_pps or policy == "send":
        return RatePlan(asked_pps, limit_pps, interval_s)
    if policy == "refuse":
        raise UsageError(f"{asked_pps:,.0f} probes/s is above the limit of {peer}'s reflector, "
                         f"{limit_pps:,} per second per source; lower the rate (--interval is "
                         "per flow) or use --above-limit pace")
    return RatePlan(asked_pps, limit_pps, interval_s * asked_pps / (PACE_SHARE * limit_pps),
                    paced=True)


async def guard(addr: str, port: int, *, asked_pps: float, interval_s: float, policy: str,
                timeout_s: float, hmac_key: bytes | None = None, peer: str = "") -> RatePlan:
    """Ask the reflector's limit when the rate is worth it, then :func:`plan`."""
    limit = None
    if asked_pps > ASK_ABOVE_PPS and policy != "send":
        limit = await ask_limit_pps(addr, port, timeout_s=timeout_s, hmac_key=hmac_key)
    return plan(asked_pps, interval_s, limit, policy, peer=peer or addr)


def checked_rate(host: str, kw: dict, policy: str, asked_pps: float,
                 say: Callable[[str], None]) -> RatePlan:
    """For a command: resolve ``host``, ask its reflector's limit when the rate is worth it and
    plan (``kw``: the probe's port, interval_s, timeout_s, hmac_key); a paced plan is announced
    with one line through ``say``. Runs its own event loop."""
    if asked_pps <= ASK_ABOVE_PPS or policy == "send":
        return RatePlan(asked_pps, None, kw["interval_s"])
    refuse_early(kw)
    from wanprobe.probe.peer import resolve_peer

    async def ask() -> RatePlan:
        _family, addr = await resolve_peer(host)
        return await guard(addr, kw["port"], asked_pps=asked_pps, interval_s=kw["interval_s"],
                           policy=policy, timeout_s=kw["timeout_s"],
                           hmac_key=kw.get("hmac_key"), peer=host)

    got = asyncio.run(ask())
    if got.paced:
        say(pace_line(got, host))
    return got


def refuse_early(kw: dict) -> None:
    """What the run itself would refuse (port, DSCP, timeout, count/duration, a size below the
    IPv4 minimum), refused before the probe that asks the limit: bad input sends nothing."""
    import socket

    from wanprobe.probe.probe_options import check_common, probe_count
    from wanprobe.probe.sender import min_size_bytes

    check_common(kw.get("port"), kw.get("dscp") or 0, kw["timeout_s"])
    probe_count(kw.get("count"), kw.get("duration_s"), kw["interval_s"])
    smallest = min_size_bytes(socket.AF_INET, kw.get("hmac_key") is not None)
    if kw.get("size") is not None and kw["size"] < smallest:
        raise UsageError(f"--size {kw['size']} is below the STAMP minimum of {smallest} bytes")


def pace_line(p: RatePlan, peer: str) -> str:
    """The one line a paced run prints before it starts."""
    return (f"{peer}: {p.asked_pps:,.0f} probes/s asked; its reflector answers at most "
            f"{p.limit_pps:,} per second per source: pacing to {p.paced_pps:,.0f}/s "
            f"(interval {p.interval_s * 1e3:.3g} ms per flow)")


def note(loss: dict, reflector: dict | None, session_pps: float) -> str | None:
    """One line on what the reflector did to the figures, from a probe document's ``loss`` and
    ``reflector`` parts; None when there is nothing to say."""
    counts = (reflector or {}).get("counts")
    if counts == "reported":
        parts = []
        if loss.get("reflector_rate_limited"):
            limit = reflector.get("limit_pps")
            parts.append(f"{loss['reflector_rate_limited']:,} probes dropped by its rate limit"
                         + (f" ({limit:,}/s per source)" if limit else ""))
        if loss.get("reflector_replays_refused"):
            parts.append(f"{loss['reflector_replays_refused']:,} copies refused as replays")
        if loss.get("reflector_resets"):
            parts.append(f"its session restarted {loss['reflector_resets']} time(s)")
        if loss.get("reflector_session_refused"):
            parts.append(f"{loss['reflector_session_refused']:,} probes refused a session "
                         "(its session table had no room: a flood, or this source's share full)")
        if parts and loss.get("unattributed"):
            parts.append(f"{loss['unattributed']:,} unanswered probes could be either's")
        if parts:
            return "reflector: " + "; ".join(parts) + ": not counted as path loss"
        return None
    if counts == "not_supported" and session_pps > TYPICAL_LIMIT_PPS and loss.get("ratio"):
        return (f"reflector: it cannot report its own drops (not a wanprobe reflector); at "
                f"{session_pps:,.0f} probes/s per session some of this loss may be its rate "
                f"limit (some reflectors answer {TYPICAL_LIMIT_PPS}/s per session)")
    return None


def annotate(doc: dict, p: RatePlan | None, session_pps: float) -> dict:
    """Add the rate plan and the note to a probe document's ``reflector`` part."""
    refl = dict(doc.get("reflector") or {"counts": None, "limit_pps": None})
    if p is not None:
        refl.update(p.to_json())
        if refl.get("limit_pps") is None:
            refl["limit_pps"] = p.limit_pps
    refl["note"] = note(doc.get("loss") or {}, refl, session_pps)
    doc["reflector"] = refl
    return doc
