"""Per-stream socket options and TCP_INFO sampling (the side-effect edge of the data path).

Constants Python 3.11 does not export are from asm-generic/socket.h (tcp-tuning.md §4.4).
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

from wanprobe.errors import UsageError
from wanprobe.throughput.tcp_info import SIZE_BYTES, TcpInfo, parse_tcp_info

SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)
TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)
IPV6_TCLASS = getattr(socket, "IPV6_TCLASS", 67)


def available_cc(proc_root: Path = Path("/proc")) -> list[str]:
    """Congestion controls the kernel has loaded (net.ipv4.tcp_available_congestion_control)."""
    path = proc_root / "sys/net/ipv4/tcp_available_congestion_control"
    try:
        return path.read_text().split()
    except OSError:
        return []


def check_cc(cc: str | None, proc_root: Path = Path("/proc")) -> None:
    """Raise UsageError naming the available algorithms when ``cc`` is not one of them."""
    if cc is None:
        return
    have = available_cc(proc_root)
    if have and cc not in have:
        raise UsageError(f"unknown congestion control {cc!r}; available: {', '.join(have)}")


def apply_stream_options(sock: socket.socket, *, cc: str | None = None,
                         window_bytes: int | None = None, dscp: int = 0,
                         pacing_rate_bps: float | None = None,
                         reset_on_close: bool = False) -> None:
    """Set TCP_CONGESTION, SO_SNDBUF/SO_RCVBUF, IP_TOS/IPV6_TCLASS and SO_MAX_PACING_RATE.

    Call before connect()/on the listening side before data flows: the window scale is
    negotiated in the SYN, so SO_RCVBUF must be set before the handshake to take full effect.
    ``reset_on_close``: SO_LINGER {on, 0}, so close() sends RST and frees what the peer never
    read at once (socket(7)); without it a closed socket whose client stopped reading stays in
    FIN-WAIT-1 holding its send queue (2 MB each, measured) until the orphan retries run out.
    """
    if reset_on_close:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if cc:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, cc.encode())
        except OSError as exc:
            raise UsageError(f"cannot use congestion control {cc!r}: {exc.strerror}") from None
    if window_bytes:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, int(window_bytes))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, int(window_bytes))
    if dscp:
        if sock.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_TCLASS, dscp << 2)
        else:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
    if pacing_rate_bps:
        # SO_MAX_PACING_RATE is in bytes per second (u64 since 4.20; u32 accepted).
        rate = int(pacing_rate_bps / 8)
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, rate.to_bytes(8, "little"))
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, min(rate, 0xFFFFFFFF))


def read_tcp_info(sock: socket.socket) -> TcpInfo | None:
    """Sample TCP_INFO now; None when the socket is closed."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, SIZE_BYTES + 64)
    except OSError:
        return None
    return parse_tcp_info(raw)


TCP_CC_INFO = 26                 # include/uapi/linux/tcp.h
_BBR_INFO = struct.Struct("=IIIII")  # struct tcp_bbr_info (include/uapi/linux/inet_diag.h)


def read_bbr_bandwidth_bps(sock: socket.socket) -> float | None:
    """BBR's own estimate of the path's bottleneck rate (bits per second): its windowed-max
    delivery rate ``bbr_bw_hi:bbr_bw_lo`` in bytes per second (TCP_CC_INFO, bbr_get_info in
    net/ipv4/tcp_bbr.c); None when the socket's congestion control is not BBR."""
    try:
        cc = sock.getsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, 16).split(b"\0", 1)[0]
        if not cc.startswith(b"bbr"):
            return None
        raw = sock.getsockopt(socket.IPPROTO_TCP, TCP_CC_INFO, _BBR_INFO.size)
    except OSError:
        return None
    if len(raw) < _BBR_INFO.size:
        return None
    lo, hi, _min_rtt_us, _pacing_gain, _cwnd_gain = _BBR_INFO.unpack_from(raw)
    return float(((hi << 32) | lo) * 8)


def buffer_sizes(sock: socket.socket) -> tuple[int, int]:
    """(SO_SNDBUF, SO_RCVBUF) as the kernel reports them (already doubled)."""
    return (sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
