"""Live checks on this host: the SIOCETHTOOL reader against ``ethtool -S`` / ``ethtool -g``,
rtnetlink link stats against /sys/class/net/*/statistics, and a whole snapshot taken inside a
test namespace pair joined by a veth, with traffic between the samples.

Root-namespace checks are read-only. Namespaces carry conftest's TEST_LAB_PREFIX and are always
deleted."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import TEST_LAB_PREFIX, require_tool

from collectors.ethtool_ioctl import EthtoolError, EthtoolIoctl
from collectors.ethtool_text import parse_ethtool_stats
from collectors.netlink_link import read_links
from collectors.rates import rates
from collectors.snapshot import collect
from collectors.sysfs_read import read_counter_dir
from wanprobe.netns import setns

_n = itertools.count()


def sh(*argv, check=True):
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=30)


@pytest.fixture
def veth_pair():
    """Namespaces A and B joined by veth vA (198.19.254.1) ↔ vB (198.19.254.2)."""
    require_tool("ping")
    k = next(_n)
    a, b = f"{TEST_LAB_PREFIX}cA{k}", f"{TEST_LAB_PREFIX}cB{k}"
    try:
        sh("ip", "netns", "add", a)
        sh("ip", "netns", "add", b)
        sh("ip", "link", "add", "name", "vA", "netns", a, "type", "veth", "peer", "name", "vB",
           "netns", b)
        sh("ip", "-n", a, "addr", "add", "198.19.254.1/30", "dev", "vA")
        sh("ip", "-n", b, "addr", "add", "198.19.254.2/30", "dev", "vB")
        sh("ip", "-n", a, "link", "set", "vA", "up")
        sh("ip", "-n", b, "link", "set", "vB", "up")
        yield a, b
    finally:
        for ns in (a, b):
            sh("ip", "netns", "del", ns, check=False)


def ping(ns: str, count: int = 20) -> None:
    sh("ip", "netns", "exec", ns, "ping", "-q", "-c", str(count), "-i", "0.01", "-W", "1",
       "198.19.254.2")


def socket_in_netns(ns: str) -> socket.socket:
    """A datagram socket created inside ``ns`` (a helper thread setns()s, creates it, exits)."""
    out: dict = {}

    def run():
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            setns(fd)
            out["sock"] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        except OSError as exc:
            out["err"] = exc
        finally:
            os.close(fd)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "err" in out:
        raise out["err"]
    return out["sock"]


def bracket(before, reference, after):
    """Same names in the same order, and ours-before ≤ reference ≤ ours-after per counter."""
    assert [n for n, _ in before] == [n for n, _ in reference] == [n for n, _ in after]
    for (name, lo), (_, mid), (_, hi) in zip(before, reference, after, strict=True):
        assert lo <= mid <= hi, (name, lo, mid, hi)


@pytest.mark.netns
def test_ioctl_matches_ethtool_S_on_veth_in_namespace(veth_pair):
    require_tool("ethtool")
    a, b = veth_pair
    sock = socket_in_netns(a)
    with EthtoolIoctl(sock) as reader:
        before = reader.statistics("vA")
        ping(a)
        text = sh("ip", "netns", "exec", a, "ethtool", "-S", "vA").stdout
        ping(a)
        after = reader.statistics("vA")
        with pytest.raises(EthtoolError) as exc:
            reader.statistics("no-such-dev0")
        assert exc.value.absent
    sock.close()
    reference, errors = parse_ethtool_stats(text)
    assert errors == [] and len(reference) > 3
    bracket(before, reference, after)
    peer = json.loads(sh("ip", "-n", b, "-j", "link", "show", "vB").stdout)[0]["ifindex"]
    assert dict(after)["peer_ifindex"] == peer


@pytest.mark.netns
def test_ioctl_matches_ethtool_on_host_devices_read_only():
    """Every host device with driver statistics (virtio_net here: counters move with any host
    traffic), read ours → ethtool → ours."""
    require_tool("ethtool")
    checked = 0
    with EthtoolIoctl() as reader:
        for name in sorted(os.listdir("/sys/class/net")):
            try:
                before = reader.statistics(name)
            except EthtoolError as exc:
                assert exc.absent
                continue
            text = sh("ethtool", "-S", name).stdout
            after = reader.statistics(name)
            bracket(before, parse_ethtool_stats(text)[0], after)
            checked += 1
            rings_text = sh("ethtool", "-g", name, check=False).stdout
            if "Current hardware settings" in rings_text:
                cur = rings_text.split("Current hardware settings:")[1]
                rx = int(cur.split("RX:")[1].split()[0])
                tx = int(cur.split("TX:")[1].split()[0])
                r = reader.rings(name)
                assert (r.rx_pending, r.tx_pending) == (rx, tx)
    assert checked >= 1


@pytest.mark.netns
def test_netlink_stats_agree_with_sysfs_statistics_read_only():
    names = sorted(os.listdir("/sys/class/net"))
    before = {n: read_counter_dir(Path("/sys/class/net", n, "statistics"), "t")[0] for n in names}
    links, errors = read_links()
    after = {n: read_counter_dir(Path("/sys/class/net", n, "statistics"), "t")[0] for n in names}
    assert errors == []
    checked = 0
    for n in names:
        if not before[n] or n not in links:   # device vanished meanwhile: nothing to compare
            continue
        checked += 1
        nl = links[n].stats.values
        common = set(nl) & set(before[n])
        assert len(common) >= 20
        for key in common:
            assert before[n][key] <= nl[key] <= after[n][key], (n, key)
    assert checked >= 1


@pytest.mark.netns
def test_snapshot_inside_namespace_with_traffic(veth_pair):
    a, b = veth_pair
    s0 = collect(netns=b)
    ping(a, 30)
    s1 = collect(netns=b)
    assert s0.netns == b and set(s1.netdevs) == {"lo", "vB"}
    vb = s1.netdevs["vB"]
    assert vb.ethtool_source == "ioctl" and "peer_ifindex" in vb.ethtool.values
    assert vb.link is not None and vb.mtu == 1500
    r = rates(s0, s1)
    got = r.get(("netdevs", "vB", "stats"), "rx_packets")
    assert got.status == "ok" and got.delta >= 30 and got.per_s > 0
    # the namespace's own TCP/IP MIB, not the host's
    assert s1.tcp is not None and s1.ip.get("InReceives") >= 30
    # netlink vs sysfs inside the namespace (ip netns exec remounts /sys for it)
    code = ("import json; from pathlib import Path; from collectors.netlink_link import read_links;"
            "from collectors.sysfs_read import read_counter_dir as r;"
            "b=r(Path('/sys/class/net/vB/statistics'),'t')[0]; l=read_links()[0]['vB'].stats.values;"
            "a=r(Path('/sys/class/net/vB/statistics'),'t')[0]; print(json.dumps([b,l,a]))")
    out = sh("ip", "netns", "exec", b, sys.executable, "-c", code).stdout
    before, nl, after = json.loads(out)
    assert all(before[k] <= nl[k] <= after[k] for k in set(nl) & set(before))


@pytest.mark.netns
def test_collect_in_missing_namespace_is_one_line_error():
    from wanprobe.errors import WanprobeError
    with pytest.raises(WanprobeError) as exc:
        collect(netns=f"{TEST_LAB_PREFIX}nonexistent")
    assert "\n" not in str(exc.value)


@pytest.mark.netns
def test_live_host_snapshot_and_rates():
    s0 = collect()
    s1 = collect()
    assert s0.netdevs and s0.tcp is not None and s0.sysctls
    assert "lo" in s0.qdisc or s0.qdisc            # rtnetlink qdisc dump worked
    r = rates(s0, replace(s1, monotonic_s=max(s1.monotonic_s, s0.monotonic_s + 1e-3)))
    assert all(v.per_s is None or v.per_s >= 0 for g in r.groups.values() for v in g.values())
