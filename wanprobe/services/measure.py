"""The measure service: one probe session or one capped throughput test against a configured
peer (its address and port, as in ``mesh.peer.Peer``) with the configured settings,
returned as its report JSON (``to_json()``). With a key, STAMP runs in authenticated mode
(RFC 8762 §4.4) and the throughput control channel proves it holds the key
(throughput/gate.py), as the peers' reflectors ask when they share it. The daemon's scheduler
takes these as injectable functions (fakes in its tests); a peer probed over several ECMP flows
goes through daemon/flow_probe.py, which keeps per-peer state between sessions."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from wanprobe.errors import ProbeError


class Peer(Protocol):
    """Where the far end listens (``mesh.peer.Peer`` is one)."""

    address: str
    port: int


class ProbeSettings(Protocol):
    """One probe session (``daemon.config.ProbeSettings`` is one)."""

    count: int
    packet_interval_s: float
    timeout_s: float
    dscp: int


class ThroughputSettings(Protocol):
    """One capped throughput test (``daemon.config.ThroughputSettings`` is one)."""

    duration_s: float
    streams: int
    max_bytes_per_test: int


async def probe(peer: Peer, method: str, s: ProbeSettings, *,
                hmac_key: bytes | None = None) -> dict[str, Any]:
    """Run one probe session of ``method`` against ``peer`` (one flow)."""
    from wanprobe.probe.api import METHODS

    fn = METHODS.get(method)
    if fn is None:
        raise ProbeError(f"unknown probe method {method!r} (use {', '.join(METHODS)})")
    kwargs: dict[str, Any] = {"count": s.count, "interval_s": s.packet_interval_s,
                              "timeout_s": s.timeout_s}
    if method == "stamp":
        kwargs.update(port=peer.port, dscp=s.dscp)
        if hmac_key is not None:
            kwargs["hmac_key"] = hmac_key
    elif method == "tcp":
        kwargs.update(port=peer.port)
    result = await fn(peer.address, **kwargs)
    loss = result.loss
    if loss.reflector_session_refused and not loss.received:
        from wanprobe.probe.peer import session_refused

        # its reflector refused the session (issue 37): a failure, never a session of loss
        raise session_refused(peer.address, peer.port, loss.reflector_session_refused, loss.sent)
    return result.to_json()


def throughput(peer: Peer, s: ThroughputSettings, *,
               hmac_key: bytes | None = None) -> dict[str, Any]:
    """Run one capped throughput test against the server beside ``peer``'s reflector (same
    port); blocking, the scheduler runs it in a worker thread."""
    from wanprobe.diagnose.throughput_verdict import JUDGE
    from wanprobe.throughput.client import run_throughput

    result = run_throughput(peer.address, port=peer.port, duration_s=s.duration_s,
                            streams=s.streams, max_bytes=s.max_bytes_per_test, hmac_key=hmac_key,
                            judge=JUDGE)
    return result.to_json()


R = TypeVar("R")


def with_key(fn: Callable[..., R], hmac_key: bytes | None) -> Callable[..., R]:
    """``fn`` (:func:`probe`, :func:`throughput` or the daemon's ``probe_peer``) bound to the
    daemon's shared key; ``fn`` itself when there is none."""
    return fn if hmac_key is None else functools.partial(fn, hmac_key=hmac_key)
