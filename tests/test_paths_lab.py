"""Multi-path lab tests (issue 16): ECMP over 2 and 4 delay lines with loss on one path; the
per-flow loss must land on exactly the flows whose hop list crosses the bad path. Routers keep
the kernel's default ICMP rate limit (1 error/s per destination after a burst of 6), so the
traces also show that pacing and retries fill every hop instead of reporting silence."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys

import pytest
from conftest import new_lab_name, require_tool
from test_probe_lab import reflector  # `wanprobe reflect` in the lab's namespace b

from wanprobe.lab.multipath import MultipathLab, path_addrs
from wanprobe.lab.settings import LinkSettings
from wanprobe.probe.paths import measure_paths, trace_ports

pytestmark = pytest.mark.netns
PORT = 862


@contextlib.contextmanager
def multipath_lab(paths, **kw):
    lab = MultipathLab(new_lab_name(), paths, **kw)
    try:
        yield lab.up()
    finally:
        lab.down()


def path_of(hops, n_paths):
    """Index of the lab path a hop list crosses (its r2-side address), or None."""
    by_addr = {path_addrs(i)[1]: i for i in range(n_paths)}
    found = {by_addr[h] for h in hops if h in by_addr}
    assert len(found) <= 1
    return found.pop() if found else None


def _loss_lands_on_bad_path(n_paths: int, flows: int):
    with multipath_lab([LinkSettings(rtt_ms=20) for _ in range(n_paths)]) as lab, \
            reflector(lab):
        with lab.a.entered():
            first = asyncio.run(trace_ports(lab.b.addr, PORT, [0] * flows))
        ports = [t.src_port for t in first]
        crossed = [path_of(t.hops, n_paths) for t in first]
        assert None not in crossed, f"a trace did not name its path: {first}"
        bad = crossed[0]   # a path that carries at least one flow
        lab.update_path(bad, loss_ab=0.1)
        with lab.a.entered():
            result = asyncio.run(measure_paths(lab.b.addr, src_ports=ports, count=100,
                                               interval_s=0.02))
        doc = result.to_json()
        forward_lost = {f["src_port"]: f["loss"]["forward_lost"] for f in doc["flows"]}
        on_bad = {f["src_port"] for f in doc["flows"] if path_of(f["hops"], n_paths) == bad}
        # hop lists are complete (pacing + retries beat the ICMP rate limit) and stable
        short = [(f["src_port"], f["hops"], f["reached"]) for f in doc["flows"]
                 if None in f["hops"] or not f["reached"]]
        assert not short, f"traces with a silent hop or not reaching the peer: {short}"
        assert [path_of(f["hops"], n_paths) for f in doc["flows"]] == crossed
        assert on_bad
        if n_paths > 2:   # with 2 paths all 8 flows share one in 1 run of 128: still checked
            assert on_bad != set(ports)
        assert {p for p, lost in forward_lost.items() if lost} == on_bad, (bad, forward_lost)
        s = doc["summary"]
        assert s["differ_loss"] and s["loss_test"]["p_value"] < 0.01
        worst = s["paths"][s["worst_path"]]
        assert set(worst["src_ports"]) == on_bad
        assert 0.04 < worst["forward_ratio"] < 0.2
        assert s["distinct_paths"] == len(set(crossed))


def test_two_paths_loss_on_one():
    _loss_lands_on_bad_path(2, 8)


def test_four_paths_loss_on_one():
    _loss_lands_on_bad_path(4, 8)


@pytest.mark.slow   # the daemon's cable-cut test and the lab CLI test cover reroute by default
def test_reroute_moves_traffic_to_the_long_path():
    paths = [LinkSettings(rtt_ms=20), LinkSettings(rtt_ms=20), LinkSettings(rtt_ms=60)]
    with multipath_lab(paths, ecmp=[0, 1]) as lab, reflector(lab):
        def floor():
            with lab.a.entered():
                r = asyncio.run(measure_paths(lab.b.addr, flows=4, count=10, interval_s=0.01))
            doc = r.to_json()
            return (min(f["rtt_ms"]["min"] for f in doc["flows"]),
                    {path_of(f["hops"], 3) for f in doc["flows"]})
        before, used_before = floor()
        lab.reroute([2])
        after, used_after = floor()
        assert 19 < before < 22 and used_before <= {0, 1}
        assert 59 < after < 62 and used_after == {2}


def test_lab_cli_multipath_reroute_and_path_update():
    name = new_lab_name()
    py = [sys.executable, "-m", "wanprobe", "lab"]

    def run(*args):
        return subprocess.run([*py, *args], capture_output=True, text=True, timeout=60)

    def ping_min_ms(lab):
        out = lab.a.run(["ping", "-c", "3", "-i", "0.1", lab.b.addr], capture_output=True,
                        text=True).stdout
        return float(out.strip().splitlines()[-1].split("=")[1].split("/")[0])

    try:
        r = run("multipath", name, "--paths", "2", "--rtt", "30ms", "--standby-rtt", "70ms",
                "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["active"] == [0, 1]
        lab = MultipathLab.attach(name)
        assert 29.5 < ping_min_ms(lab) < 32
        bad = run("path", name, "7", "--loss", "1%")
        assert bad.returncode == 2 and "paths must be among 0-2" in bad.stderr
        assert "Traceback" not in bad.stderr
        # the two-namespace commands leave a multipath lab of the same name alone
        assert run("up", name).returncode == 3 and run("update", name, "--loss", "1%").returncode == 2
        assert 29.5 < ping_min_ms(lab) < 32
        assert run("path", name, "0", "--queue", "5ms").returncode == 0
        assert MultipathLab.attach(name).paths[0].queue_ms == 5
        assert run("reroute", name).returncode == 0
        assert 69.5 < ping_min_ms(lab) < 72
        assert run("reroute", name, "--via", "x").returncode == 2
    finally:
        down = run("down", name)
    assert down.returncode == 0, down.stderr
    assert run("reroute", name).returncode == 3



def test_probe_flows_spreads_packets_and_reports_per_fingerprint():
    with multipath_lab([LinkSettings(rtt_ms=20), LinkSettings(rtt_ms=20, loss_ab=0.2)]) as lab, \
            reflector(lab):
        r = lab.a.run([sys.executable, "-m", "wanprobe", "probe", lab.b.addr, "--flows", "8",
                       "--count", "400", "--interval", "2ms", "--json"],
                      capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    flows = d["flows"]
    assert len({f["src_port"] for f in flows}) == 8
    assert d["loss"]["sent"] == 400 == sum(f["loss"]["sent"] for f in flows)
    assert d["loss"]["received"] == sum(f["loss"]["received"] for f in flows)
    for f in flows:   # loss exactly where the hop list crosses path 1
        assert f["fingerprint"] and None not in f["hops"]
        assert (f["loss"]["forward_ratio"] > 0) == (path_of(f["hops"], 2) == 1), f
    fps = {p["fingerprint"]: p for p in d["paths"]["paths"]}
    assert set(fps) == {f["fingerprint"] for f in flows}
    assert sum(p["flows"] for p in fps.values()) == 8


@pytest.mark.alone
@pytest.mark.slow
def test_paths_cpu_is_within_twice_one_probe_with_the_same_packets():
    """The loose form of bench/paths_cost.py: CPU seconds (getrusage, not wall time) of
    `paths --flows 16` vs one `probe` sending as many packets at the same aggregate rate."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "paths_cost", Path(__file__).resolve().parent.parent / "bench" / "paths_cost.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with multipath_lab([LinkSettings(rtt_ms=20) for _ in range(4)]) as lab, reflector(lab):
        py = [sys.executable, "-m", "wanprobe"]
        cpu_paths, doc = bench.cpu_of(lab, [*py, "paths", lab.b.addr, "--flows", "16",
                                            "--count", "100", "--interval", "50ms", "--json"])
        cpu_probe, pdoc = bench.cpu_of(lab, [*py, "probe", lab.b.addr, "--count", "1600",
                                             "--interval", "3.125ms", "--json"])
    assert sum(f["loss"]["sent"] for f in doc["flows"]) == pdoc["loss"]["sent"] == 1600
    print(f"\npaths {cpu_paths:.2f} s CPU, probe {cpu_probe:.2f} s CPU, "
          f"ratio {cpu_paths / cpu_probe:.2f}")
    assert cpu_paths <= 2.0 * cpu_probe


def test_silent_router_is_an_unknown_hop_not_loss():
    """r1 never sends time-exceeded (an ICMP-filtering router): its hop is None after the
    retries, the flows still reach the reflector and name their path, and nothing is lost."""
    iptables = require_tool("iptables")
    with multipath_lab([LinkSettings(rtt_ms=10), LinkSettings(rtt_ms=10)]) as lab, reflector(lab):
        r = subprocess.run(["ip", "netns", "exec", lab.ns["r1"], iptables, "-A", "OUTPUT", "-p",
                            "icmp", "--icmp-type", "time-exceeded", "-j", "DROP"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        with lab.a.entered():
            doc = asyncio.run(measure_paths(lab.b.addr, flows=4, count=20, interval_s=0.01,
                                            trace_tries=2, trace_wait_s=0.3)).to_json()
    for f in doc["flows"]:
        assert f["reached"] and f["hops"][0] is None and f["hops"][-1] == lab.b.addr, f
        assert path_of(f["hops"], 2) is not None
        assert f["loss"]["sent"] == 20 and f["loss"]["forward_lost"] == 0 == f["loss"]["reverse_lost"]
        assert f["trace_probes"] >= 4   # TTL 1 was retried before it was given up
    assert not doc["summary"]["differ_loss"]
