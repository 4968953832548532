"""The far end of a UDP test is never the limit of what it measures (issue 35): the test's own
socket with UDP GRO reads a GSO sender's datagrams in ~45 at a time, its kernel timestamps time
the burst as it arrived, and what the host drops itself is counted apart (SO_MEMINFO), never
as path loss — real kernel sockets on loopback; the host's drop counters from a captured /proc."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from conftest import FIXTURE_TREES

from collectors.host_drops import HostDrops, parse_softnet_dropped, read_host_drops
from wanprobe.throughput import protocol as proto
from wanprobe.throughput.udp import (
    UdpReceiverStats,
    UdpSendState,
    enable_gso,
    far_end_drops,
    send_paced,
)
from wanprobe.throughput.udp_sink import UdpSink

COOKIE = bytes(range(8))


def test_host_drops_read_a_captured_proc_and_count_increases():
    d = read_host_drops(proc_root=FIXTURE_TREES / "node_exporter" / "proc")
    # node_exporter's fixture: softnet_stat column 2 is 0x29 on one CPU; Udp: RcvbufErrors 9,
    # SndbufErrors 8
    assert d.backlog_drops == 0x29 and d.udp_rcvbuf_errors == 9 and d.udp_sndbuf_errors == 8
    assert d.udp_in_errors == 0
    assert d.nic_rx_drops is None  # no interface asked for
    later = HostDrops(udp_rcvbuf_errors=19, udp_in_errors=10, udp_sndbuf_errors=None,
                      backlog_drops=0x2b, nic_rx_drops=None)
    assert later.since(d) == HostDrops(10, 10, None, 2, None)
    assert HostDrops(udp_rcvbuf_errors=3).since(HostDrops(udp_rcvbuf_errors=7)).udp_rcvbuf_errors == 3
    assert parse_softnet_dropped("00 0z\n") is None and parse_softnet_dropped("") is None


def test_far_end_drops_book_loss_on_the_path_only_when_the_host_dropped_nothing():
    end = {"host_drops": {"backlog_drops": 5, "nic_rx_drops": None, "udp_rcvbuf_errors": 99},
           "socket_drops": 20, "receiver": "gro", "rcvbuf_bytes": 212992}
    got = far_end_drops(end, 100)
    assert (got["host_drop_events"], got["path_lost_packets"]) == (25, None)
    assert got["receiver"] == "gro" and got["receiver_rcvbuf_bytes"] == 212992
    # the reflector's socket (no count of its own): the namespace's RcvbufErrors stand in
    assert far_end_drops({**end, "socket_drops": None}, 100)["host_drop_events"] == 104
    quiet = {"host_drops": {"backlog_drops": 0, "udp_rcvbuf_errors": 0}, "socket_drops": 0}
    assert far_end_drops(quiet, 7)["path_lost_packets"] == 7
    assert far_end_drops({}, 7) == {"receiver": None, "receiver_rcvbuf_bytes": None,
                                    "host_drop_events": None, "path_lost_packets": None}
    hostile = far_end_drops({"host_drops": {"backlog_drops": -4, "x": True}, "socket_drops": "9",
                             "receiver": 3, "rcvbuf_bytes": 1.5}, 10)
    assert hostile["host_drop_events"] == 0 and hostile["receiver"] is None


def _pair(rcvbuf: int):
    stats = UdpReceiverStats()
    sink = UdpSink(stats, COOKIE)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.bind(("127.0.0.1", 0))
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    sink.open(("127.0.0.1", port), tx.getsockname(), rcvbuf)
    tx.connect(("127.0.0.1", port))
    return stats, sink, tx


def _send(tx, rate_bps: float, seconds: float, segments: int) -> UdpSendState:
    state = UdpSendState(segments=segments)
    send_paced(tx, COOKIE, rate_bps=rate_bps, duration_s=seconds, packet_bytes=1400,
               max_bytes=2**30, state=state, abort=threading.Event())
    return state


def test_a_gso_burst_is_read_whole_through_gro_and_timed_by_the_kernel():
    stats, sink, tx = _pair(64 * 2**20)
    try:
        segments = enable_gso(tx, 1400)
        assert segments == 46  # 46 × 1400 B in one send, under 64 KiB
        sink.start()
        state = _send(tx, 400e6, 0.3, segments)
        deadline = time.monotonic() + 5
        while stats.packets < state.packets and time.monotonic() < deadline:
            time.sleep(0.02)
        facts = sink.facts()
    finally:
        sink.stop()
        tx.close()
    assert facts["receiver"] == "gro" and facts["kernel_timestamps"] and facts["foreign"] == 0
    assert stats.packets == state.packets and stats.lost_packets(state.packets) == 0
    assert stats.max_seq == state.packets - 1 and facts["socket_drops"] == 0
    span = (stats.t_last_ns - stats.t_first_ns) / 1e9
    assert 0.2 < span < 0.4  # the burst as the kernel saw it arrive, not as it was read
    assert facts["receiver_cpu_seconds"] < span  # ~45 datagrams per read: not the limit


def test_a_reader_that_cannot_keep_up_counts_its_own_drops():
    stats, sink, tx = _pair(256 * 2**10)  # small: the kernel caps it near net.core.rmem_max
    try:
        segments = enable_gso(tx, 1400)
        state = _send(tx, 800e6, 0.2, segments)  # nobody reads while the burst arrives
        sink.start()
        since = time.monotonic()
        deadline = since + 5
        while not sink.drained_since(since) and time.monotonic() < deadline:
            time.sleep(0.02)
        drops = sink.facts()["socket_drops"]
    finally:
        sink.stop()
        tx.close()
    lost = state.packets - stats.packets
    # the kernel counts a dropped GRO buffer once: at least one event, at most one per datagram
    assert lost > 0 and 0 < drops <= lost
    got = far_end_drops({"host_drops": HostDrops().to_json(), "socket_drops": drops}, lost)
    assert got["host_drop_events"] == drops and got["path_lost_packets"] is None


@pytest.mark.parametrize("garbage", [b"", b"WPTU", bytes(200), proto.pack_udp_header(bytes(8), 1, 1)])
def test_datagrams_that_are_not_the_tests_are_counted_and_left_out(garbage):
    stats, sink, tx = _pair(2**20)
    try:
        sink.start()
        tx.send(garbage)
        tx.send(proto.pack_udp_header(COOKIE, 0, 5) + bytes(100))
        deadline = time.monotonic() + 3
        while stats.packets + sink.foreign < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        sink.stop()
        tx.close()
    assert stats.packets == 1 and sink.foreign == 1


@pytest.mark.parametrize("end", [None, [], {"packets": "9", "bytes": 1}, {"packets": -1, "bytes": 1},
                                 {"packets": 1, "bytes": True}, {"bytes": 5}])
def test_malformed_udp_totals_from_a_server_are_one_line(end):
    from wanprobe.errors import ProbeError
    from wanprobe.throughput.udp import udp_totals

    with pytest.raises(ProbeError, match="malformed UDP totals"):
        udp_totals(end, "198.18.0.2")


def test_udp_totals_keep_what_is_sound_and_drop_the_rest():
    from wanprobe.throughput.udp import udp_totals

    got = udp_totals({"packets": 3, "bytes": 4200, "seconds": float("inf"), "jitter_ms": "x",
                      "lost_packets": -2, "out_of_order": None}, "p")
    assert (got["seconds"], got["jitter_ms"], got["lost_packets"], got["out_of_order"]) == \
        (None, 0.0, None, 0)
    assert udp_totals({"packets": 3, "bytes": 4200, "seconds": 0.5}, "p")["seconds"] == 0.5
