"""NCCL settings: GID choice the way NCCL ≥ 2.21 makes it, TC/timeout/socket arithmetic, output
formats, on the synthetic RoCE sysfs tree (tests/fixtures/trees) and copies of it."""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from clirun import invoke
from conftest import FIXTURE_TREES

from tuners.nccl_env import PathFacts, compute, ib_timeout, render, sockets_needed, split_sockets
from tuners.rdma_sysfs import Gid, nccl_gid_index, read_ports

SYNTH = FIXTURE_TREES / "synthetic" / "sys"
DEV = "devices/pci0000:00/0000:00:02.0/0000:17:00.0"


def env_of(variables) -> dict[str, str]:
    return {v.name: v.value for v in variables}


def gid(i: int, text: str, ver: int, ndev: str | None = "eth0") -> Gid:
    return Gid(i, ipaddress.IPv6Address(text), ver, ndev)


@pytest.fixture
def synth_copy(tmp_path: Path) -> Path:
    """A writable copy of the synthetic tree (its flattened symlinks stay valid: relative)."""
    root = tmp_path / "sys"
    shutil.copytree(SYNTH, root, symlinks=True)
    for p in root.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return root


def test_synthetic_tree_reads_and_nccl_picks_roce_v2_ipv4() -> None:
    ports = read_ports(SYNTH)
    assert [(p.device, p.port, p.link_layer, p.active, p.rate_gbps) for p in ports] == [
        ("mlx5_0", 1, "Ethernet", True, 400.0)]
    p = ports[0]
    assert p.netdevs == ("ens1f0np0",)
    assert [(g.index, g.family, g.roce_version) for g in p.gids[:4]] == [
        (0, "AF_INET6", 1), (1, "AF_INET6", 2), (2, "AF_INET", 1), (3, "AF_INET", 2)]
    assert [g.roce_version for g in p.gids[4:]] == [-1] * 4  # unpopulated: type unreadable
    assert nccl_gid_index(p.gids) == 3
    assert nccl_gid_index(p.gids, roce_version=1) == 2
    assert nccl_gid_index(p.gids, addr_family="AF_INET6") == 0  # link-local only: stays at 0
    assert nccl_gid_index(p.gids, addr_range="10.0.10.0/24") == 3
    assert nccl_gid_index(p.gids, addr_range="192.168.0.0/16") == 0


def test_gid_table_like_nccl_issue_1538_picks_7() -> None:
    """show_gids from NVIDIA/nccl#1538: fe80 v1, fe80 v2, ::ffff v1, ::ffff v2 at 4..7 → 7."""
    zero = "::"
    table = [gid(i, zero, -1, None) for i in range(4)] + [
        gid(4, "fe80::a288:c2ff:fe45:9a10", 1), gid(5, "fe80::a288:c2ff:fe45:9a10", 2),
        gid(6, "::ffff:10.156.129.132", 1), gid(7, "::ffff:10.156.129.132", 2)]
    assert nccl_gid_index(table) == 7
    assert not table[4].valid and table[6].valid and table[6].family == "AF_INET"
    assert gid(0, "ff0e::ffff:239.1.1.1", 2).family == "AF_INET"  # v4-mapped multicast
    assert gid(0, "fd00::1", 2).valid and gid(0, "fd00::1", 2).family == "AF_INET6"


def test_roce_env_on_synthetic_tree() -> None:
    v = compute(PathFacts(rtt_ms=130.0, ecmp=True), SYNTH)
    env = env_of(v)
    assert env == {"NCCL_SOCKET_IFNAME": "=ens1f0np0", "NCCL_IB_HCA": "=mlx5_0:1", "NCCL_IB_TC": "106",
                   "NCCL_IB_TIMEOUT": "20", "NCCL_IB_QPS_PER_CONNECTION": "4"}
    assert "NCCL_IB_GID_INDEX" not in env  # NCCL ≥ 2.21 finds index 3 itself
    assert all(x.reason for x in v)
    old = env_of(compute(PathFacts(rtt_ms=130.0), SYNTH, nccl_version=(2, 19)))
    assert old["NCCL_IB_GID_INDEX"] == "3"


def test_gid_index_emitted_when_auto_choice_lands_on_a_vlan(synth_copy: Path) -> None:
    port = synth_copy / DEV / "infiniband/mlx5_0/ports/1"
    (port / "gid_attrs/ndevs/2").write_text("ens1f0np0.100\n")  # the first IPv4 GIDs are the VLAN's
    (port / "gid_attrs/ndevs/3").write_text("ens1f0np0.100\n")
    (port / "gids/5").write_text("0000:0000:0000:0000:0000:ffff:0a00:140b\n")
    (port / "gid_attrs/types/5").write_text("RoCE v2\n")
    (port / "gid_attrs/ndevs/5").write_text("ens1f0np0\n")
    assert nccl_gid_index(read_ports(synth_copy)[0].gids) == 3  # NCCL would pick the VLAN's GID
    v = env_of(compute(PathFacts(iface="ens1f0np0"), synth_copy))
    assert v["NCCL_IB_GID_INDEX"] == "5"
    vlan = env_of(compute(PathFacts(iface="ens1f0np0.100"), synth_copy))
    assert "NCCL_IB_GID_INDEX" not in vlan and vlan["NCCL_SOCKET_IFNAME"] == "=ens1f0np0.100"


def test_tc_without_ect_when_ecn_is_off(synth_copy: Path) -> None:
    net = synth_copy / DEV / "net/ens1f0np0/ecn"
    for sub in ("roce_np", "roce_rp"):
        (net / sub / "enable/3").write_text("0\n")
    assert env_of(compute(PathFacts(), synth_copy))["NCCL_IB_TC"] == "104"
    assert env_of(compute(PathFacts(dscp=24), SYNTH))["NCCL_IB_TC"] == str(24 << 2 | 2)  # prio 3: ECN on
    assert env_of(compute(PathFacts(dscp=34), SYNTH))["NCCL_IB_TC"] == str(34 << 2)  # prio 4: ECN off


def test_ib_timeout_exceeds_four_rtts() -> None:
    assert ib_timeout(130.0) == 17  # 4.096 µs·2^17 = 0.537 s ≥ 0.52 s > 4.096 µs·2^16
    for rtt in (0.01, 1, 35, 130, 300, 5000):
        t = ib_timeout(rtt)
        assert 4.096e-6 * 2**t >= 4 * rtt / 1e3 or t == 31
        assert t == 1 or 4.096e-6 * 2 ** (t - 1) < 4 * rtt / 1e3
    v = env_of(compute(PathFacts(rtt_ms=5000.0), SYNTH))
    assert v["NCCL_IB_TIMEOUT"] == "23"


def test_sockets_for_a_window_limited_tcp_path(tmp_path: Path) -> None:
    facts = PathFacts(iface="eth0", rtt_ms=130.0, link_bps=10e9, tcp_rmem_max=6 * 2**20, tcp_wmem_max=6 * 2**20)
    n, ceiling = sockets_needed(facts)
    assert round(ceiling) == 193583262 and n == 52  # 3 MiB window / 130 ms = 193.6 Mbit/s
    env = env_of(compute(facts, tmp_path))  # no RDMA here: socket transport
    assert (env["NCCL_SOCKET_NTHREADS"], env["NCCL_NSOCKS_PERTHREAD"]) == ("13", "4")
    lossy = PathFacts(rtt_ms=100.0, link_bps=1e9, loss=1e-3, cc="reno", mtu=1500)
    assert sockets_needed(lossy)[0] == 223  # Mathis 4.49 Mbit/s per socket
    env = env_of(compute(lossy, tmp_path))
    assert int(env["NCCL_SOCKET_NTHREADS"]) * int(env["NCCL_NSOCKS_PERTHREAD"]) == 64
    assert "NCCL_SOCKET_NTHREADS" not in env_of(compute(PathFacts(rtt_ms=1.0, link_bps=1e9), tmp_path))


@pytest.mark.parametrize("n", range(1, 65))
def test_split_sockets_product_bounds(n: int) -> None:
    threads, per = split_sockets(n)
    assert 1 <= threads <= 16 and threads * per <= 64 and threads * per >= n


def test_formats_round_trip(tmp_path: Path) -> None:
    v = compute(PathFacts(rtt_ms=130.0, ecmp=True), SYNTH)
    conf = render(v, "nccl.conf")
    pairs = dict(line.split("=", 1) for line in conf.splitlines() if line and not line.startswith("#"))
    assert pairs == env_of(v)  # NCCL's param.cc parser: NAME=VALUE, '#' comments, no quoting
    shell = tmp_path / "nccl.sh"
    shell.write_text(render(v, "shell"))
    out = subprocess.run(["bash", "-c", f"source {shell}; env"], capture_output=True, text=True).stdout
    got = {k: val for k, _, val in (line.partition("=") for line in out.splitlines()) if k.startswith("NCCL_")}
    assert got == env_of(v)
    unit = render(v, "systemd")
    assert '[Service]' in unit and 'Environment="NCCL_IB_TC=106"' in unit
    k8s = render(v, "k8s").splitlines()
    names = [line.split(": ", 1)[1] for line in k8s if line.strip().startswith("- name:")]
    values = [json.loads(line.split(": ", 1)[1]) for line in k8s if line.strip().startswith("value:")]
    assert dict(zip(names, values, strict=True)) == env_of(v)


def test_cli_with_report(tmp_path: Path) -> None:
    rep = {"schema_version": "1.0", "id": "n1", "peer": {"address": "198.18.0.2"},
           "host": {"sysctls": {"net.ipv4.tcp_rmem": "4096 131072 6291456", "net.ipv4.tcp_wmem": "4096 16384 6291456",
                                "net.ipv4.tcp_congestion_control": "bbr"},
                    "ifaces": {"lo": {"mtu": 65536}, "eth9": {"mtu": 1500, "speed_mbps": 10000}}},
           "measurements": {"path": {"rtt_ms": {"p50": 128.0, "p99": 130.0}, "loss": {"ratio": 0.0}}},
           "findings": [{"id": "nccl", "severity": "low", "title": "t", "knobs": [
               {"tuner": "nccl", "key": "NCCL_BUFFSIZE", "value": 8388608, "reason": "BDP per channel > 4 MiB"}]}]}
    (tmp_path / "r.json").write_text(json.dumps(rep))
    r = invoke("nccl-env", "--report", str(tmp_path / "r.json"), "--sys-root", str(tmp_path),
               "--json")
    assert r.returncode == 0, r.stderr
    env = {v["name"]: v["value"] for v in json.loads(r.stdout)["variables"]}
    assert env == {"NCCL_SOCKET_IFNAME": "=eth9", "NCCL_SOCKET_NTHREADS": "13", "NCCL_NSOCKS_PERTHREAD": "4",
                   "NCCL_BUFFSIZE": "8388608"}
    r = invoke("nccl-env", "--format", "yaml")
    assert r.returncode == 2 and "unknown format" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_facts_from_a_diagnose_shaped_report() -> None:
    from tuners.nccl_env import facts_from_report

    rep = {"schema_version": "1.0", "host": {"sysctls": {"net.ipv4.tcp_rmem": "4096 131072 1048576"},
                                             "ifaces": {"lo": {}, "wan0": {"mtu": 1500, "speed_mbps": 10000}}},
           "measurements": {"path": {"rtt_ms": {"min": 60.0, "p50": 60.2, "p99": 62.2}, "loss": {"ratio": 0.001}},
                            "mtu": {"iface": "wan0"}},
           "findings": [{"id": "path.window_limited", "evidence": {"link_rate_bps": 2e8, "link_rate_assumed": False},
                         "knobs": [{"tuner": "dscp", "key": "training", "value": '{"dscp": "AF41", "uid": 0}',
                                    "reason": "mark"}]},
                        {"id": "x.y", "evidence": {"link_rate_bps": 1e10, "link_rate_assumed": True}, "knobs": []}]}
    f = facts_from_report(rep)
    assert (f.iface, f.rtt_ms, f.loss, f.link_bps, f.tcp_rmem_max, f.mtu, f.dscp) == (
        "wan0", 62.2, 0.001, 2e8, 1048576, 1500, 34)
    assert facts_from_report({"schema_version": "1.0"}) == PathFacts()
