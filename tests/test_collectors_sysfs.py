"""sysfs/procfs/ethtool-text collectors on the real-hardware fixture trees (node_exporter,
prometheus/procfs), the labelled synthetic RoCE tree, and trees built from the documented mlx5
names; GID-index selection; bad input reported per counter."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from conftest import FIXTURE_TREES

from collectors.ethtool_text import parse_ethtool_stats, read_ethtool_capture
from collectors.gid import GidEntry, nccl_gid_index, read_gid_table, roce_v2_gid_index
from collectors.procfs_netstat import collect_netstat, parse_proc_net_table
from collectors.snapshot import collect
from collectors.sysfs_infiniband import (
    collect_infiniband,
    hw_counter_width,
    iboe_mtu_bytes,
    parse_rate_gbps,
    parse_state,
)

_spec = importlib.util.spec_from_file_location(
    "mlx5_tree", Path(__file__).parent / "fixtures" / "collectors" / "mlx5_tree.py")
tree = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tree)

NE = FIXTURE_TREES / "node_exporter"
PF = FIXTURE_TREES / "procfs"
SYN = FIXTURE_TREES / "synthetic"


# ---- RDMA ---------------------------------------------------------------------------------

def test_parse_state_and_rate():
    assert parse_state("4: ACTIVE") == (4, "ACTIVE")
    assert parse_state("5: LinkUp") == (5, "LinkUp")
    assert parse_state("garbage") == (None, None)
    assert parse_rate_gbps("100 Gb/sec (4X EDR)") == 100.0
    assert parse_rate_gbps("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_rate_gbps("400 Gb/sec (4X NDR)") == 400.0
    assert parse_rate_gbps("") is None


def test_procfs_mlx5_hw_counters_and_data_words_times_four():
    devs, errors, _ = collect_infiniband(PF / "sys")
    assert errors == []
    port = devs["mlx5_0"].ports[1]
    assert port.state == "ACTIVE" and port.rate_gbps == 25.0 and port.link_layer == "InfiniBand"
    raw = int((PF / "sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data").read_text())
    assert port.counters.get("port_xmit_data") == raw
    assert port.counters.units["port_xmit_data"] == "4-byte words"
    assert port.data_bytes()["xmit"] == raw * 4
    assert len(port.hw_counters.values) == 25
    assert port.hw_counters.get("out_of_sequence") is not None
    assert "lifespan" in port.hw_counters.gauges
    assert port.hw_counters.width("out_of_sequence") == 32
    assert port.roce_v2_gid_index is None                      # InfiniBand: no RoCE GID


def test_node_exporter_no_pma_is_absent_and_counters_ext_preferred():
    devs, errors, _ = collect_infiniband(NE / "sys")
    assert errors == []
    i40 = devs["i40iw0"].ports[1]
    assert i40.counters.values == {}                          # "N/A (no PMA)" → absent, not 0
    mlx4 = devs["mlx4_0"].ports[1]
    ext = int((NE / "sys/class/infiniband/mlx4_0/ports/1/counters_ext/port_xmit_data_64").read_text())
    assert mlx4.data_bytes()["xmit"] == ext * 4


def test_synthetic_roce_port():
    devs, errors, _ = collect_infiniband(SYN / "sys")
    assert errors == []
    port = devs["mlx5_0"].ports[1]
    assert port.link_layer == "Ethernet" and port.netdev == "ens1f0np0"
    assert port.roce_v2_gid_index == 3
    assert port.hw_counters.get("np_cnp_sent") == 899870
    assert port.hw_counters.width("np_cnp_sent") == 64 and port.hw_counters.width("packet_seq_err") == 32
    assert devs["mlx5_0"].info["fw_ver"] == "28.39.1002"


def test_hw_counter_widths_per_driver():
    assert hw_counter_width("rp_cnp_handled") == 64
    assert hw_counter_width("vport_out_of_sequence") == 32
    assert hw_counter_width("cnpSent") == 32 and hw_counter_width("ip4InOctets") == 64
    assert hw_counter_width("oos_drop_count") == 64
    assert hw_counter_width("made_up") is None


def test_iboe_mtu():
    assert [iboe_mtu_bytes(m) for m in (1500, 2200, 4200, 4191, 9000, 300, None)] == \
        [1024, 2048, 4096, 2048, 4096, None, None]


# ---- GID index ----------------------------------------------------------------------------

def _table(rows):
    return [GidEntry(i, g, t, n) for i, (g, t, n) in enumerate(rows)]


MAPPED = "0000:0000:0000:0000:0000:ffff:0a9c:8184"   # ::ffff:10.156.129.132
LL = "fe80:0000:0000:0000:0ac0:ebff:fe9e:d1e4"
ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"


def test_gid_index_gh1538_table_is_7():
    rows = [(ZERO, None, None)] * 4 + [(LL, "IB/RoCE v1", "eth2"), (LL, "RoCE v2", "eth2"),
                                       (MAPPED, "IB/RoCE v1", "eth2"), (MAPPED, "RoCE v2", "eth2")]
    assert roce_v2_gid_index(_table(rows)) == 7
    assert nccl_gid_index(_table(rows), roce_version=1) == 6


def test_gid_index_skips_unreadable_einval_entries_and_other_netdevs():
    rows = [(LL, "IB/RoCE v1", "p0"), (LL, "RoCE v2", "p0"),
            (MAPPED, None, None),                         # type read failed (EINVAL)
            (MAPPED, "RoCE v2", "p0.100"),               # VLAN netdev
            (MAPPED.replace("8184", "8185"), "RoCE v2", "p0")]
    t = _table(rows)
    assert roce_v2_gid_index(t, "p0") == 4
    assert roce_v2_gid_index(t, "p0.100") == 3
    assert roce_v2_gid_index(t, "nope") is None
    assert roce_v2_gid_index(_table([(LL, "RoCE v2", "p0")])) is None    # link-local only


def test_gid_index_addr_range_and_ipv6():
    v6 = "2001:0db8:0000:0000:0000:0000:0000:0001"
    rows = [(LL, "RoCE v2", "p0"), (MAPPED, "RoCE v2", "p0"), (v6, "RoCE v2", "p0")]
    t = _table(rows)
    assert roce_v2_gid_index(t) == 1
    assert roce_v2_gid_index(t, addr_range="10.0.0.0/8") == 1
    assert roce_v2_gid_index(t, addr_range="192.168.0.0/16") is None
    assert roce_v2_gid_index(t, addr_family="AF_INET6") == 2


def test_gid_table_read_from_built_tree(tmp_path):
    pdir = tree.add_rdma_port(tmp_path / "sys", "mlx5_0", 1, "ens1f0np0")
    tree.add_netdev(tmp_path / "sys", "ens1f0np0")
    entries = read_gid_table(pdir)
    assert [e.index for e in entries] == list(range(8))
    assert entries[5].type is None and entries[3].type == "RoCE v2"
    devs, _, _ = collect_infiniband(tmp_path / "sys")
    assert devs["mlx5_0"].ports[1].roce_v2_gid_index == 3
    assert devs["mlx5_0"].ports[1].gid_index_by_netdev == {"ens1f0np0": 3}


# ---- netdevs, ECN, ethtool text ----------------------------------------------------------

def test_node_exporter_netdevs_and_bonding_masters_skipped():
    snap = collect(NE / "sys", NE / "proc")
    assert set(snap.netdevs) == {"bond0", "dmz", "eth0", "int"}
    assert snap.netdevs["eth0"].mtu == 1500 and snap.netdevs["eth0"].speed_mbps == 1000
    assert snap.netdevs["eth0"].stats is None            # no statistics/ in that capture: absent


def test_ofed_ecn_tree():
    snap = collect(PF / "sys", PF / "proc")
    ecn = snap.netdevs["eth0"].ecn
    assert ecn.enabled_on("roce_np", 3) is True and ecn.enabled_on("roce_np", 2) is False
    assert ecn.params["roce_np"]["cnp_dscp"] == 48 and ecn.params["roce_np"]["cnp_802p_prio"] == 6
    assert ecn.params["roce_rp"]["dce_tcp_g"] == 1019
    assert collect(NE / "sys", NE / "proc").netdevs["eth0"].ecn is None


def test_ethtool_text_captures_per_vendor():
    e1000e, errs = read_ethtool_capture(NE / "ethtool", "eth0")
    assert errs == [] and e1000e.get("rx_packets") == 1260062
    assert e1000e.get("duplicate metric") == 1 and e1000e.get("duplicate_metric") == 2
    bnxt, _ = read_ethtool_capture(SYN / "ethtool", "bnxt0")
    assert bnxt.get("pfc_pri3_rx_duration_us") == 51234 and bnxt.units["pfc_pri3_rx_duration_us"] == "us"
    ice, _ = read_ethtool_capture(SYN / "ethtool", "ice0")
    assert ice.get("rx_priority_3_xoff.nic") == 3301
    none, errs = read_ethtool_capture(SYN / "ethtool", "absent0")
    assert none is None and errs == []


def test_ethtool_text_repeated_names_kept():
    pairs, errs = parse_ethtool_stats("NIC statistics:\n     a: 1\n     a: 2\n     [0]: rx: 5\n")
    assert errs == [] and pairs == [("a", 1), ("a", 2), ("[0]: rx", 5)]


# ---- procfs -------------------------------------------------------------------------------

def test_procfs_netstat_fixtures():
    for root, retrans in ((PF / "proc", 348), (NE / "proc", 227)):
        groups, errors, _ = collect_netstat(root)
        assert errors == []
        tcp = groups["tcp"]
        assert tcp.get("RetransSegs") == retrans
        assert tcp.get("MaxConn") == -1 and "MaxConn" in tcp.gauges
        assert tcp.get("TCPTimeouts") is not None and tcp.get("ListenDrops") is not None
        assert groups["ip"].get("InOctets") is not None   # IpExt (netstat) merged with Ip (snmp)


def test_procfs_on_this_kernel():
    groups, errors, _ = collect_netstat(Path("/proc"))
    assert errors == []
    for key in ("RetransSegs", "OutSegs", "InSegs", "TCPLostRetransmit", "TCPTimeouts",
                "TCPSynRetrans", "TCPBacklogDrop", "ListenDrops", "ListenOverflows"):
        assert key in groups["tcp"].values, key
    assert "RcvbufErrors" in groups["udp"].values and "InECT0Pkts" in groups["ip"].values


# ---- bad input ----------------------------------------------------------------------------

def test_bad_counter_files_reported_per_counter_rest_collected(tmp_path):
    sysr = tmp_path / "sys"
    pdir = tree.add_rdma_port(sysr, "mlx5_0", 1, "p0", hw={"out_of_sequence": 7})
    nd = tree.add_netdev(sysr, "p0", stats={"rx_bytes": 5, "tx_bytes": 6, "rx_errors": 0})
    (pdir / "hw_counters" / "packet_seq_err").write_text("")                 # truncated
    (pdir / "hw_counters" / "duplicate_request").write_text("12abc\n")       # garbage
    (pdir / "hw_counters" / "local_ack_timeout_err").write_bytes(b"\xff\xfe\x00")  # binary
    (pdir / "hw_counters" / "np_cnp_sent").unlink()
    (pdir / "hw_counters" / "np_cnp_sent").mkdir()                           # unreadable
    (nd / "statistics" / "tx_bytes").write_text("lots\n")
    (nd / "mtu").write_text("")
    tree.add_proc(tmp_path / "proc")
    snap = collect(sysr, tmp_path / "proc")
    bad = {e.counter: e.reason for e in snap.errors}
    assert bad["packet_seq_err"].startswith("truncated")
    assert bad["duplicate_request"].startswith("not an integer")
    assert bad["local_ack_timeout_err"].startswith("garbage")
    assert bad["np_cnp_sent"].startswith("unreadable")
    assert bad["tx_bytes"].startswith("not an integer") and bad["mtu"].startswith("truncated")
    hw = snap.rdma["mlx5_0"].ports[1].hw_counters
    assert hw.get("out_of_sequence") == 7 and hw.get("packet_seq_err") is None
    assert snap.netdevs["p0"].stats.get("rx_bytes") == 5 and snap.netdevs["p0"].mtu is None
    assert any(s.status == "error" for s in snap.sources)


def test_proc_net_truncated_and_garbage():
    text = "Tcp: RtoAlgorithm RtoMin RetransSegs OutSegs\nTcp: 1 200 x9\nUdp: InDatagrams\n"
    tables, errors = parse_proc_net_table(text, "/p/net/snmp")
    assert tables["Tcp"] == {"RtoAlgorithm": 1, "RtoMin": 200}
    reasons = {e.counter: e.reason for e in errors}
    assert reasons["Tcp.RetransSegs"].startswith("not an integer")
    assert reasons["Tcp.OutSegs"].startswith("truncated")
    assert any(e.reason == "truncated: no values for Udp" for e in errors)


def test_ethtool_text_bad_input(tmp_path):
    garbage, errs = read_ethtool_capture(NE / "ethtool", "bond0")   # file says "ERROR: 1"
    assert garbage is None and errs[0].reason.startswith("garbage")
    pairs, errs = parse_ethtool_stats("NIC statistics:\n     rx_ok: 5\n     rx_bad: 1e3\n"
                                      "     rx_trunc:\n     rx_pack")
    assert pairs == [("rx_ok", 5)]
    assert [e.reason.split(":")[0] for e in errs] == ["not an integer", "truncated",
                                                      "truncated line 'rx_pack'"]


def test_missing_roots_are_absent_not_errors(tmp_path):
    snap = collect(tmp_path / "nosys", tmp_path / "noproc")
    assert snap.rdma == {} and snap.netdevs == {} and snap.tcp is None
    assert snap.errors == ()
    assert {s.status for s in snap.sources} == {"no_data"}


def test_unreadable_dir_for_root_counters_does_not_raise(tmp_path):
    sysr = tmp_path / "sys"
    pdir = tree.add_rdma_port(sysr, "mlx5_0", 1, "p0")
    os.replace(pdir / "counters", tmp_path / "moved")
    (pdir / "counters").write_text("not a dir\n")
    tree.add_proc(tmp_path / "proc")
    snap = collect(sysr, tmp_path / "proc")
    assert snap.rdma["mlx5_0"].ports[1].hw_counters.get("out_of_sequence") == 0
    assert any(e.path.endswith("counters") for e in snap.errors)


@pytest.mark.parametrize("root", [NE, PF, SYN])
def test_json_shape_on_every_fixture(root):
    snap = collect(root / "sys", (root if (root / "proc").exists() else PF) / "proc")
    j = snap.to_json()
    for dev in j["rdma"].values():
        for port in dev["ports"].values():
            assert {"state", "rate", "link_layer", "counters", "hw_counters",
                    "roce_v2_gid_index"} <= set(port)
    for nd in j["netdevs"].values():
        assert {"mtu", "stats", "ethtool"} <= set(nd)
    assert isinstance(j["errors"], list) and isinstance(j["tcp"], dict)
