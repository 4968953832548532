"""NCCL across datacenters (issue 24): on a two-site report, sockets are sized from the slowest
measured ECMP flow of `wanprobe paths --json`, not the average; RoCE hosts get a fabric id per
NIC by site in NCCL_IB_HCA, NCCL_ALLNET_ENABLE and NCCL_SCATTER_XDC (NCCL ≥ 2.27), QPs from the
measured paths and the timeout and buffer from the measured RTT; each with its reason."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from clirun import invoke, one_line_error
from conftest import FIXTURE_TREES

from tuners.nccl_env import PathFacts, compute, split_sockets
from tuners.nccl_xdc import JobSites, flows_from_paths
from wanprobe.models.tcp_rate import cc_limited_rate_bps

SYNTH = FIXTURE_TREES / "synthetic" / "sys"  # one active RoCE port, mlx5_0 at 400 Gbit/s
RTT_MS = 20.0
LINK_BPS = 1e9
# four flows, each on its own path: two clean, two with a little loss (unequal rates)
FLOW_LOSS = (0.0, 0.0, 2e-5, 1e-4)

MESH = """representatives = 1
[sites.tpe]
hosts = [{ name = "tpe-1", address = "198.18.0.1" }]
[sites.tyo]
hosts = [{ name = "tyo-1", address = "198.18.0.2" }]
"""


def report() -> dict:
    return {"schema_version": "1.1", "id": "x24", "peer": {"address": "198.18.0.2", "port": 862},
            "host": {"sysctls": {"net.ipv4.tcp_rmem": "4096 131072 67108864",
                                 "net.ipv4.tcp_wmem": "4096 131072 67108864",
                                 "net.ipv4.tcp_congestion_control": "cubic"},
                     "ifaces": {"wan0": {"mtu": 1500}}},
            "measurements": {"path": {"method": "stamp",
                                      "rtt_ms": {"min": 19.8, "p50": 19.9, "p99": RTT_MS},
                                      "loss": {"sent": 400, "received": 400, "ratio": 0.0},
                                      "capacity_bits_per_second": LINK_BPS,
                                      "capacity_source": "operator (--link-rate)"},
                             "mtu": {"iface": "wan0", "path_mtu": 1500}},
            "findings": []}


def paths_doc() -> dict:
    """`wanprobe paths --json` as probe/paths.py writes it (flows[]: src_port, path, rtt_ms,
    loss), 400 probes per flow."""
    flows = []
    for i, loss in enumerate(FLOW_LOSS):
        lost = round(400 * loss)
        flows.append({"src_port": 40000 + i, "hops": [f"198.18.9.{i}", "198.18.0.2"],
                      "path": i, "rtt_ms": {"min": 19.8, "p50": 19.9, "p99": RTT_MS},
                      "loss": {"sent": 400, "received": 400 - lost, "ratio": loss},
                      "jitter_ms": 0.1})
    return {"peer": "198.18.0.2", "port": 862, "flows": flows,
            "summary": {"distinct_paths": 4, "paths": []}}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {"report": tmp_path / "r.json", "paths": tmp_path / "p.json", "mesh": tmp_path / "m.toml"}
    out["report"].write_text(json.dumps(report()))
    out["paths"].write_text(json.dumps(paths_doc()))
    out["mesh"].write_text(MESH)
    return out


def nccl_env(files, *args: str) -> dict:
    r = invoke("nccl-env", "--report", files["report"], "--mesh", files["mesh"], "--site", "tpe",
               "--paths", files["paths"], "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_two_site_sockets_sized_from_the_slowest_ecmp_flow(files, tmp_path):
    doc = nccl_env(files, "--transport", "socket", "--sys-root", str(tmp_path),
                   "--nccl-version", "2.27")
    env = {v["name"]: v for v in doc["variables"]}
    # one socket on each flow: the window (64 MiB) is not the bound at 20 ms, the loss is
    per_flow = [min(LINK_BPS, cc_limited_rate_bps("cubic", LINK_BPS, 1448, RTT_MS / 1e3, p))
                if p else LINK_BPS for p in FLOW_LOSS]
    assert len(set(per_flow)) == 3  # unequal rates
    slowest = math.ceil(LINK_BPS / min(per_flow))
    average = math.ceil(LINK_BPS / (sum(per_flow) / len(per_flow)))
    assert (slowest, average) == (15, 2)  # the average would hide the lossy path
    threads, per = int(env["NCCL_SOCKET_NTHREADS"]["value"]), int(env["NCCL_NSOCKS_PERTHREAD"]["value"])
    assert (threads, per) == split_sockets(slowest) and slowest <= threads * per <= 64
    why = env["NCCL_SOCKET_NTHREADS"]["reason"]
    assert "slowest of 4 measured ECMP flows" in why and "source port 40003" in why
    assert "nccl-tests#83" in why
    # no RDMA port here: the cross-datacenter RDMA settings are not set, and a note says why
    assert "NCCL_IB_HCA" not in env and "NCCL_ALLNET_ENABLE" not in env
    assert any("sockets only" in n for n in doc["notes"])
    # without the flows the same report needs one socket: the flows made the difference
    alone = invoke("nccl-env", "--report", files["report"], "--transport", "socket",
                   "--sys-root", str(tmp_path), "--json")
    assert "NCCL_SOCKET_NTHREADS" not in alone.stdout


def test_roce_across_sites_fabric_ids_allnet_scatter_qps_timeout(files):
    roce = ("--sys-root", str(SYNTH), "--iface", "ens1f0np0")  # the RoCE port's netdev
    doc = nccl_env(files, *roce, "--nccl-version", "2.27")
    env = {v["name"]: v["value"] for v in doc["variables"]}
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1:0"           # tpe is DC 0, one rail
    assert env["NCCL_ALLNET_ENABLE"] == "1" and env["NCCL_SCATTER_XDC"] == "1"
    assert env["NCCL_IB_QPS_PER_CONNECTION"] == "4"      # 4 measured paths
    assert env["NCCL_IB_TIMEOUT"] == "20"                # 4 × 20 ms is far inside 4.3 s
    reasons = {v["name"]: v["reason"] for v in doc["variables"]}
    assert "NCCL ≥ 2.27" in reasons["NCCL_IB_HCA"] and "DC_ID 0 of tpe, tyo" in reasons["NCCL_IB_HCA"]
    assert "NCCL ≥ 2.27" in reasons["NCCL_ALLNET_ENABLE"] and "4 distinct ECMP paths" in \
        reasons["NCCL_IB_QPS_PER_CONNECTION"]
    # the same job seen from tyo (its peer is in tpe): tyo is DC 1 in the mesh's order
    back = report() | {"peer": {"address": "198.18.0.1", "port": 862}}
    files["report"].write_text(json.dumps(back))
    far = invoke("nccl-env", "--report", files["report"], "--mesh", files["mesh"], "--site", "tyo",
                 *roce, "--nccl-version", "2.28", "--json")
    assert {v["name"]: v["value"] for v in json.loads(far.stdout)["variables"]}[
        "NCCL_IB_HCA"] == "=mlx5_0:1:1"
    same = invoke("nccl-env", "--report", files["report"], "--mesh", files["mesh"], "--site", "tpe",
                  *roce, "--nccl-version", "2.28", "--json")  # one site: no fabric ids
    assert {v["name"]: v["value"] for v in json.loads(same.stdout)["variables"]}[
        "NCCL_IB_HCA"] == "=mlx5_0:1"
    files["report"].write_text(json.dumps(report()))
    old = nccl_env(files, *roce, "--nccl-version", "2.21")
    names = {v["name"] for v in old["variables"]}
    assert "NCCL_ALLNET_ENABLE" not in names and "NCCL_SCATTER_XDC" not in names
    assert any("NCCL ≥ 2.27" in n for n in old["notes"]) and "# note:" in old["text"]


def test_fabric_ids_per_rail_and_site():
    ports = [("mlx5_0", 1, 400.0), ("mlx5_1", 1, 400.0), ("mlx5_2", 1, 400.0), ("mlx5_3", 1, 400.0)]
    from tuners.nccl_xdc import xdc_settings

    out, _ = xdc_settings(ports, JobSites(("a", "b", "c"), "c"), (2, 27))
    got = dict((n, v) for n, v, _ in out)
    assert got["NCCL_IB_HCA"] == "=mlx5_0:1:8,mlx5_1:1:9,mlx5_2:1:10,mlx5_3:1:11"  # 2 × 4 + rail
    scatter = next(r for n, _, r in out if n == "NCCL_SCATTER_XDC")
    assert "1600 Gbit/s" in scatter and "400 Gbit/s per NIC" in scatter
    assert xdc_settings(ports, JobSites(("a",), "a"), (2, 27)) == ([], [])


def test_a_dead_flow_is_named_and_caps_at_64(tmp_path):
    doc = paths_doc()
    doc["flows"][2]["loss"] = {"sent": 400, "received": 0, "ratio": 1.0}
    doc["flows"][2]["rtt_ms"] = None
    f = PathFacts(iface="wan0", rtt_ms=RTT_MS, link_bps=LINK_BPS, cc="cubic",
                  flows=flows_from_paths(doc))
    env = {v.name: v for v in compute(f, tmp_path)}
    assert int(env["NCCL_SOCKET_NTHREADS"].value) * int(env["NCCL_NSOCKS_PERTHREAD"].value) == 64
    assert "source port 40002" in env["NCCL_SOCKET_NTHREADS"].reason


def test_bad_inputs_are_one_line(files, tmp_path):
    (tmp_path / "empty.json").write_text('{"flows": []}')
    for args, text in [(("--paths", tmp_path / "empty.json"), "no flows"),
                       (("--site", "tpe"), "--site needs --mesh"),
                       (("--report", files["report"], "--mesh", files["mesh"], "--site", "mars"),
                        "not a site"),
                       (("--mesh", files["mesh"]), "--mesh needs --report")]:
        assert text in one_line_error(invoke("nccl-env", "--sys-root", tmp_path, *args))
    # this host is not in the mesh: --site is asked for
    r = invoke("nccl-env", "--report", files["report"], "--mesh", files["mesh"],
               "--sys-root", tmp_path)
    assert "pass --site" in one_line_error(r)
