"""Throughput test server that `wanprobe reflect` runs beside the STAMP reflector.

Interface contract (filled in by the throughput work):
- ``ThroughputServer(max_duration_s=..., max_bytes=...)``
- ``await server.start(host, port)`` listens on TCP ``port`` (sink/source + control);
- ``server.udp_tap(data, addr, rx_ns) -> bool`` is offered every UDP datagram the reflector's
  socket receives first; it returns True when the datagram belongs to a UDP throughput test
  (registered over the TCP control connection) and was consumed, False to let STAMP handle it;
- ``await server.close()``.
"""

from __future__ import annotations


class ThroughputServer:
    """Placeholder: accepts no tests until the throughput work lands."""

    def __init__(self, *, max_duration_s: float = 60.0, max_bytes: int = 10 * 2**30) -> None:
        self.max_duration_s = max_duration_s
        self.max_bytes = max_bytes

    async def start(self, host: str, port: int) -> None:
        return None

    def udp_tap(self, data: bytes, addr: tuple, rx_ns: int) -> bool:
        return False

    async def close(self) -> None:
        return None
