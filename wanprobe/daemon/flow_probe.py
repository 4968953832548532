"""The daemon's multi-flow STAMP sessions (a peer's ``flows`` > 1; probe/multiflow.py).

Each peer keeps the same K source ports from session to session, so each flow stays on its ECMP
path and per-path results are comparable over time. The ports are traced on the first session,
every ``TRACE_EVERY`` sessions and when asked (a path event); in between the last hop lists are
reused (same ports, same paths unless the route changed, which the next trace shows). Traces in
the daemon are short (few retries): a silent hop stays ``None``, never loss. If the ports cannot be
bound again, fresh ones are picked next session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wanprobe.daemon.config import Peer, ProbeSettings
from wanprobe.errors import ProbeError
from wanprobe.probe.flowtrace import FlowTrace
from wanprobe.probe.path_groups import agrees

TRACE_EVERY = 6
TRACE_TRIES = 3
TRACE_WAIT_S = 0.5


@dataclass
class _FlowState:
    traces: list[FlowTrace] = field(default_factory=list)
    previous_hops: list[list] | None = None   # the last traced hop lists that differed
    sessions: int = 0
    force_trace: bool = False


_STATE: dict[str, _FlowState] = {}


def request_trace(peer: str) -> None:
    """Trace the peer's flows on its next session (e.g. after a path event)."""
    _STATE.setdefault(peer, _FlowState()).force_trace = True


def hop_lists(peer: str) -> tuple[list[list] | None, list[list] | None]:
    """(previous distinct, current) hop lists of the peer's flows, when traced."""
    st = _STATE.get(peer)
    if st is None or not st.traces:
        return None, None
    return st.previous_hops, [list(t.hops) for t in st.traces]


def forget(peer: str) -> None:
    _STATE.pop(peer, None)


async def probe(peer: Peer, s: ProbeSettings, *, hmac_key: bytes | None = None) -> dict[str, Any]:
    """One session of ``s.count`` STAMP packets spread over ``peer.flows`` source ports."""
    import socket

    from wanprobe.probe.multiflow import probe_flows
    from wanprobe.probe.peer import resolve_peer

    family, addr = await resolve_peer(peer.address)
    if family != socket.AF_INET:
        raise ProbeError(f"{peer.name}: flows > 1 needs an IPv4 peer")
    st = _STATE.setdefault(peer.name, _FlowState())
    if len(st.traces) != peer.flows:
        st.traces = []
    trace = not st.traces or st.force_trace or st.sessions % TRACE_EVERY == 0
    st.sessions += 1
    try:
        flows, doc = await probe_flows(
            addr, peer.port, flows=peer.flows, count=s.count, interval_s=s.packet_interval_s,
            timeout_s=s.timeout_s, src_ports=[t.src_port for t in st.traces] or None,
            trace=trace, known=None if trace else st.traces, trace_tries=TRACE_TRIES,
            trace_wait_s=TRACE_WAIT_S, hmac_key=hmac_key)
    except (ProbeError, OSError):
        st.traces = []   # e.g. a port was taken meanwhile: pick fresh ones next time
        raise
    if trace:
        new = [f.trace for f in flows]
        old = [list(t.hops) for t in st.traces]
        # a silent hop (None) is no change; a different known hop or length is
        if old and not all(agrees(a, b.hops) for a, b in zip(old, new, strict=True)):
            st.previous_hops = old
        st.traces = new
        st.force_trace = False
    return doc
