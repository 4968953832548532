"""Library entry points for the CLI, the daemon and diagnose: one call per probe method."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from wanprobe.errors import UsageError
from wanprobe.probe.icmp import probe_icmp
from wanprobe.probe.result import ProbeResult
from wanprobe.probe.sender import probe_stamp
from wanprobe.probe.tcp_connect import probe_tcp

# each method takes the peer and its own keywords (``probe`` passes them through)
METHODS: dict[str, Callable[..., Awaitable[ProbeResult]]] = {"stamp": probe_stamp, "icmp": probe_icmp, "tcp": probe_tcp}


async def probe(peer: str, method: str = "stamp", **kw) -> ProbeResult:
    """Run the probe ``method`` (stamp, icmp, tcp) against ``peer`` in the running loop."""
    fn = METHODS.get(method)
    if fn is None:
        raise UsageError(f"unknown probe method {method!r} (use stamp, icmp or tcp)")
    if method != "stamp":
        if kw.pop("hmac_key", None) is not None:
            raise UsageError("an HMAC key (authenticated STAMP) needs --method stamp")
    if method == "icmp":
        kw.pop("port", None)
    return await fn(peer, **kw)


def run_probe(peer: str, method: str = "stamp", **kw) -> ProbeResult:
    """Synchronous wrapper: runs its own event loop (do not call from inside one)."""
    return asyncio.run(probe(peer, method, **kw))
