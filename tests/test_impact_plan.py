"""Issue 40: `wanprobe impact` as a training planner — a ring test as its input, the inverse
over combinations, and bad input as one line each (the hour-of-week plans run on a real
Prometheus and a daemon store in tests/test_windows_sources.py; the lab validation against
gloo training in tests/test_plan_gloo.py)."""

from __future__ import annotations

import json

import pytest
from clirun import invoke

from wanprobe.ring import plan
from wanprobe.ring.model import EdgeRun

G = 1e9
ORDER = ["a1", "a2", "b1", "b2"]
RTT = {(a, b): (0.1 if a[0] == b[0] else 130.0) for a in ORDER for b in ORDER if a != b}
JOB = ("impact", "--params", "7e9", "--gpus-per-site", "8", "--compute-ms", "500")


def _ring_file(tmp_path, *, fail=False):
    """A ring measured by site order: WAN edges 0.9 Gbit/s in 4 streams (one 0.15), LAN 9."""
    def run(a, b):
        if a[0] == b[0]:
            return EdgeRun(a, b, 9 * G, (2.25 * G,) * 4)
        rates = (0.15 * G, 0.25 * G, 0.25 * G, 0.25 * G)
        return EdgeRun(a, b, sum(rates), rates, "reset" if fail else None)
    together = [run(a, b) for a, b in plan.ring_edges(ORDER)]
    alone = {k.key: k for k in together if k.src[0] != k.dst[0]}
    res = plan.assemble(ORDER, together, alone, [["a1", "a2"], ["b1", "b2"]], RTT)
    p = tmp_path / "ring.json"
    p.write_text(json.dumps({"measurements": {"ring": res.to_json()}}))
    return p


def one_line(r, needle, code=2):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == code and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle in lines[0], lines
    return lines[0]


def test_a_ring_test_is_the_path_and_gives_the_sites(tmp_path):
    r = invoke(*JOB, "--ring", str(_ring_file(tmp_path)), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    inp = doc["inputs"]
    assert inp["ring"]["order"] == ORDER and inp["sites"] == 2
    assert inp["rtt_p99_s"] == pytest.approx(0.13)
    assert inp["link_bps"] == pytest.approx(0.9 * G)           # the ring's rate, all busy
    assert inp["flow_rate_bps"] == pytest.approx(0.15 * G)     # its slowest flow
    as_is = doc["strategies"][0]
    assert as_is["wan_rate_bps"] == pytest.approx(0.15 * G)     # flat ring: one flow
    hier = next(s for s in doc["strategies"] if s["name"] == "hierarchical")
    assert hier["wan_rate_bps"] == pytest.approx(0.9 * G)       # 8 flows, capped at the ring
    assert all(set(s["components"]) == {"tuning", "topology", "dtype", "compression",
                                        "sync_every", "streaming"} for s in doc["strategies"])
    one_line(invoke(*JOB, "--ring", str(_ring_file(tmp_path)), "--sites", "3"),
             "the ring test found 2 sites")
    one_line(invoke(*JOB, "--ring", str(_ring_file(tmp_path, fail=True))), "failed")


def test_the_inverse_lists_combinations_least_demanding_first():
    r = invoke(*JOB, "--rtt", "130ms", "--sync-every", "100", "--target-utilization", "90%",
               "--json")
    assert r.returncode == 0, r.stderr
    needs = json.loads(r.stdout)["needs"]
    assert needs[0]["name"] == "as-is"
    rates = [n["required_bits_per_second"] for n in needs[1:]]
    known = [x for x in rates if x is not None]
    assert known == sorted(known) and rates[:len(known)] == known
    h100 = {n["name"]: n for n in needs}["sync every 100 steps"]
    # 14 GB flat ring across 16 ranks every 100 steps of 0.5 s, 90 %: 2·15/16·14e9·8 bits in
    # 100·0.5·(0.1/0.9) s less 30 half-RTTs
    budget = 100 * 0.5 * 0.1 / 0.9
    assert h100["required_bits_per_second"] == pytest.approx(
        2 * 15 / 16 * 14e9 * 8 / (budget - 30 * 0.065), rel=1e-3)
    assert all("tuned" not in n["name"] for n in needs)   # a rate is a rate
    r = invoke(*JOB, "--rtt", "130ms", "--sync-every", "100", "--target-utilization", "90%")
    assert r.returncode == 0 and "WAN rate needed" in r.stdout, r.stderr


@pytest.mark.parametrize("args,needle", [
    (("--sync-every", "0"), "--sync-every 0 is outside"),
    (("--sync-every", "100", "--sync-every", "-3"), "--sync-every -3 is outside"),
    (("--topk", "0"), "top-k ratio must lie in (0, 1]"),
    (("--topk", "1.5"), "top-k ratio must lie in (0, 1]"),
    (("--topk", "nan"), "--topk: nan is not a finite number"),
    (("--top", "0"), "--top 0 is outside"),
    (("--dtype", "fp3"), "unknown dtype"),
    (("--lookback", "1000d", "--state-dir", "/nonexistent", "--peer", "p"), "--lookback"),
    (("--prometheus", "ftp://x", "--from-site", "a", "--to-site", "b"), "not an http(s) URL"),
    (("--prometheus", "http://127.0.0.1:9", "--from-site", "a"), "--to-site"),
])
def test_bad_input_is_one_line(args, needle):
    r = invoke(*JOB, "--rtt", "130ms", "--bandwidth", "10gbit", *args)
    one_line(r, needle)


def test_a_report_without_throughput_is_one_line(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({
        "peer": {"address": "usw"},
        "measurements": {"path": {"rtt_ms": {"p50": 120.0, "p99": 130.0}, "loss": {"ratio": 0.001}}},
        "host": {"sysctls": {"net.ipv4.tcp_rmem": "4096 131072 6291456",
                             "net.ipv4.tcp_congestion_control": "cubic"}}}))
    one_line(invoke(*JOB, "--report", str(p)), "measurements.throughput.bits_per_second")
