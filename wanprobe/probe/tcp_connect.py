"""TCP connect probes, Pingmesh-style (Guo et al., SIGCOMM 2015): time SYN → SYN-ACK to a port.

Each probe is a non-blocking connect() awaited on the event loop. The RTT is the kernel's own
first RTT sample of the handshake (``tcpi_rtt`` from TCP_INFO, µs, include/uapi/linux/tcp.h;
for an active open it is measured from the SYN's transmit time to the SYN-ACK), so loop
scheduling does not enter it. A connect that does not complete within the timeout, or whose SYN
had to be retransmitted (``tcpi_total_retrans`` > 0: a SYN or SYN-ACK was lost, Karn's rule gives
no sample), counts as a lost probe. A RST (port closed) still proves the path: its time is taken
from the clock around connect(). The connection is then reset (SO_LINGER 0) to leave no TIME_WAIT.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import struct
import time

from wanprobe.errors import UsageError
from wanprobe.probe.peer import resolve_peer
from wanprobe.probe.probe_options import check_common, probe_count
from wanprobe.probe.probe_summary import Reply, summarize
from wanprobe.probe.result import ProbeResult

TCP_INFO_RTT_OFFSET = 68       # tcpi_rtt, u32 µs
TCP_INFO_TOTAL_RETRANS = 100   # tcpi_total_retrans, u32
_LINGER0 = struct.pack("ii", 1, 0)


async def _one_connect(family: int, addr: str, port: int, dscp: int,
                       timeout_s: float) -> tuple[int, int | None, int | None]:
    """Return (start_ns, rtt_ns or None if lost, tos None); never raises for network errors."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        if dscp:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, dscp << 2)
            else:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
        start_ns = time.time_ns()
        rc = sock.connect_ex((addr, port))
        if rc not in (0, errno.EINPROGRESS):
            return start_ns, None, None
        fut = loop.create_future()
        loop.add_writer(sock.fileno(), lambda: fut.done() or fut.set_result(None))
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            return start_ns, None, None
        finally:
            loop.remove_writer(sock.fileno())
        end_ns = time.time_ns()
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err == errno.ECONNREFUSED:
            return start_ns, end_ns - start_ns, None
        if err:
            return start_ns, None, None
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        rtt_us, = struct.unpack_from("I", info, TCP_INFO_RTT_OFFSET)
        retrans, = struct.unpack_from("I", info, TCP_INFO_TOTAL_RETRANS)
        if retrans:
            return start_ns, None, None
        return start_ns, (rtt_us * 1000 if rtt_us else end_ns - start_ns), None
    finally:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER0)
        sock.close()


async def probe_tcp(peer: str, *, port: int = 862, count: int | None = None,
                    duration_s: float | None = None, interval_s: float = 1.0,
                    size: int | None = None, dscp: int = 0, timeout_s: float = 2.0,
                    on_progress=None) -> ProbeResult:
    """TCP connect-time probes to ``peer``:``port``; probes overlap when RTT > interval."""
    if port is None:
        raise UsageError("TCP probes need --port")
    check_common(port, dscp, timeout_s)
    total = probe_count(count, duration_s, interval_s)
    family, addr = await resolve_peer(peer)
    loop = asyncio.get_running_loop()
    started_ns = time.time_ns()
    t0 = loop.time()
    tasks = []
    done = 0

    def _progress(_t) -> None:
        nonlocal done
        done += 1
        if on_progress is not None:
            on_progress(len(tasks), done, total)

    for seq in range(total):
        delay = t0 + seq * interval_s - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.ensure_future(_one_connect(family, addr, port, dscp, timeout_s))
        task.add_done_callback(_progress)
        tasks.append(task)
    results = await asyncio.gather(*tasks)
    tx_user: dict[int, int] = {}
    replies: list[Reply] = []
    for seq, (start_ns, rtt_ns, _tos) in enumerate(results):
        tx_user[seq] = start_ns
        if rtt_ns is not None:
            replies.append(Reply(sseq=seq, rx_ns=start_ns + rtt_ns))
    return summarize(
        method="tcp", peer=peer, port=port, started_ns=started_ns, duration_s=loop.time() - t0,
        interval_s=interval_s, size_bytes=None, dscp=dscp, sent=total, tx_user_ns=tx_user,
        tx_kernel_ns=tx_user, replies=replies, timeout_ns=int(timeout_s * 1e9) + 1,
        # tx_kernel_ns: the RTTs are the kernel's own tcpi_rtt samples
    )
