"""host_config reads sysctls, interfaces, qdiscs and the netns inode through its roots: a
hand-built tree for exact parsing, and the live host compared with /proc, /sys and `tc`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from collectors.host_config import (
    fq_available,
    parse_tc_qdisc_json,
    read_host_config,
    read_sysctls,
)


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


@pytest.fixture
def tree(tmp_path):
    proc, sys_ = tmp_path / "proc", tmp_path / "sys"
    write(proc, "sys/net/ipv4/tcp_rmem", "4096\t131072\t6291456\n")
    write(proc, "sys/net/ipv4/tcp_congestion_control", "reno\n")
    write(proc, "sys/net/ipv4/tcp_available_congestion_control", "reno bbr cubic\n")
    write(proc, "sys/net/ipv4/tcp_allowed_congestion_control", "reno bbr\n")
    write(proc, "sys/kernel/osrelease", "6.18.44-test\n")
    write(proc, "sys/kernel/hostname", "fixture-host\n")
    write(sys_, "class/net/eth0/mtu", "9000\n")
    write(sys_, "class/net/eth0/tx_queue_len", "10000\n")
    write(sys_, "class/net/eth0/speed", "100000\n")
    write(sys_, "class/net/tun0/mtu", "1400\n")
    write(sys_, "class/net/tun0/speed", "-1\n")  # what a TUN device reports
    return proc, sys_, tmp_path


def test_reads_fixture_tree(tree):
    proc, sys_, tmp = tree
    h = read_host_config(proc, sys_, tmp / "etc", live=False).to_json()
    assert h["sysctls"]["net.ipv4.tcp_rmem"] == "4096 131072 6291456"  # tabs normalised
    assert "net.core.default_qdisc" not in h["sysctls"]                # absent, not "0"
    assert h["available_cc"] == ["reno", "bbr", "cubic"] and h["allowed_cc"] == ["reno", "bbr"]
    assert h["kernel"] == "6.18.44-test" and h["hostname"] == "fixture-host"
    assert h["ifaces"]["eth0"] == {"mtu": 9000, "txqueuelen": 10000, "qdisc": None,
                                   "speed_mbps": 100000}
    assert h["ifaces"]["tun0"]["speed_mbps"] is None and h["ifaces"]["tun0"]["txqueuelen"] is None
    assert h["netns_inode"] is None and h["machine_id"] is None


def test_parse_tc_qdisc_json():
    text = json.dumps([{"kind": "noqueue", "handle": "0:", "dev": "lo", "root": True},
                       {"kind": "mq", "handle": "0:", "dev": "eth0", "root": True},
                       {"kind": "fq", "handle": "0:", "dev": "eth0", "parent": "0:1"}])
    assert parse_tc_qdisc_json(text) == {"lo": "noqueue", "eth0": "mq"}
    assert parse_tc_qdisc_json("not json") == {}


def test_fq_available(tmp_path):
    sys_, mods = tmp_path / "sys", tmp_path / "lib"
    assert fq_available(sys_, "6.1", mods) is None                    # nothing to tell by
    write(mods, "6.1/modules.builtin", "kernel/net/sched/sch_fq_codel.ko\n")
    assert fq_available(sys_, "6.1", mods) is False
    write(mods, "6.1/kernel/net/sched/sch_fq.ko.xz", "")
    assert fq_available(sys_, "6.1", mods) is True
    (sys_ / "module" / "sch_fq").mkdir(parents=True)
    assert fq_available(sys_, "6.2", mods) is True                    # loaded


def test_live_host_matches_proc_sys_and_tc():
    h = read_host_config().to_json()
    for name, value in h["sysctls"].items():
        raw = Path("/proc/sys", *name.split(".")).read_text()
        assert value == " ".join(raw.split())
    assert set(read_sysctls(Path("/proc"))) == set(h["sysctls"])
    assert h["netns_inode"] == os.stat("/proc/self/ns/net").st_ino
    assert h["ifaces"]["lo"]["mtu"] == int(Path("/sys/class/net/lo/mtu").read_text())
    if shutil.which("tc"):
        rows = json.loads(subprocess.run(["tc", "-j", "qdisc", "show"], capture_output=True,
                                         text=True).stdout)
        roots = {r["dev"]: r["kind"] for r in rows if r.get("root")}
        assert {n: i["qdisc"] for n, i in h["ifaces"].items() if i["qdisc"]} == roots


def test_live_rings_match_ethtool():
    """Ring sizes read with the SIOCETHTOOL ioctl equal `ethtool -g` for every interface that
    has rings (a virtio/physical NIC; veth/TUN/lo have none and are left out, not 0)."""
    ethtool = shutil.which("ethtool")
    if ethtool is None:
        pytest.skip("needs ethtool")
    h = read_host_config().to_json()
    assert "rx_ring" not in h["ifaces"]["lo"]
    for name, info in h["ifaces"].items():
        if "rx_ring" not in info:
            continue
        out = subprocess.run([ethtool, "-g", name], capture_output=True, text=True).stdout
        maxima, current = out.split("Current hardware settings:")
        def field(text, label):
            return int(re.search(rf"^{label}:\s+(\d+)", text, re.M).group(1))
        assert info["rx_ring_max"] == field(maxima, "RX") and info["rx_ring"] == field(current, "RX")
        assert info["tx_ring_max"] == field(maxima, "TX") and info["tx_ring"] == field(current, "TX")
