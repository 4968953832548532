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
UDP test datagrams (sent to the same port number): ``WPTU``, cookie (8), sequence (u64),
sender CLOCK_MONOTONIC ns (u64), padding.
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

    def directions(self) -> list[int]:
        """Directions the test carries data in."""
        if self.bidir:
            return [UP, DOWN]
        return [DOWN] if self.reverse else [UP]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> TestRequest:
        """Build from a ``hello`` body with every field coerced to its type; unknown keys are
        ignored; a value of the wrong type raises ProbeError (the server refuses the test)."""
        def opt(conv, key):
            return None if obj.get(key) is None else conv(obj[key])

        try:
            if not isinstance(obj, dict):
                raise TypeError("not an object")
            d = cls.__dataclass_fields__
            req = cls(
                duration_s=float(obj["duration_s"]),
                streams=int(obj.get("streams", d["streams"].default)),
                reverse=bool(obj.get("reverse", False)), bidir=bool(obj.get("bidir", False)),
                cc=opt(str, "cc"), window_bytes=opt(int, "window_bytes"),
                dscp=int(obj.get("dscp", 0)), pacing_rate_bps=opt(float, "pacing_rate_bps"),
                udp=bool(obj.get("udp", False)), udp_rate_bps=opt(float, "udp_rate_bps"),
                udp_packet_bytes=int(obj.get("udp_packet_bytes", d["udp_packet_bytes"].default)),
                interval_s=float(obj.get("interval_s", d["interval_s"].default)),
                max_bytes=int(obj.get("max_bytes", d["max_bytes"].default)))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ProbeError(f"malformed test request: {str(exc)[:80]}") from None
        return req  # ranges: limits.request_refusal


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


def unpack_udp_header(data: bytes) -> tuple[bytes, int, int] | None:
    """(cookie, seq, send_ns) or None when the datagram is not a wanprobe UDP test datagram."""
    if len(data) < UDP_HEADER_BYTES or data[:4] != MAGIC_UDP:
        return None
    _, cookie, seq, send_ns = _UDP_HEADER.unpack_from(data)
    return cookie, seq, send_ns
