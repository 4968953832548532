"""The server's side of a UDP test (its ``test`` op with ``udp``): the test's own receiving socket
(udp_sink.py), a report per interval, the datagrams still in flight after the client's
``udp_done``, then the totals with what this host dropped itself (collectors/host_drops.py), so
the client can tell the path's loss from the far end's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Callable
from typing import Any

from collectors.host_drops import iface_of_address, read_host_drops
from wanprobe.throughput import protocol as proto
from wanprobe.throughput.stall import flush
from wanprobe.throughput.udp import udp_interval_record
from wanprobe.throughput.udp_sink import UdpSink, rcvbuf_for

LINGER_S = 1.0       # late datagrams after udp_done, read through the reflector's socket
DRAIN_MAX_S = 5.0    # ... through the test's own socket: until a read finds it empty
DONE_GRACE_S = 5.0   # the client sends udp_done as soon as its sender stops


def norm_ip(host: str) -> str:
    """An address as the tests compare them: no zone, an IPv4-mapped IPv6 address as IPv4."""
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return str(ip)


def open_sink(test: Any, port: int | None) -> UdpSink | None:
    """The UDP test's own socket, bound to this end of the control connection (``test.local``,
    the server's ``port``) and connected to the client's UDP port; None (an older client, a bind
    refused) leaves the datagrams to the reflector's socket (ThroughputServer.udp_tap)."""
    req = test.request
    if not req.udp_port or not test.local:
        return None
    sink = UdpSink(test.udp, test.cookie)
    try:
        sink.open((norm_ip(test.local[0]), port or test.local[1]), (test.peer_ip, req.udp_port),
                  rcvbuf_for(req.udp_rate_bps or 0.0, req.duration_s, req.max_bytes))
    except (OSError, ValueError):
        return None
    sink.start()
    return sink


async def run_udp(test: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  report: Callable[[bytes], None]) -> None:
    """Report intervals (through ``report``) until the client's ``udp_done``, let the last
    datagrams in, then send the totals (``test``: server._Test)."""
    req, stats = test.request, test.udp
    loop = asyncio.get_running_loop()
    iface = iface_of_address(norm_ip(test.local[0])) if test.local else None
    drops0 = await loop.run_in_executor(None, read_host_drops, iface)
    t0 = time.monotonic()
    k = 0
    last = {"packets": 0, "bytes": 0}
    done_msg: dict | None = None
    read = asyncio.ensure_future(reader.readline())
    hard_end = t0 + req.duration_s + DONE_GRACE_S
    try:
        while time.monotonic() < hard_end and not test.abort.is_set():
            boundary = min(t0 + (k + 1) * req.interval_s, hard_end)
            waited = await asyncio.wait({read}, timeout=max(boundary - time.monotonic(), 0))
            if waited[0]:
                line = read.result()
                if not line:
                    return
                msg = proto.decode(line)
                if msg.get("op") == "udp_done":
                    done_msg = msg
                    break
                read = asyncio.ensure_future(reader.readline())
                continue
            snap = stats.snapshot()
            report(proto.encode("interval", **udp_interval_record(k, req.interval_s, snap, last)))
            last = {"packets": snap["packets"], "bytes": snap["bytes"]}
            k += 1
        if done_msg:
            await late_datagrams(test.sink)
        sent = int(done_msg["packets_sent"]) if done_msg else None
        span = ((stats.t_last_ns - stats.t_first_ns) / 1e9
                if stats.t_first_ns is not None and stats.t_last_ns is not None else None)
        drops = (await loop.run_in_executor(None, read_host_drops, iface)).since(drops0)
        sink = test.sink.facts() if test.sink is not None else {"receiver": "reflector"}
        writer.write(proto.encode("end", streams=[], cpu_max_percent=[],
                                  udp={**stats.snapshot(sent), "seconds": span, **sink,
                                       "host_drops": drops.to_json()}))
        await flush(writer)
    finally:
        read.cancel()


async def late_datagrams(sink: UdpSink | None) -> None:
    """Wait for what is still in flight after ``udp_done``: through the test's own socket until
    its reader finds it empty (a reader that runs late drains its buffer first, up to
    DRAIN_MAX_S), else a fixed linger."""
    if sink is None:
        await asyncio.sleep(LINGER_S)
        return
    since = time.monotonic()
    while time.monotonic() - since < DRAIN_MAX_S and not sink.drained_since(since):
        await asyncio.sleep(0.02)
