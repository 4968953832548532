"""The one gate in front of every throughput control operation: version, nonces, HMAC.

Server side, ``read_request`` runs hello → challenge → the client's op line and returns the op
only once it is authenticated (when the server holds a key); every op the server dispatches
(``test`` today, any later one such as ``host_facts``) comes out of it, so none can be reached
around it. Client side, ``client_request`` is the mirror image. Wire format and MAC: auth.py.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass

from wanprobe.errors import AuthRefused, PeerLimit, ProbeError
from wanprobe.throughput import auth
from wanprobe.throughput import protocol as proto


class Refused(Exception):
    """The server turns the connection down: ``reason`` is the metrics label, the message the
    one line the client sees."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Session:
    """One authenticated control connection (``key`` None: the server holds no key)."""

    client_nonce: bytes
    server_nonce: bytes
    key: bytes | None

    def sign(self, msg: dict) -> dict:
        """``msg`` with the server's proof that it holds the key (auth.sign_accept)."""
        if self.key is None:
            return msg
        return auth.sign_accept(self.key, self.server_nonce, self.client_nonce, msg)


async def _line(reader: asyncio.StreamReader) -> dict:
    try:
        line = await reader.readline()
    except ValueError:  # LimitOverrunError: the StreamReader dropped what it had buffered
        raise Refused("line_too_long", "control line longer than "
                      f"{proto.MAX_REQUEST_LINE_BYTES} bytes") from None
    if not line:
        raise ConnectionError("client closed the control connection")
    try:
        return proto.decode(line)
    except ProbeError:
        raise Refused("malformed", "malformed control message (expected one JSON object)") from None


async def read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       key: bytes | None) -> tuple[Session, dict]:
    """hello → challenge → one op line; returns (session, op message) or raises Refused."""
    hello = await _line(reader)
    if hello["op"] != "hello":
        raise Refused("malformed", f"expected hello, got {hello['op'][:32]!r}")
    version = hello.get("version")
    if version != proto.VERSION:
        shown = version if isinstance(version, int) else "?"
        raise Refused("old_protocol", f"client speaks throughput protocol v{shown}, this server "
                      f"v{proto.VERSION}: run the same wanprobe version on both ends")
    client_nonce = auth.parse_nonce(hello.get("nonce"))
    if client_nonce is None:
        raise Refused("malformed", "hello without a 16-octet hex nonce")
    server_nonce = bytes.fromhex(auth.new_nonce())
    writer.write(proto.encode("challenge", version=proto.VERSION, nonce=server_nonce.hex(),
                              auth=key is not None))
    await writer.drain()
    msg = await _line(reader)
    if key is not None:
        if "mac" not in msg:
            raise Refused("unauthenticated", "this reflector requires authentication: give the "
                          "shared key with --hmac-key-file")
        if not auth.verify_request(key, server_nonce, client_nonce, msg):
            raise Refused("bad_key", "authentication failed (wrong key, or a replayed request)")
    return Session(client_nonce, server_nonce, key), msg


AUTH_REASONS = frozenset({"unauthenticated", "bad_key", "not_allowed"})
LIMIT_REASONS = frozenset({"over_limit", "busy", "quota", "disabled", "dscp"})


def refusal_error(reply: dict, message: str) -> ProbeError | AuthRefused | PeerLimit:
    """The error of a server's ``refused`` line, by its ``reason``: authentication (exit 7) and
    limits (exit 8) are not "peer unreachable" (exit 5)."""
    reason = reply.get("reason")
    if reason in AUTH_REASONS:
        return AuthRefused(message)
    if reason in LIMIT_REASONS:
        return PeerLimit(message)
    return ProbeError(message)


def client_request(sock: socket.socket, readline: Callable[[str], dict], peer: str,
                   key: bytes | None, op: str, body: dict) -> dict:
    """Run the handshake on a connected control socket, send ``op`` with ``body`` and return
    the server's verified reply (``refused`` replies become ProbeError, one line)."""
    client_nonce = bytes.fromhex(auth.new_nonce())
    sock.sendall(proto.MAGIC_CONTROL + proto.encode("hello", version=proto.VERSION,
                                                    nonce=client_nonce.hex()))
    challenge = readline("challenge")
    if challenge["op"] == "refused":
        error = str(challenge.get("error"))[:200]
        hint = (" (it runs an older wanprobe, throughput protocol v1: upgrade it)"
                if error == "unsupported protocol version" else "")
        raise refusal_error(challenge, f"{peer} refused the connection: {error}{hint}")
    server_nonce = auth.parse_nonce(challenge.get("nonce"))
    if challenge["op"] != "challenge" or server_nonce is None:
        raise ProbeError(f"{peer}: unexpected reply {str(challenge['op'])[:32]!r} to hello "
                         "(not a wanprobe reflector?)")
    if key is not None and challenge.get("auth") is not True:
        raise AuthRefused(f"{peer} does not authenticate throughput tests (no key set there) but "
                         "--hmac-key-file was given: not testing against an unauthenticated server")
    msg = {"op": op, **body}
    if key is not None:
        msg = auth.sign_request(key, server_nonce, client_nonce, msg)
    sock.sendall(proto.encode(op, **{k: v for k, v in msg.items() if k != "op"}))
    reply = readline("reply")
    if reply["op"] == "refused":
        raise refusal_error(reply, f"{peer} refused the {op}: {str(reply.get('error'))[:200]}")
    if key is not None and not auth.verify_accept(key, server_nonce, client_nonce, reply):
        raise AuthRefused(f"{peer} did not prove it holds the shared key (its reply's MAC is wrong)")
    return reply
