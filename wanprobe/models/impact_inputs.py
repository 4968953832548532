"""Turn diagnose reports into the :class:`~wanprobe.models.impact.Path` a step waits for.

Pure: takes the parsed JSON document. Keys read (report schema 1.x): ``peer``,
``measurements.path.rtt_ms.p99``, ``measurements.path.loss.ratio``,
``measurements.throughput.bits_per_second`` (optional), ``host.sysctls["net.ipv4.tcp_rmem"]``,
``host.sysctls["net.ipv4.tcp_congestion_control"]``, optional ``plan`` (knobs with ``key``/
``value``). A missing required key raises ConfigError naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from wanprobe.errors import ConfigError
from wanprobe.models.bdp import window_from_buffer_bytes
from wanprobe.models.impact import Path
from wanprobe.userfiles import json_objects

_MISSING = object()


def _get(doc: object, dotted: Sequence[str], source: str, *, required: bool = True):
    cur = doc
    for i, key in enumerate(dotted):
        if not isinstance(cur, dict) or key not in cur or cur[key] is None:
            if required:
                raise ConfigError(f"report {source}: missing {'.'.join(dotted[:i + 1])}")
            return _MISSING
        cur = cur[key]
    return cur


def _number(value: object, name: str, source: str, *, positive: bool = True) -> float:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"report {source}: {name} is not a number: {value!r}") from None
    if x != x or x < 0 or (positive and x == 0):
        raise ConfigError(f"report {source}: {name} must be {'> 0' if positive else '≥ 0'}, got {value!r}")
    return x


def rmem_max_bytes(value: str, source: str = "?") -> int:
    """Third field of ``net.ipv4.tcp_rmem`` ("4096 131072 6291456" → 6291456)."""
    fields = str(value).split()
    if len(fields) != 3 or not all(f.isdigit() for f in fields):
        raise ConfigError(f"report {source}: host.sysctls.net.ipv4.tcp_rmem is not 'min default max': {value!r}")
    return int(fields[2])


def planned_settings(doc: dict) -> dict[str, str]:
    """sysctl knobs a report's ``plan`` would set (key → value), possibly empty."""
    return {str(k["key"]): str(k["value"]) for k in json_objects(doc.get("plan"))
            if "key" in k and "value" in k}


@dataclass(frozen=True)
class Candidate:
    """One candidate site from a report: its name, its path now, and what its plan would set."""

    name: str
    source: str
    path: Path
    rtt_p50_s: float | None
    measured_bps: float | None
    tuned_window_bytes: float | None
    tuned_cc: str | None

    def to_json(self) -> dict:
        return {"name": self.name, "source": self.source, "rtt_p99_s": self.path.rtt_s,
                "rtt_p50_s": self.rtt_p50_s, "loss": self.path.loss, "cc": self.path.cc,
                "window_bytes": self.path.window_bytes, "measured_bps": self.measured_bps,
                "link_bps": self.path.link_bps, "tuned_window_bytes": self.tuned_window_bytes,
                "tuned_cc": self.tuned_cc}


def candidate_from_report(doc: object, source: str, link_bps: float | None = None) -> Candidate:
    """Read one report. The path uses the p99 RTT (a synchronous step waits for its slowest
    round trips); the current per-flow rate is the measured throughput when present, otherwise
    the model's for the host's tcp_rmem and congestion control. ``link_bps`` (``--bandwidth``)
    is the capacity for "tuned" and "more bandwidth"; without it the measured rate stands in.
    """
    if not isinstance(doc, dict):
        raise ConfigError(f"report {source}: not a JSON object")
    peer = _get(doc, ("peer",), source)
    name = str(peer.get("address", peer)) if isinstance(peer, dict) else str(peer)
    rtt_p99_ms = _number(_get(doc, ("measurements", "path", "rtt_ms", "p99"), source),
                         "measurements.path.rtt_ms.p99", source)
    p50 = _get(doc, ("measurements", "path", "rtt_ms", "p50"), source, required=False)
    loss = _number(_get(doc, ("measurements", "path", "loss", "ratio"), source),
                   "measurements.path.loss.ratio", source, positive=False)
    if loss > 1:
        raise ConfigError(f"report {source}: measurements.path.loss.ratio must be ≤ 1, got {loss!r}")
    rmem = rmem_max_bytes(_get(doc, ("host", "sysctls", "net.ipv4.tcp_rmem"), source), source)
    cc = str(_get(doc, ("host", "sysctls", "net.ipv4.tcp_congestion_control"), source)).strip()
    bps = _get(doc, ("measurements", "throughput", "bits_per_second"), source, required=False)
    measured = None if bps is _MISSING else _number(bps, "measurements.throughput.bits_per_second", source)
    if link_bps is None:
        if measured is None:
            raise ConfigError(f"report {source}: missing measurements.throughput.bits_per_second "
                              "(or give --bandwidth for the link capacity)")
        link_bps = measured
    plan = planned_settings(doc)
    tuned_window = (window_from_buffer_bytes(rmem_max_bytes(plan["net.ipv4.tcp_rmem"], source))
                    if "net.ipv4.tcp_rmem" in plan else None)
    path = Path(rtt_s=rtt_p99_ms / 1e3, link_bps=float(link_bps), loss=loss, cc=cc,
                window_bytes=window_from_buffer_bytes(rmem), flow_rate_bps=measured)
    return Candidate(name, source, path,
                     None if p50 is _MISSING else _number(p50, "rtt_ms.p50", source) / 1e3,
                     measured, tuned_window, plan.get("net.ipv4.tcp_congestion_control"))


def slowest(candidates: Sequence[Candidate]) -> Path:
    """The path a job spanning all candidates waits for: the worst p99 RTT, the lowest loss-free
    capacity and the slowest peer's per-flow rate, the highest loss."""
    if not candidates:
        raise ConfigError("no report given")
    worst = min(candidates, key=lambda c: c.path.flow_rate(1))
    return Path(rtt_s=max(c.path.rtt_s for c in candidates),
                link_bps=min(c.path.link_bps for c in candidates),
                loss=max(c.path.loss for c in candidates), cc=worst.path.cc,
                window_bytes=worst.path.window_bytes, flow_rate_bps=worst.path.flow_rate(1),
                mss_bytes=worst.path.mss_bytes)
