"""The ``host_facts`` control op: the far end describes itself, read-only, from its collectors.

Wire (protocol.py control channel): client sends ``WPTC`` then ``{"op":"host_facts"}``; the server
answers one line ``{"op":"host_facts", ...HostFacts JSON}`` and closes. An older wanprobe answers
``refused`` (it only knows ``hello``); a plain STAMP reflector has no TCP port at all. Both are
reported as "the peer cannot describe itself", never as a crash.

The reply reveals configuration, not secrets; once the control channel is authenticated (the
HMAC gate in server.py) it is only served to clients that passed it.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from collectors.host_facts import FactsError, HostFacts, read_host_facts
from wanprobe.errors import ProbeError
from wanprobe.throughput import protocol as proto

OP = "host_facts"
_TIMEOUT_S = 5.0
_MAX_REPLY_BYTES = 64 * 1024


async def reply(peer_ip: str, proc_root: Path = Path("/proc")) -> bytes:
    """The server's answer for a client at ``peer_ip`` (facts of the interface toward it)."""
    loop = asyncio.get_running_loop()
    try:
        facts = await loop.run_in_executor(None, lambda: read_host_facts(peer_ip,
                                                                         proc_root=proc_root))
    except Exception as exc:  # a collector failure is the client's "not known", not a crash
        return proto.encode("refused", error=f"host facts unavailable: {type(exc).__name__}")
    return proto.encode(OP, **facts.to_json())


def fetch(peer: str, port: int, *, timeout_s: float = _TIMEOUT_S) -> HostFacts:
    """Ask ``peer`` for its host facts; ProbeError with a plain reason when it cannot answer."""
    try:
        sock = socket.create_connection((peer, port), timeout=timeout_s)
    except OSError as exc:
        raise ProbeError(f"peer {peer} port {port} has no wanprobe control channel "
                         f"({exc.strerror or exc}): not a wanprobe reflector, or another STAMP "
                         "reflector") from None
    with sock:
        try:
            sock.sendall(proto.MAGIC_CONTROL + proto.encode(OP))
            line = sock.makefile("rb").readline(_MAX_REPLY_BYTES)
        except OSError as exc:
            raise ProbeError(f"peer {peer} closed the control channel ({exc})") from None
    if not line:
        raise ProbeError(f"peer {peer} sent no host facts (closed the connection)")
    msg = proto.decode(line)
    if msg.get("op") != OP:
        raise ProbeError(f"peer {peer} sent no host facts (an older wanprobe?): "
                         f"{msg.get('error') or msg.get('op')}")
    try:
        return HostFacts.from_json({k: v for k, v in msg.items() if k != "op"})
    except FactsError as exc:
        raise ProbeError(f"peer {peer} sent malformed host facts: {exc}") from None
