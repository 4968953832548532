"""HostFacts: built from the collectors (fixture tree and the live host), validated as hostile
input, and served by a real ThroughputServer over the control channel (``host_facts`` op)."""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import test_throughput_cli
from conftest import free_port

from collectors.host_facts import FactsError, HostFacts, facts_from, read_host_facts
from collectors.procfs_sysctl import read_sysctls
from wanprobe.errors import ProbeError
from wanprobe.throughput import host_facts_op


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_facts_from_a_fixture_tree(tmp_path):
    proc = tmp_path / "proc"
    write(proc, "sys/net/ipv4/tcp_rmem", "4096\t131072\t262144\n")
    write(proc, "sys/net/ipv4/tcp_mem", "1000\t2000\t3000\n")
    write(proc, "sys/net/ipv4/tcp_congestion_control", "reno\n")
    write(proc, "sys/net/ipv4/tcp_allowed_congestion_control", "reno bbr\n")
    write(proc, "net/snmp", "Tcp: RtoAlgorithm RetransSegs OutSegs\nTcp: 1 7 900\n")
    sysctls, _ = read_sysctls(proc)
    link = {"name": "eth0", "mtu": 1400, "qdisc": "tbf", "stats64": {"rx_dropped": 3}}
    f = facts_from(sysctls, {"RetransSegs": 7, "OutSegs": 900}, link, iface="eth0",
                   page_size_bytes=4096)
    assert f.tcp_rmem_bytes == (4096, 131072, 262144) and f.tcp_wmem_bytes is None  # absent
    assert f.cc_current == "reno" and f.cc_allowed == ("reno", "bbr")
    assert f.tcp_mem_max_bytes == 3000 * 4096
    assert (f.iface_mtu_bytes, f.iface_qdisc, f.iface_rx_dropped_packets) == (1400, "tbf", 3)
    assert f.iface_tx_dropped_packets is None
    assert HostFacts.from_json(json.loads(json.dumps(f.to_json()))) == f


def test_live_facts_match_procfs():
    f = read_host_facts("127.0.0.1")
    raw = Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()
    assert list(f.tcp_rmem_bytes) == [int(x) for x in raw]
    assert f.iface == "lo" and f.iface_mtu_bytes == int(Path("/sys/class/net/lo/mtu").read_text())
    assert f.cc_current == Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()


@pytest.mark.parametrize("doc", [
    [], {"version": 2}, {"version": 1, "tcp_rmem_bytes": [1, 2]},
    {"version": 1, "rmem_max_bytes": -1}, {"version": 1, "rmem_max_bytes": True},
    {"version": 1, "cc_current": "bbr; rm -rf /"}, {"version": 1, "cc_allowed": "bbr"},
    {"version": 1, "iface": "x" * 100},
])
def test_hostile_documents_are_refused(doc):
    with pytest.raises(FactsError):
        HostFacts.from_json(doc)


loopback_server = test_throughput_cli.loopback_server  # the same fixture, not a copy


def test_server_answers_host_facts(loopback_server):
    f = host_facts_op.fetch("127.0.0.1", loopback_server.port)
    here = read_host_facts("127.0.0.1")
    moving = {k: None for k in ("tcp_out_segs_total", "tcp_retrans_segs_total",
                                "iface_rx_dropped_packets", "iface_tx_dropped_packets")}
    assert f.tcp_out_segs_total is not None  # counters move between two reads; config does not
    assert replace(f, **moving) == replace(here, **moving)


def test_peer_without_control_channel_is_one_plain_error():
    with pytest.raises(ProbeError, match="no wanprobe control channel"):
        host_facts_op.fetch("127.0.0.1", free_port())


def test_older_peer_that_refuses_the_op_is_one_plain_error():
    """An older server reads the op as a hello with the wrong version and refuses it."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)

    def old_server() -> None:
        conn, _ = lsock.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b'{"op":"refused","error":"unsupported protocol version"}\n')

    t = threading.Thread(target=old_server, daemon=True)
    t.start()
    try:
        with pytest.raises(ProbeError, match="sent no host facts .*unsupported protocol"):
            host_facts_op.fetch("127.0.0.1", lsock.getsockname()[1])
    finally:
        t.join(5)
        lsock.close()


def test_boot_id_is_carried_and_checked(tmp_path):
    """Two ends with one boot id read one kernel clock (probe/owd.py); a peer's value is
    checked like every other field."""
    from collectors.host_facts import FactsError, HostFacts, facts_from

    facts = facts_from({}, {}, None, iface=None, page_size_bytes=4096,
                       boot_id="0c0ffee0-1111-4222-8333-444455556666")
    doc = facts.to_json()
    assert HostFacts.from_json(doc).boot_id == "0c0ffee0-1111-4222-8333-444455556666"
    assert HostFacts.from_json({**doc, "boot_id": None}).boot_id is None
    for bad in ("x" * 200, "../etc", 5, ["a"]):
        with pytest.raises(FactsError, match="boot_id"):
            HostFacts.from_json({**doc, "boot_id": bad})
