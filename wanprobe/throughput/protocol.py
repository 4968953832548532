"""wanprobe throughput wire protocol (one TCP port, shared with the STAMP reflector's UDP port).

Every TCP connection starts with a 4-byte magic:
- ``WPTC`` control connection, then newline-delimited JSON objects, each with an ``op``:
  client ``hello{version, nonce}`` → server ``challenge{version, nonce, auth}`` | ``refused``;
  client ``<op>{..., mac}`` — the one gate (auth.py: HMAC-SHA-256 over both nonces and the
  request when the server holds a key) is passed before any op is dispatched; for op ``test``:
  ``test{test}`` → server ``accepted{cookie, limits, mac}`` | ``refused{error}``;
  client opens the data connections; server ``ready``; client ``start``; server streams
  ``interval{...}`` records for its own sockets; client ``udp_done{packets_sent}`` (UDP mode);
  server ``end{streams, cpu, udp}``.
- ``WPTD`` data connection: cookie (8 bytes), stream id (u16, big-endian), direction (u8:
  0 client→server, 1 server→client), then raw payload.
UDP test datagrams (sent to the same port number, from the ``udp_port`` the request names):
``WPTU``, cookie (8), sequence (u64), sender CLOCK_MONOTONIC ns (u64), padding.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass

from wanprobe.errors import ProbeError

VERSION = 2  # 2: hello/challenge/op handshake with HMAC challenge-response (auth.py)
MAGIC_CONTROL = b"WPTC"
MAGIC_DATA = b"WPTD"
MAGIC_UDP = b"WPTU"
COOKIE_BYTES = 8
_DATA_HEADER = struct.Struct("!4s8sHB")
_UDP_HEADER = struct.Struct("!4s8sQQ")
DATA_HEADER_BYTES = _DATA_HEADER.size
UDP_HEADER_BYTES = _UDP_HEADER.size
UP, DOWN = 0, 1  # client→server, server→client
MAX_LINE_BYTES = 4 * 2**20         # what the client accepts from the server (an ``end`` line)
MAX_REQUEST_LINE_BYTES = 16 * 2**10  # what the server accepts from a client: requests are small


@dataclass(frozen=True)
class TestRequest:
    """What the client asks the server to run (sent in ``hello``)."""

    duration_s: float
    streams: int = 1
    reverse: bool = False
    bidir: bool = False
    cc: str | None = None
    window_bytes: int | None = None
    dscp: int = 0
    pacing_rate_bps: float | None = None
    udp: bool = False
    udp_rate_bps: float | None = None
    udp_packet_bytes: int = 1400
    interval_s: float = 1.0
    max_bytes: int = 2**30
    # UDP: the client's source port, so the server can give the test a socket of its own
    # (udp_sink.py); a client that does not say is read through the reflector's socket
    udp_port: int | None = None

    def directions(self) -> list[int]:
        """Directions the test carries data in."""
        if self.bidir:
            return [UP, DOWN]
        return [DOWN] if self.reverse else [UP]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> TestRequest:
        """Build from a ``test`` body. Every field must already have its JSON type: a number
        is a JSON number (not ``"5"``, not ``true``), a flag a JSON boolean, an integer field
        an integer; unknown keys are ignored; a wrong type raises ProbeError (the server
        refuses the test). Ranges: limits.request_refusal."""
        if not isinstance(obj, dict):
            raise ProbeError("malformed test request: not an object")
        kw = {}
        for name, f in cls.__dataclass_fields__.items():
            if name not in obj:
                if name == "duration_s":
                    raise ProbeError("malformed test request: duration_s is required")
                continue
            kw[name] = _typed(name, obj[name], _FIELD_TYPES[name], f.default is None)
        return cls(**kw)


def _typed(name: str, value: object, kind: type, nullable: bool) -> object:
    """``value`` if it has the JSON type ``kind`` (bool is not a number here), else ProbeError."""
    if value is None and nullable:
        return None
    ok = (isinstance(value, bool) if kind is bool
          else isinstance(value, str) if kind is str
          else isinstance(value, int) and not isinstance(value, bool) if kind is int
          else isinstance(value, int | float) and not isinstance(value, bool))
    if not ok:
        want = {bool: "a boolean", str: "a string", int: "an integer", float: "a number"}[kind]
        raise ProbeError(f"malformed test request: {name} must be {want}, got "
                         f"{type(value).__name__} {str(value)[:20]!r}")
    return float(value) if kind is float else value


_FIELD_TYPES = {"duration_s": float, "streams": int, "reverse": bool, "bidir": bool, "cc": str,
                "window_bytes": int, "dscp": int, "pacing_rate_bps": float, "udp": bool,
                "udp_rate_bps": float, "udp_packet_bytes": int, "interval_s": float,
                "max_bytes": int, "udp_port": int}


def encode(op: str, **body) -> bytes:
    """One control message as a JSON line."""
    return (json.dumps({"op": op, **body}, separators=(",", ":")) + "\n").encode()


def decode(line: bytes) -> dict:
    """Parse one control line; ProbeError when it is not a JSON object with an ``op``."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        raise ProbeError("peer sent a malformed control message") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("op"), str):
        raise ProbeError("peer sent a malformed control message")
    return obj


def pack_data_header(cookie: bytes, stream_id: int, direction: int) -> bytes:
    return _DATA_HEADER.pack(MAGIC_DATA, cookie, stream_id, direction)


def unpack_data_header(raw: bytes) -> tuple[bytes, int, int]:
    """(cookie, stream id, direction) of a data connection's first bytes (after the magic check)."""
    magic, cookie, stream_id, direction = _DATA_HEADER.unpack(raw)
    if magic != MAGIC_DATA:
        raise ProbeError("not a wanprobe data connection")
    return cookie, stream_id, direction


def pack_udp_header(cookie: bytes, seq: int, send_ns: int) -> bytes:
    return _UDP_HEADER.pack(MAGIC_UDP, cookie, seq, send_ns)


def pack_udp_header_into(buf: bytearray, offset: int, cookie: bytes, seq: int,
                         send_ns: int) -> None:
    """Write one datagram's header at ``offset`` of ``buf`` (a GSO sender's many datagrams)."""
    _UDP_HEADER.pack_into(buf, offset, MAGIC_UDP, cookie, seq, send_ns)


def unpack_udp_header(data: bytes) -> tuple[bytes, int, int] | None:
    """(cookie, seq, send_ns) or None when the datagram is not a wanprobe UDP test datagram."""
    if len(data) < UDP_HEADER_BYTES or data[:4] != MAGIC_UDP:
        return None
    _, cookie, seq, send_ns = _UDP_HEADER.unpack_from(data)
    return cookie, seq, send_ns
