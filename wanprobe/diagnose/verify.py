"""Closed loop after ``tune apply``: measure the path again and say whether the limit is now the
network, or still a window or buffer — and then what to do next instead of declaring success.

The rate leaves out the ramp-up like ``iperf3 --omit``: only intervals that start at or after
``omit_s`` count (slow start on a 130 ms path takes seconds to reach the link rate; that is
TCP's start, not the tuning's result).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NEXT_STEP = {
    "network": "none: the path is full; what remains is the network's own capacity and loss",
    "receive_window": ("the receiver's window still limits: diagnose again and apply "
                       "`wanprobe tune plan --host peer` on the receiving host (its tcp_rmem), "
                       "or spread the transfer over parallel streams"),
    "send_buffer": ("this host's send buffer still limits: diagnose again and raise tcp_wmem "
                    "max here (`wanprobe tune plan --host local`)"),
    "congestion": ("loss or queueing on the path limits: use bbr with fq pacing and ask the "
                   "path owner about the loss"),
    "pacing": "a pacing rate below the path limits: remove or raise it",
    "host_cpu": ("a host's CPU set the rate (the verdict names the side): give the test more "
                 "cores (--cpus) or move other load off them, then measure again"),
}
STILL_HOST_LIMITED = ("receive_window", "send_buffer", "pacing", "host_cpu")


@dataclass(frozen=True)
class Verification:
    bits_per_second: float
    bits_per_second_after_omit: float | None
    omit_s: float
    verdict: str | None
    next_step: str
    cc: str | None = None

    @property
    def fixed(self) -> bool:
        return self.verdict not in STILL_HOST_LIMITED

    def to_json(self) -> dict[str, Any]:
        return {"bits_per_second": self.bits_per_second,
                "bits_per_second_after_omit": self.bits_per_second_after_omit,
                "omit_s": self.omit_s, "verdict": self.verdict, "fixed": self.fixed,
                "next_step": self.next_step, "cc": self.cc}


def rate_after_omit_bps(intervals: Sequence[Mapping[str, Any]], omit_s: float) -> float | None:
    """Received bits per second over the intervals that start at or after ``omit_s``."""
    kept = [i for i in intervals if i.get("start_s", 0.0) >= omit_s - 1e-9]
    secs = sum(i["end_s"] - i["start_s"] for i in kept)
    if not kept or secs <= 0:
        return None
    return sum(i["bytes_received"] for i in kept) * 8 / secs


def judge(result: Mapping[str, Any], omit_s: float) -> Verification:
    """Pure: a throughput result JSON → what the tuning achieved and the next step."""
    verdict = (result.get("limited_by") or {}).get("verdict")
    return Verification(
        bits_per_second=float(result.get("bits_per_second") or 0.0),
        bits_per_second_after_omit=rate_after_omit_bps(result.get("intervals") or [], omit_s),
        omit_s=omit_s, verdict=verdict,
        next_step=NEXT_STEP.get(verdict or "", "re-run `wanprobe diagnose` to see the limit"),
        cc=result.get("cc"))


def verify_path(peer: str, *, port: int = 862, duration_s: float = 6.0, omit_s: float = 2.0,
                max_bytes: int = 2**30, hmac_key: bytes | None = None) -> Verification:
    """Measure this host → ``peer`` again (one stream, capped) and judge it."""
    from wanprobe.throughput.client import run_throughput

    res = run_throughput(peer, port=port, duration_s=duration_s, max_bytes=max_bytes,
                         interval_s=0.5, hmac_key=hmac_key)
    return judge(res.to_json(), omit_s)
