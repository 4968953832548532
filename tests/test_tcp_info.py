"""struct tcp_info codec: byte-level layout, truncated buffers, and a live socket vs `ss -ti`."""

from __future__ import annotations

import re
import shutil
import socket
import struct
import subprocess
import time

import pytest

from wanprobe.throughput.sockopts import read_tcp_info
from wanprobe.throughput.tcp_info import LAYOUT, SIZE_BYTES, TcpInfo, pack_tcp_info, parse_tcp_info

# The 248-byte prefix format from tcp-tuning.md §4.3, field order as in include/uapi/linux/tcp.h.
REFERENCE_FMT = "<8B24I4Q6IQ3Q2I2Q6I2HI"


def test_layout_matches_reference_struct_format():
    assert struct.calcsize(REFERENCE_FMT) == 248
    names = [name for name, offset, _ in LAYOUT if offset < 248]
    values = list(range(1, len(names) + 1))
    raw = struct.pack(REFERENCE_FMT, *values)
    info = parse_tcp_info(raw)
    assert [getattr(info, n) for n in names] == values
    assert LAYOUT[-1][1] + 4 == SIZE_BYTES


def test_known_offsets_decode_hand_placed_values():
    raw = bytearray(SIZE_BYTES)
    struct.pack_into("<B", raw, 6, 0x97)           # rcv_wscale 9, snd_wscale 7
    struct.pack_into("<I", raw, 68, 60_123)        # rtt µs
    struct.pack_into("<I", raw, 80, 42)            # snd_cwnd
    struct.pack_into("<Q", raw, 104, 12_500_000)   # pacing_rate B/s
    struct.pack_into("<I", raw, 148, 59_987)       # min_rtt µs
    struct.pack_into("<Q", raw, 160, 11_000_000)   # delivery_rate B/s
    struct.pack_into("<Q", raw, 176, 1_500_000)    # rwnd_limited µs
    struct.pack_into("<Q", raw, 208, 20_272)       # bytes_retrans
    struct.pack_into("<I", raw, 248, 7)            # received_ce (6.18 AccECN tail)
    info = parse_tcp_info(bytes(raw))
    assert (info.snd_wscale, info.rcv_wscale) == (7, 9)
    assert info.rtt_us == 60_123 and info.snd_cwnd == 42 and info.min_rtt_us == 59_987
    assert info.pacing_rate == 12_500_000 and info.delivery_rate == 11_000_000
    assert info.rwnd_limited_us == 1_500_000 and info.bytes_retrans == 20_272
    assert info.received_ce == 7


def test_short_buffer_leaves_missing_fields_none_not_zero():
    full = pack_tcp_info(TcpInfo(snd_cwnd=10, bytes_retrans=5, total_rto=3, received_ce=1))
    old = parse_tcp_info(full[:104])     # an old kernel: up to total_retrans only
    assert old.snd_cwnd == 10 and old.total_retrans == 0
    assert old.pacing_rate is None and old.bytes_retrans is None and old.received_ce is None
    mid = parse_tcp_info(full[:248])
    assert mid.total_rto == 3 and mid.received_ce is None
    assert parse_tcp_info(b"").state is None


def test_pack_parse_round_trip_and_longer_buffer_ignored():
    info = TcpInfo(**{name: (i * 7919) % 251 for i, (name, _, _) in enumerate(LAYOUT)})
    raw = pack_tcp_info(info)
    assert len(raw) == SIZE_BYTES
    assert parse_tcp_info(raw + b"\xff" * 32) == info


def _ss_fields(port: int) -> dict[str, str]:
    out = subprocess.run(["ss", "-tinH", "src", f"127.0.0.1:{port}"], capture_output=True,
                         text=True, check=True).stdout
    return dict(re.findall(r"\b([a-z_]+):(\S+)", out))


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_live_socket_agrees_with_ss():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    try:
        payload = b"\x5a" * 2_000_000
        client.sendall(payload)
        got = 0
        while got < len(payload):
            got += len(server.recv(1 << 20))
        time.sleep(0.3)  # idle: every counter is final before both reads
        info = read_tcp_info(client)
        ss = _ss_fields(client.getsockname()[1])
    finally:
        for s in (client, server, listener):
            s.close()
    assert info is not None and info.state == 1  # TCP_ESTABLISHED
    assert info.snd_mss == int(ss["mss"])
    assert info.snd_cwnd == int(ss["cwnd"])
    assert info.bytes_acked == int(ss["bytes_acked"]) == len(payload) + 1
    assert info.bytes_sent == int(ss["bytes_sent"])
    srtt_ms, rttvar_ms = (float(x) for x in ss["rtt"].split("/"))
    assert info.rtt_us / 1000 == pytest.approx(srtt_ms, abs=0.0015)
    assert info.rttvar_us / 1000 == pytest.approx(rttvar_ms, abs=0.0015)
    assert info.min_rtt_us / 1000 == pytest.approx(float(ss["minrtt"]), abs=0.0015)
    assert info.snd_wnd == int(ss["snd_wnd"])
