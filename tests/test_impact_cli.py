"""`wanprobe impact` end to end: JSON contract, human output, candidate ranking, bad input."""

import json

import pytest
from clirun import invoke

BASE = ["impact", "--params", "70e9", "--gpus-per-site", "8", "--sites", "2"]
PATH = ["--rtt", "130ms", "--bandwidth", "10gbit", "--loss", "0.1%"]


def run_subprocess(*args):
    return invoke(*args)


@pytest.fixture
def run():
    """Run the CLI in this process (CliRunner): same entry point and error handling as the binary."""
    return invoke


def one_line_error(r, code=None):
    assert r.returncode != 0
    if code is not None:
        assert r.returncode == code
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "error" in lines[0] and "Traceback" not in r.stderr
    return lines[0]


def test_json_contract_and_hand_value(run):
    r = run(*BASE, *PATH, "--compute-ms", "900", "--gpu-hour-cost", "2.5", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    names = [s["name"] for s in doc["strategies"]]
    assert names[0] == "as-is" and "tuned hosts" in names and "int8 gradients" in names
    for s in doc["strategies"]:
        for key in ("name", "collective", "comm_time_s", "step_time_s", "gpu_idle_share",
                    "idle_cost_per_day"):
            assert key in s
        assert s["step_time_s"] >= 0.9
        assert 0 <= s["gpu_idle_share"] <= 1
    inp = doc["inputs"]
    assert inp["rtt_p99_s"] == pytest.approx(0.13) and inp["gradient_bytes"] == 140e9
    assert "slowest" in inp["basis"]
    # as-is: one CUBIC flow at 0.1 % loss, 130 ms is in CUBIC's own region (above Mathis'
    # 3.451 Mbit/s): 1.0538·0.13^¾/0.001^¾ = 40.57 packets per RTT → 3.615 Mbit/s;
    # flat ring over 16 ranks
    as_is = doc["strategies"][0]
    flow = (0.4 * 3.7 / 1.2) ** 0.25 * 0.13 ** 0.75 / 0.001 ** 0.75 * 1448 * 8 / 0.13
    assert flow == pytest.approx(3.615e6, rel=1e-3)
    assert inp["flow_rate_bps"] == pytest.approx(flow, rel=1e-6)
    assert as_is["comm_time_s"] == pytest.approx(2 * 15 / 16 * 140e9 * 8 / flow + 30 * 0.065, rel=1e-6)
    assert as_is["idle_cost_per_day"] == pytest.approx(as_is["gpu_idle_share"] * 16 * 24 * 2.5)


def test_human_output_says_slowest_link_and_draws_chart(run):
    r = run(*BASE, *PATH, "--compute-ms", "900", "--overlap", "0.5")
    assert r.returncode == 0, r.stderr
    assert "slowest link" in r.stdout and "p99 RTT 130.0 ms" in r.stdout
    assert "step time by strategy" in r.stdout and "█" in r.stdout
    assert "tuned hosts" in r.stdout


def test_without_compute_prints_comm_only(run):
    r = run(*BASE, *PATH, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert all(s["step_time_s"] is None and s["comm_time_s"] > 0 for s in doc["strategies"])


def _write_report(tmp_path, name, rtt_p99, bps, loss=0.0):
    doc = {"peer": {"address": name},
           "measurements": {"path": {"rtt_ms": {"p50": rtt_p99 / 2, "p99": rtt_p99}, "loss": {"ratio": loss}},
                            "throughput": {"bits_per_second": bps}},
           "host": {"sysctls": {"net.ipv4.tcp_rmem": "4096 131072 6291456",
                                "net.ipv4.tcp_congestion_control": "cubic"}}}
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(doc))
    return p


def test_reports_rank_candidate_sites(run, tmp_path):
    far = _write_report(tmp_path, "uswest", 140.0, 50e6)
    near = _write_report(tmp_path, "tokyo", 36.0, 900e6)
    r = run("impact", "--params", "7e9", "--report", str(far), "--report", str(near),
            "--bandwidth", "10gbit", "--compute-ms", "900", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [c["site"] for c in doc["candidates"]] == ["tokyo", "uswest"]
    assert doc["candidates"][0]["rank"] == 1
    # the joint job waits for the slowest peer: p99 140 ms and 50 Mbit/s per flow
    assert doc["inputs"]["rtt_p99_s"] == pytest.approx(0.14)
    assert doc["inputs"]["flow_rate_bps"] == pytest.approx(50e6)
    h = run("impact", "--params", "7e9", "--report", str(far), "--report", str(near),
            "--bandwidth", "10gbit", "--compute-ms", "900")
    assert h.returncode == 0 and "candidate sites" in h.stdout


def test_report_missing_key_is_one_line(run, tmp_path):
    p = _write_report(tmp_path, "x", 50.0, 1e8)
    doc = json.loads(p.read_text())
    del doc["measurements"]["path"]["loss"]
    p.write_text(json.dumps(doc))
    line = one_line_error(run(*BASE, "--report", str(p)))
    assert "measurements.path.loss" in line
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "not JSON" in one_line_error(run(*BASE, "--report", str(bad)))
    assert "cannot read" in one_line_error(run(*BASE, "--report", str(tmp_path / "missing.json")))


@pytest.mark.parametrize("args, needle", [
    (["impact", "--params", "0", *PATH], "--params"),
    (["impact", "--params", "-7e9", *PATH], "--params"),
    ([*BASE, *PATH, "--dtype", "fp8"], "dtype"),
    ([*BASE, "--rtt", "0ms", "--bandwidth", "10gbit"], "duration"),
    ([*BASE, "--rtt", "130ms", "--bandwidth", "-1gbit"], "rate"),
    ([*BASE, "--rtt", "130ms", "--bandwidth", "10gbit", "--loss", "150%"], "ratio"),
    (["impact", "--params", "7e9", "--sites", "0", *PATH], "--sites"),
    (["impact", "--params", "7e9", "--gpus-per-site", "-8", *PATH], "--gpus-per-site"),
    ([*BASE, *PATH, "--overlap", "0.5"], "--compute-ms"),
    ([*BASE, *PATH, "--gpu-hour-cost", "3"], "--compute-ms"),
    ([*BASE, *PATH, "--compute-ms", "0"], "--compute-ms"),
    ([*BASE, *PATH, "--compute-ms", "900", "--overlap", "1.5"], "overlap"),
    ([*BASE, *PATH, "--cc", "vegas"], "congestion control"),
    ([*BASE, "--bandwidth", "10gbit"], "--rtt"),
])
def test_bad_input_is_one_line_error(run, args, needle):
    line = one_line_error(run(*args))
    assert needle in line


def test_end_to_end_binary():
    ok = run_subprocess(*BASE, *PATH, "--compute-ms", "900", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["strategies"][0]["name"] == "as-is"
    bad = run_subprocess(*BASE, *PATH, "--dtype", "fp3")
    assert bad.returncode == 2
    assert "dtype" in one_line_error(bad)


@pytest.mark.parametrize("option,value", [("--gpus-per-site", "100000000000"),
                                          ("--sites", "100000000000"), ("--params", "1e300"),
                                          ("--sync-every", "100000000000"),
                                          ("--compute-ms", "1e300")])
def test_a_job_no_cluster_can_be_is_refused(option, value):
    """Issue 19: `--gpus-per-site 1e11` was modelled; a figure beyond any real job is a typo."""
    argv = ["impact", "--rtt", "130ms", "--bandwidth", "10gbit", "--loss", "0.1%",
            "--params", "70e9", "--compute-ms", "900", option, value]
    r = invoke(*argv)
    assert r.returncode == 2 and option in one_line_error(r) and "outside" in r.stderr
