"""The ``host_facts`` control op: the far end describes itself, read-only, from its collectors.

Wire (protocol.py control channel): after the gate's hello/challenge (gate.py; with a key the
request is signed and the reply carries the server's MAC), the client sends ``{"op":"host_facts"}``
and the server answers one line ``{"op":"host_facts", ...HostFacts JSON}`` and closes. An older wanprobe answers
``refused`` (it only knows ``hello``); a plain STAMP reflector has no TCP port at all. Both are
reported as "the peer cannot describe itself", never as a crash.

The reply reveals configuration, not secrets; with a key set it is only served to clients that
passed the HMAC gate, like every other op.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from collectors.host_facts import FactsError, HostFacts, read_host_facts
from wanprobe.errors import ProbeError
from wanprobe.throughput import protocol as proto
from wanprobe.throughput.gate import Session, client_request

OP = "host_facts"
_TIMEOUT_S = 5.0
_MAX_REPLY_BYTES = 64 * 1024


async def serve(session: Session, msg: dict, reader, writer, client: str,
                proc_root: Path = Path("/proc")) -> None:
    """The server's op handler (reached only through the gate, server.py): the facts of the
    interface toward ``client``, signed with the session's key when the server has one."""
    loop = asyncio.get_running_loop()
    try:
        facts = await loop.run_in_executor(None, lambda: read_host_facts(client,
                                                                         proc_root=proc_root))
    except Exception as exc:  # a collector failure is the client's "not known", not a crash
        writer.write(proto.encode("refused", error=f"host facts unavailable: {type(exc).__name__}"))
        return
    writer.write(proto.encode(**session.sign({"op": OP, **facts.to_json()})))
    await writer.drain()


def fetch(peer: str, port: int, *, hmac_key: bytes | None = None,
          timeout_s: float = _TIMEOUT_S) -> HostFacts:
    """Ask ``peer`` for its host facts through the control gate (authenticated with
    ``hmac_key``); ProbeError with a plain reason when it cannot answer."""
    try:
        sock = socket.create_connection((peer, port), timeout=timeout_s)
    except OSError as exc:
        raise ProbeError(f"peer {peer} port {port} has no wanprobe control channel "
                         f"({exc.strerror or exc}): not a wanprobe reflector, or another STAMP "
                         "reflector") from None
    with sock:
        rfile = sock.makefile("rb")

        def readline(what: str) -> dict:
            try:
                line = rfile.readline(_MAX_REPLY_BYTES)
            except OSError as exc:
                raise ProbeError(f"peer {peer} closed the control channel ({exc})") from None
            if not line:
                raise ProbeError(f"peer {peer} sent no host facts (closed the connection "
                                 f"waiting for its {what})")
            return proto.decode(line)

        try:
            msg = client_request(sock, readline, peer, hmac_key, OP, {})
        except OSError as exc:
            raise ProbeError(f"peer {peer} closed the control channel ({exc})") from None
        except ProbeError as exc:  # refused: an older wanprobe, a wrong key (its exit code), a limit
            raise type(exc)(f"peer {peer} sent no host facts ({exc})") from None
    if msg.get("op") != OP:
        raise ProbeError(f"peer {peer} sent no host facts (an older wanprobe?): "
                         f"{str(msg.get('error') or msg.get('op'))[:120]}")
    try:
        return HostFacts.from_json({k: v for k, v in msg.items() if k not in ("op", "mac")})
    except FactsError as exc:
        raise ProbeError(f"peer {peer} sent malformed host facts: {exc}") from None
