"""The daemon's multi-flow STAMP sessions (a peer's ``flows`` > 1; probe/multiflow.py).

Each peer keeps the same K source ports from session to session, so each flow stays on its ECMP
path and per-path results are comparable over time. The ports are traced on the first session,
every ``TRACE_EVERY`` sessions and when asked (a path event), after the session's STAMP packets;
in between the last hop lists are reused (same ports, same paths unless the route changed, which
the next trace shows). Traces in the daemon are short (few retries within the session's
deadline): a silent hop stays ``None``, never loss. If the ports cannot be bound again, fresh
ones are picked next session.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from wanprobe.daemon.config import ProbeSettings
from wanprobe.daemon.scheduler import session_deadline_s
from wanprobe.errors import ProbeError
from wanprobe.mesh.peer import Peer
from wanprobe.probe.flowtrace import FlowTrace
from wanprobe.probe.path_groups import agrees
from wanprobe.services import measure

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


async def probe_peer(peer: Peer, method: str, s: ProbeSettings, *,
                     hmac_key: bytes | None = None) -> dict[str, Any]:
    """The daemon's probe session of ``peer``: over its ``flows`` (> 1, STAMP) here, else one
    session through the measure service."""
    if method == "stamp" and peer.flows > 1:
        return await probe(peer, s, hmac_key=hmac_key)
    return await measure.probe(peer, method, s, hmac_key=hmac_key)


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
    """One session of ``s.count`` STAMP packets spread over ``peer.flows`` source ports; when a
    trace is due it runs after the STAMP phase on the same ports, in what is left of the
    scheduler's session deadline (so the session is never cut short by its own trace)."""
    import socket

    from wanprobe.probe.multiflow import multiflow_doc, probe_flows
    from wanprobe.probe.paths import FlowResult, trace_ports
    from wanprobe.probe.peer import resolve_peer

    t0 = time.monotonic()
    family, addr = await resolve_peer(peer.address)
    if family != socket.AF_INET:
        raise ProbeError(f"{peer.name}: flows > 1 needs an IPv4 peer")
    st = _STATE.setdefault(peer.name, _FlowState())
    if len(st.traces) != peer.flows:
        st.traces = []
    due = not st.traces or st.force_trace or st.sessions % TRACE_EVERY == 0
    st.sessions += 1
    try:
        flows, doc = await probe_flows(
            addr, peer.port, flows=peer.flows, count=s.count, interval_s=s.packet_interval_s,
            timeout_s=s.timeout_s, src_ports=[t.src_port for t in st.traces] or None,
            trace=False, known=st.traces or None, hmac_key=hmac_key)
    except (ProbeError, OSError):
        st.traces = []   # e.g. a port was taken meanwhile: pick fresh ones next time
        raise
    budget = session_deadline_s(s) - (time.monotonic() - t0) - 0.3
    if not (due and budget > 0.1 * TRACE_TRIES):
        if not st.traces:   # untraced ports: keep them, trace next time
            st.traces = [f.trace for f in flows]
        return doc
    ports = [f.trace.src_port for f in flows]
    try:
        new = await trace_ports(addr, peer.port, ports, tries=TRACE_TRIES,
                                wait_s=min(TRACE_WAIT_S, 0.8 * budget / TRACE_TRIES))
    except ProbeError:
        return doc
    old = [list(t.hops) for t in st.traces]
    # a silent hop (None) is no change; a different known hop or length is
    if any(old) and not all(agrees(a, b.hops) for a, b in zip(old, new, strict=True)):
        st.previous_hops = old
    st.traces = new
    st.force_trace = False
    return multiflow_doc([FlowResult(t, f.probe) for t, f in zip(new, flows, strict=True)],
                         s.packet_interval_s)
