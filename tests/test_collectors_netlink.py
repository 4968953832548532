"""rtnetlink link/qdisc conversion, DCB (`dcb -j`) parsing, and qdiscs read live inside a test
namespace compared with `tc -j qdisc show` there."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest
from conftest import TEST_LAB_PREFIX, require_tool

from collectors.dcb import parse_pfc_json, read_dcb
from collectors.netlink_link import links_from_messages
from collectors.qdisc import format_handle, qdiscs_from_messages
from collectors.snapshot import Netdev, collect
from wanprobe.diagnose.fabric_counters import pfc_priorities


class Msg(dict):
    """Stand-in for a pyroute2 message: ``msg["index"]`` and ``msg.get_attr(name)``."""

    def __init__(self, fields, attrs):
        super().__init__(fields)
        self.attrs = attrs

    def get_attr(self, name):
        return self.attrs.get(name)


def test_links_from_messages():
    m = Msg({"index": 4}, {"IFLA_IFNAME": "eth0", "IFLA_MTU": 9000, "IFLA_OPERSTATE": "UP",
                           "IFLA_QDISC": "htb", "IFLA_CARRIER_CHANGES": 3,
                           "IFLA_STATS64": {"rx_bytes": 10, "tx_packets": 2}})
    links = links_from_messages([m, Msg({"index": 9}, {})])
    assert set(links) == {"eth0"}
    lk = links["eth0"]
    assert (lk.ifindex, lk.mtu, lk.qdisc, lk.carrier_changes) == (4, 9000, "htb", 3)
    assert lk.stats.values == {"rx_bytes": 10, "tx_packets": 2} and lk.stats.width("rx_bytes") == 64


def test_qdisc_handles_like_tc():
    assert format_handle(0x00010000) == "1:" and format_handle(0x0001000A) == "1:a"
    assert format_handle(0xFFFFFFFF) == "root" and format_handle(0) == "0:"
    msgs = [Msg({"index": 2, "handle": 0x10000, "parent": 0xFFFFFFFF},
                {"TCA_KIND": "htb", "TCA_STATS": {"drop": 5, "bytes": 100, "packets": 2,
                                                  "overlimits": 1}})]
    assert qdiscs_from_messages(msgs, {2: "vA"}) == {"vA": [
        {"kind": "htb", "handle": "1:", "parent": "root", "drops": 5, "overlimits": 1,
         "bytes": 100, "packets": 2}]}


PFC_JSON = '{"pfc_cap":8,"macsec_bypass":false,"delay":4096,' \
           '"prio_pfc":[false,false,false,true,false,false,false,false]}'


def test_parse_dcb_pfc_json():
    prios, raw = parse_pfc_json(PFC_JSON)
    assert prios == {i: i == 3 for i in range(8)} and raw["delay"] == 4096
    assert parse_pfc_json("Attribute read: Operation not supported") == (None, None)


def _fake_dcb(directory, pfc_out: str, rc: int = 0):
    """A stand-in `dcb` that prints ``pfc_out`` for `dcb -j pfc show dev X`."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "dcb"
    script.write_text("#!/bin/sh\n"
                      f"case \"$2\" in pfc) printf '%s' '{pfc_out}'; exit {rc};; "
                      "apptrust) printf '%s' '{\"order\":[\"dscp\",\"pcp\"]}';; esac\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_read_dcb_with_a_stand_in_binary(tmp_path):
    cfg, errors = read_dcb("p0", _fake_dcb(tmp_path, PFC_JSON))
    assert errors == [] and cfg.pfc_enabled[3] is True and cfg.apptrust == {"order": ["dscp", "pcp"]}
    nd = Netdev(name="p0", path="", ifindex=1, mtu=1500, operstate="up", speed_mbps=None,
                carrier_changes=0, tx_queue_len=None, driver=None, qos_trust=None, stats=None, dcb=cfg)
    assert pfc_priorities(nd) == {3}                 # dcb wins over ethtool-name inference
    garbage, errors = read_dcb("p0", _fake_dcb(tmp_path / "g", "not json"))
    assert garbage is None and errors[0].reason.startswith("garbage")


def test_read_dcb_unsupported_device_is_absent(tmp_path):
    script = tmp_path / "dcb"
    script.write_text("#!/bin/sh\necho 'Attribute read: Operation not supported' >&2\nexit 1\n")
    script.chmod(0o755)
    assert read_dcb("veth0", str(script)) == (None, [])


@pytest.mark.netns
def test_qdisc_inside_namespace_matches_tc():
    require_tool("tc")
    ns = f"{TEST_LAB_PREFIX}cQ{os.getpid() % 1000}"

    def sh(*a):
        return subprocess.run(a, capture_output=True, text=True, check=True, timeout=30)
    try:
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "add", "qA", "type", "veth", "peer", "name", "qB")
        sh("ip", "-n", ns, "link", "set", "qA", "up")
        sh("ip", "-n", ns, "link", "set", "qB", "up")
        sh("tc", "-n", ns, "qdisc", "add", "dev", "qA", "root", "handle", "1:", "htb",
           "default", "10")
        snap = collect(netns=ns)
        tc = json.loads(sh("tc", "-n", ns, "-j", "qdisc", "show", "dev", "qA").stdout)
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    ours = snap.qdisc["qA"]
    assert [(q["kind"], q["handle"]) for q in ours] == [(q["kind"], q["handle"]) for q in tc]
    assert ours[0]["kind"] == "htb" and ours[0]["handle"] == "1:" and ours[0]["parent"] == "root"
    assert snap.netdevs["qA"].link.qdisc == "htb"


# ---- raw rtnetlink reader vs pyroute2 ------------------------------------------------------

def _rta(kind: int, payload: bytes) -> bytes:
    import struct as st
    raw = st.pack("=HH", 4 + len(payload), kind) + payload
    return raw + bytes((-len(raw)) % 4)


def test_raw_link_and_qdisc_parsers_on_crafted_bytes():
    import struct as st

    from collectors import rtnl_raw as r
    stats = st.pack("=25Q", *range(1, 26))
    payload = r.IFINFOMSG.pack(0, 1, 7, 0, 0) + _rta(r.IFLA_IFNAME, b"eth9\0") \
        + _rta(r.IFLA_MTU, st.pack("=I", 9000)) + _rta(r.IFLA_QDISC, b"htb\0") \
        + _rta(r.IFLA_OPERSTATE, b"\x06") + _rta(r.IFLA_STATS64, stats) \
        + _rta(r.IFLA_CARRIER_CHANGES, st.pack("=I", 3)) + _rta(0x8000 | 26, b"")
    link = r.parse_link(payload)
    assert (link["ifindex"], link["name"], link["mtu"], link["qdisc"], link["operstate"],
            link["carrier_changes"]) == (7, "eth9", 9000, "htb", "UP", 3)
    assert link["stats64"]["rx_packets"] == 1 and link["stats64"]["rx_nohandler"] == 24
    q = r.parse_qdisc(r.TCMSG.pack(0, 7, 0x10000, 0xFFFFFFFF, 1) + _rta(r.TCA_KIND, b"tbf\0")
                      + _rta(r.TCA_STATS, st.pack("=QIIIIIII", 100, 2, 5, 1, 0, 0, 0, 0)))
    assert q["kind"] == "tbf" and q["handle"] == 0x10000 and q["stats"]["drops"] == 5
    msg = r.NLMSG.pack(16 + 4, r.NLMSG_ERROR, 0, 9, 0) + st.pack("=i", -1)
    with pytest.raises(OSError):
        r.split_messages(msg, 9)
    done = r.NLMSG.pack(16, r.NLMSG_DONE, 0, 9, 0)
    assert r.split_messages(done, 9) == ([], True)


def test_raw_reader_agrees_with_pyroute2_on_this_host():
    from pyroute2 import IPRoute

    from collectors.netlink_link import read_links, read_links_raw
    from collectors.qdisc import read_qdiscs, read_qdiscs_raw
    with IPRoute() as ipr:
        before, errs1 = read_links_raw()
        ref, errs2 = read_links(ipr)
        after, errs3 = read_links_raw()
        names = {lk.ifindex: n for n, lk in ref.items()}
        q_ref, _ = read_qdiscs(names, ipr)
    q_raw, errs4 = read_qdiscs_raw(names)
    assert errs1 == errs2 == errs3 == errs4 == []
    assert set(before) == set(ref) == set(after)
    for name, lk in ref.items():
        b, a = before[name], after[name]
        assert (b.ifindex, b.mtu, b.qdisc, b.operstate) == (lk.ifindex, lk.mtu, lk.qdisc, lk.operstate)
        for key, value in lk.stats.values.items():
            assert b.stats.values[key] <= value <= a.stats.values[key], (name, key)
    strip = {k: [(q["kind"], q["handle"], q["parent"]) for q in v] for k, v in q_raw.items()}
    assert strip == {k: [(q["kind"], q["handle"], q["parent"]) for q in v] for k, v in q_ref.items()}
