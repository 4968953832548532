"""A report as the impact model's input: one :class:`~wanprobe.models.impact_inputs.Candidate`.

The figures come typed from the report codec (``codec.parts_of``: ``measurements`` and
``host``), as every other reader of a report takes them; ``wanprobe impact`` also takes
hand-written partial reports (``peer``, ``measurements.path``, ``measurements.throughput``,
``host.sysctls``, optional ``plan``), so the document is not required to be whole. Used: the
path's p99 (and p50) RTT and loss ratio, the forward throughput, this host's ``tcp_rmem`` and
congestion control, the sysctl values the report's ``plan`` would set, and the rate a verified
tuning measured (``measurements.verify``: "tuned hosts" at that rate, not the model's). A missing or impossible figure is one ConfigError naming its key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from collectors.host_facts import parse_triple
from wanprobe.diagnose.host_inputs import Host
from wanprobe.diagnose.measured import Measured
from wanprobe.errors import ConfigError
from wanprobe.models.bdp import window_from_buffer_bytes
from wanprobe.models.impact import Path
from wanprobe.models.impact_inputs import Candidate
from wanprobe.report.codec import parts_of
from wanprobe.userfiles import json_objects

RTT_P99 = "measurements.path.rtt_ms.p99"
LOSS = "measurements.path.loss.ratio"
RATE = "measurements.throughput.bits_per_second"
RMEM = "host.sysctls.net.ipv4.tcp_rmem"
CC = "host.sysctls.net.ipv4.tcp_congestion_control"


def planned_settings(plan: Any) -> dict[str, str]:
    """sysctl knobs a report's ``plan`` would set (key → value), possibly empty: every object
    with a ``key`` and a ``value`` (one plan, or the demo's plans of both ends)."""
    return {str(k["key"]): str(k["value"]) for k in json_objects(plan)
            if "key" in k and "value" in k}


def candidate_from_report(doc: object, source: str, link_bps: float | None = None) -> Candidate:
    """Read one report document (whole or partial) through the typed parsers."""
    if not isinstance(doc, Mapping):
        raise ConfigError(f"report {source}: not a JSON object")
    return candidate(*parts_of(doc), _peer_name(doc.get("peer"), source), doc.get("plan"),
                     source, link_bps)


def candidate(measured: Measured, host: Host | None, name: str, plan: Any, source: str,
              link_bps: float | None = None) -> Candidate:
    """The candidate site of one report's typed parts. The path uses the p99 RTT (a synchronous
    step waits for its slowest round trips); the current per-flow rate is the measured throughput
    when present, otherwise the model's for the host's tcp_rmem and congestion control.
    ``link_bps`` (``--bandwidth``) is the capacity for "tuned" and "more bandwidth"; without it
    the measured rate stands in."""
    path = measured.path
    rtt_p99_ms = _positive(path.rtt_p99_ms if path else None, RTT_P99, source)
    loss = path.loss_ratio if path else None
    if loss is None or not 0 <= loss <= 1:
        raise ConfigError(f"report {source}: {LOSS} missing or not a ratio in [0, 1]: {loss!r}")
    rmem = host.tcp_rmem_bytes if host else None
    if rmem is None:
        raise ConfigError(f"report {source}: {RMEM} missing or not 'min default max'")
    cc = host.cc_current.strip() if host and host.cc_current else ""
    if not cc:
        raise ConfigError(f"report {source}: missing {CC}")
    bps = measured.throughput.bits_per_second if measured.throughput else None
    rate = None if bps is None else _positive(bps, RATE, source)
    if link_bps is None:
        if rate is None:
            raise ConfigError(f"report {source}: missing {RATE} (or give --bandwidth for the link "
                              "capacity)")
        link_bps = rate
    knobs = planned_settings(plan)
    tuned = parse_triple(knobs.get("net.ipv4.tcp_rmem"))
    if "net.ipv4.tcp_rmem" in knobs and tuned is None:
        raise ConfigError(f"report {source}: plan's net.ipv4.tcp_rmem is not 'min default max': "
                          f"{knobs['net.ipv4.tcp_rmem']!r}")
    p50 = path.rtt_p50_ms if path else None
    verify = measured.verify
    verified = None if verify is None else (verify.bits_per_second_after_omit
                                            or verify.bits_per_second)
    return Candidate(
        name, source,
        Path(rtt_s=rtt_p99_ms / 1e3, link_bps=float(link_bps), loss=loss, cc=cc,
             window_bytes=window_from_buffer_bytes(rmem[2]), flow_rate_bps=rate),
        None if p50 is None else p50 / 1e3, rate,
        window_from_buffer_bytes(tuned[2]) if tuned else None,
        knobs.get("net.ipv4.tcp_congestion_control"),
        verified if verified and verified > 0 else None)


def _peer_name(peer: Any, source: str) -> str:
    if peer is None:
        raise ConfigError(f"report {source}: missing peer")
    return str(peer.get("address", peer)) if isinstance(peer, Mapping) else str(peer)


def _positive(x: float | None, key: str, source: str) -> float:
    if x is None or not x > 0:
        raise ConfigError(f"report {source}: {key} missing or not a number > 0: {x!r}")
    return x
