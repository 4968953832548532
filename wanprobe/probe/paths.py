"""``wanprobe paths``: N flows with distinct, constant source ports (Paris-traceroute style).

Phase 1 traces every flow's hops (flowtrace.py) from the UDP port it will probe from; phase 2
runs one STAMP session per flow from that same port (sender.py, one socket per flow, all on one
event loop, starts staggered by interval/N), so its RTT and loss per direction belong to the
path its hop list names. path_groups.py groups the flows into paths and tests whether they
differ. The hop list is the forward path; replies hash on their own at every router, so a
flow's reverse loss belongs to a return path the hop list does not show. An ECMP/LAG hash sees the same 5-tuple in both phases (NetNORAD probes from many source
ports for the same reason; fleet-multipath.md §3).
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

from wanprobe.errors import ProbeError, UsageError
from wanprobe.probe.flowtrace import FlowTrace, open_flow_sockets, trace_flows
from wanprobe.probe.loss_split import share_tails
from wanprobe.probe.path_groups import ALPHA, FlowSample, summarize
from wanprobe.probe.peer import resolve_peer
from wanprobe.probe.result import ProbeResult
from wanprobe.probe.sender import STAMP_PORT, StampSender

MAX_FLOWS = 256


@dataclass(frozen=True)
class FlowResult:
    """One flow: its hop list and its own STAMP session."""

    trace: FlowTrace
    probe: ProbeResult

    def sample(self) -> FlowSample:
        return FlowSample(self.trace.src_port, self.trace.hops, self.probe.loss,
                          self.probe.rtt_samples_ms)

    def to_json(self, path: int) -> dict:
        doc = self.probe.to_json()
        return {**self.trace.to_json(), "path": path, "rtt_ms": doc["rtt_ms"], "loss": doc["loss"],
                "jitter_ms": doc["jitter_ms"]}


@dataclass(frozen=True)
class PathsResult:
    peer: str
    port: int
    flows: tuple[FlowResult, ...]
    alpha: float = ALPHA

    def to_json(self) -> dict:
        index, summary = summarize([f.sample() for f in self.flows], self.alpha)
        return {"peer": self.peer, "port": self.port,
                "flows": [f.to_json(p) for f, p in zip(self.flows, index, strict=True)],
                "summary": summary}


def check_args(flows: int, count: int, interval_s: float, max_ttl: int) -> None:
    if not 1 <= flows <= MAX_FLOWS:
        raise UsageError(f"--flows must be 1-{MAX_FLOWS}, got {flows}")
    if count < 1:
        raise UsageError(f"--count must be >= 1, got {count}")
    if interval_s <= 0:
        raise UsageError("--interval must be > 0")
    if not 1 <= max_ttl <= 64:
        raise UsageError(f"--max-ttl must be 1-64, got {max_ttl}")


async def trace_ports(addr: str, port: int, src_ports: list[int], *, max_ttl: int = 16,
                      tries: int = 12, wait_s: float = 1.0) -> list[FlowTrace]:
    """Phase 1 from ``src_ports`` (0: a fresh ephemeral port). Sockets are made in the caller's
    thread (and network namespace); the blocking trace runs in a worker thread."""
    try:
        socks = open_flow_sockets(src_ports)
    except OSError as exc:
        raise ProbeError(f"cannot open UDP sockets for {len(src_ports)} flows: "
                         f"{exc.strerror}") from None
    try:
        return await asyncio.to_thread(trace_flows, addr, port, socks, max_ttl=max_ttl,
                                       tries=tries, wait_s=wait_s)
    finally:
        for s in socks:
            s.close()


async def probe_ports(addr: str, port: int, ports: list[int], *, count: int, interval_s: float,
                      timeout_s: float = 2.0, hmac_key=None) -> list[ProbeResult]:
    """Phase 2: one STAMP session per source port, starts spread over one interval (with
    ``hmac_key`` in authenticated mode, RFC 8762 §4.4); the flows share the reflector's rate
    limit, so their tails are judged together (loss_split.share_tails)."""
    senders = [StampSender(socket.AF_INET, source_port=p) for p in ports]

    async def one(k: int, sender: StampSender) -> ProbeResult:
        await asyncio.sleep(k * interval_s / len(senders))
        return await sender.run(addr, port, count=count, interval_s=interval_s,
                                timeout_s=timeout_s, hmac_key=hmac_key)

    try:
        for s in senders:
            s.open()
        return share_tails(list(await asyncio.gather(*(one(k, s) for k, s in enumerate(senders)))))
    except OSError as exc:
        raise ProbeError(f"cannot probe from the traced ports: {exc.strerror}") from None
    finally:
        for s in senders:
            s.close()


async def measure_paths(peer: str, *, flows: int = 16, count: int = 100, interval_s: float = 0.1,
                        port: int = STAMP_PORT, timeout_s: float = 2.0, max_ttl: int = 16,
                        trace_tries: int = 12, trace_wait_s: float = 1.0,
                        src_ports: list[int] | None = None, hmac_key=None) -> PathsResult:
    """Trace and probe ``flows`` flows to ``peer`` (IPv4), from ``src_ports`` when given (one
    per flow) or from ephemeral ports, the STAMP sessions authenticated with ``hmac_key`` (RFC
    8762 §4.4; the trace's TTL-limited probes stay unsigned); see the module docstring."""
    if src_ports is not None:
        if len(set(src_ports)) != len(src_ports) or not all(1 <= p <= 65535 for p in src_ports):
            raise UsageError("source ports must be distinct and within 1-65535")
        flows = len(src_ports)
    check_args(flows, count, interval_s, max_ttl)
    family, addr = await resolve_peer(peer)
    if family != socket.AF_INET:
        raise UsageError("paths traces IPv4 peers only (IP_RECVERR offender parsing is v4)")
    traces = await trace_ports(addr, port, src_ports or [0] * flows, max_ttl=max_ttl, tries=trace_tries,
                               wait_s=trace_wait_s)
    results = await probe_ports(addr, port, [t.src_port for t in traces], count=count,
                                interval_s=interval_s, timeout_s=timeout_s, hmac_key=hmac_key)
    return PathsResult(peer, port, tuple(FlowResult(t, r) for t, r in
                                         zip(traces, results, strict=True)))
