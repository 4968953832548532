"""Training-impact model: step time, idle share, cost and strategies against hand arithmetic."""

import re
from dataclasses import replace

import pytest

from wanprobe.errors import ConfigError, UsageError
from wanprobe.models import impact as m
from wanprobe.models import strategy
from wanprobe.models.impact_inputs import slowest
from wanprobe.report.impact_reader import candidate_from_report, planned_settings


def test_gradient_bytes():
    assert m.gradient_bytes(100e9, "bf16") == 200e9
    assert m.gradient_bytes(70e9, "fp32") == 280e9
    assert m.gradient_bytes(70e9, "int8") == 70e9
    with pytest.raises(UsageError, match="dtype"):
        m.gradient_bytes(70e9, "fp8")
    with pytest.raises(UsageError):
        m.gradient_bytes(0, "bf16")
    with pytest.raises(UsageError):
        m.gradient_bytes(-1e9, "bf16")


def test_step_time_definition():
    assert m.step_time_s(0.9, 0.3, 0.0) == pytest.approx(1.2)        # compute + comm
    assert m.step_time_s(0.9, 0.3, 1.0) == pytest.approx(0.9)        # max(compute, comm)
    assert m.step_time_s(0.9, 2.0, 1.0) == pytest.approx(2.0)
    assert m.step_time_s(0.9, 1.0, 0.5) == pytest.approx(1.4)        # 0.5 s of comm hidden
    assert m.step_time_s(0.2, 1.0, 0.5) == pytest.approx(1.0)        # hides at most the compute
    with pytest.raises(UsageError, match="compute"):
        m.step_time_s(None, 1.0)
    with pytest.raises(UsageError, match="overlap"):
        m.step_time_s(0.9, 1.0, 1.5)


def test_idle_share_and_cost():
    # step 1.2 s with 0.9 s compute: 25 % idle; 16 GPUs · 24 h · $2.5 · 0.25 = $240/day
    idle = m.gpu_idle_share(0.9, 1.2)
    assert idle == pytest.approx(0.25)
    assert m.idle_cost_per_day(idle, 16, 2.5) == pytest.approx(240.0)


def _by_name(results):
    return {r.name: r for r in results}


def _strategies(job, path, options=None):
    options = options or m.Options()
    return strategy.strategies(job, strategy.network(job, path, options), options)


def test_strategies_hand_values():
    # 1e9 params bf16 = 2 GB; 2 sites × 8 GPUs; link 1 Gbit/s, RTT 100 ms, no loss, window
    # 2 MiB per flow → one flow 167.8 Mbit/s; flat ring: 2·15/16·2e9·8/167.8e6 + 30·0.05 s.
    job = m.Job(params=1e9, dtype="bf16", sites=2, gpus_per_site=8, compute_s=1.0,
                gpu_hour_cost=2.0, local_rate_bps=400e9)
    path = m.Path(rtt_s=0.1, link_bps=1e9, loss=0.0, cc="cubic", window_bytes=2 * 2**20)
    res = _by_name(_strategies(job, path))
    flow = 2 * 2**20 * 8 / 0.1
    as_is = 2 * 15 / 16 * 2e9 * 8 / flow + 30 * 0.05
    assert res["as-is"].comm_time_s == pytest.approx(as_is)
    assert res["as-is"].step_time_s == pytest.approx(1.0 + as_is)
    assert res["as-is"].gpu_idle_share == pytest.approx(as_is / (1.0 + as_is))
    assert res["as-is"].idle_cost_per_day == pytest.approx(as_is / (1 + as_is) * 16 * 24 * 2.0)
    # tuned hosts: BDP-sized windows, the flow fills the 1 Gbit/s link
    assert res["tuned hosts"].comm_time_s == pytest.approx(2 * 15 / 16 * 16.0 + 1.5)
    # hierarchical: 8 flows of 167.8 Mbit/s capped at 1 Gbit/s; WAN term 2e9·8/1e9 = 16 s
    h = res["hierarchical"]
    assert h.wan_rate_bps == pytest.approx(1e9)
    assert h.comm_time_s == pytest.approx(2 * (7 / 8 * 16e9 / 400e9 + 7 * 10e-6) + 16.0 + 2 * 0.05)
    # int8: half the bytes of bf16
    assert res["int8 gradients"].bytes_per_sync == 1e9
    assert "fp16 gradients" not in res  # same size as bf16
    # sync every 500 steps: comm / 500
    assert res["sync every 500 steps"].comm_time_s == pytest.approx(as_is / 500)
    # top-k 1 %: 1e9·0.01·(2+4) = 60 MB all-gathered, hierarchical over 8 flows: 60e6·8/1e9 + 0.05
    assert res["hierarchical + top-k 0.01"].comm_time_s == pytest.approx(0.48 + 0.05)
    # flat, one flow of 167.8 Mbit/s: 60e6·8/167.8e6 + 0.05
    assert res["top-k 0.01"].comm_time_s == pytest.approx(60e6 * 8 / flow + 0.05)
    # combined: tuned hosts + hierarchical every 500 steps: (hierarchical at 1 Gbit/s) / 500
    both = res["tuned hosts + hierarchical + sync every 500 steps"]
    assert both.comm_time_s == pytest.approx(h.comm_time_s / 500)
    assert both.step_time_s == pytest.approx(1.0 + h.comm_time_s / 500)
    # streamed: the sync (16.1 s) fits in 500 steps of 1 s compute: fully hidden
    streamed = res["tuned hosts + hierarchical + sync every 500 steps + streamed"]
    assert streamed.step_time_s == 1.0 and streamed.gpu_idle_share == 0.0
    assert streamed.hidden_comm_s == pytest.approx(h.comm_time_s / 500)
    assert streamed.components == {"tuning": "tuned", "topology": "hierarchical",
                                   "dtype": "bf16", "compression": None, "sync_every": 500,
                                   "streaming": True}
    # more bandwidth does not help a window-limited flow on as-is hosts
    faster = _by_name(_strategies(job, replace(path, link_bps=4e9)))
    assert faster["as-is"].comm_time_s == pytest.approx(as_is)


def test_a_streamed_sync_longer_than_its_period_stretches_the_period():
    """Streamed every H steps: step = max(compute, sync / H); the rest of the sync hidden."""
    job = m.Job(params=1e9, dtype="bf16", sites=2, gpus_per_site=1, compute_s=0.1)
    path = m.Path(rtt_s=0.01, link_bps=1e9, flow_rate_bps=1e9)
    res = _by_name(_strategies(job, path, m.Options(sync_every=10, topk_ratio=None)))
    sync = res["sync every 10 steps"].sync_time_s   # 2·1/2·2e9·8/1e9 + 2·0.005 = 16.01 s
    assert sync == pytest.approx(16.0 + 0.01)
    streamed = res["sync every 10 steps + streamed"]
    assert streamed.step_time_s == pytest.approx(sync / 10)
    assert streamed.hidden_comm_s == pytest.approx(0.1)
    assert res["sync every 10 steps"].step_time_s == pytest.approx(0.1 + sync / 10)
    assert "hierarchical" not in " ".join(res)   # one GPU per site: it is the flat ring


def test_the_70b_example_local_sgd_on_tuned_hosts_and_flat_bf16_as_is():
    """Issue 40: 70e9 params, 2 sites × 8 GPUs, 130 ms, 10 Gbit/s, 0.1 % loss, 900 ms compute,
    cubic with a 6 MiB tcp_rmem now."""
    from wanprobe.models.bdp import window_from_buffer_bytes

    job = m.Job(params=70e9, dtype="bf16", sites=2, gpus_per_site=8, compute_s=0.9)
    path = m.Path(rtt_s=0.13, link_bps=10e9, loss=0.001, cc="cubic",
                  window_bytes=window_from_buffer_bytes(6 * 2**20))
    res = _strategies(job, path, m.Options(sync_every=100, more_sync_every=(500,)))
    as_is = res[0]
    assert as_is.name == "as-is" and as_is.components["sync_every"] == 1
    assert as_is.components["topology"] == "flat" and as_is.components["dtype"] == "bf16"
    assert as_is.gpu_idle_share > 0.9
    for h in (100, 500):
        local = [r for r in res if r.components["tuning"] == "tuned"
                 and r.components["sync_every"] == h]
        assert min(r.gpu_idle_share for r in local) < 0.3, h
    # without streaming or compression: hierarchical bf16 every 500 steps, about 20 %
    plain = _by_name(res)["tuned hosts + hierarchical + sync every 500 steps"]
    assert 0.15 < plain.gpu_idle_share < 0.25


def test_without_compute_only_comm_is_predicted():
    job = m.Job(params=1e9, compute_s=None)
    res = _strategies(job, m.Path(rtt_s=0.05, link_bps=1e9))
    assert all(r.step_time_s is None and r.gpu_idle_share is None for r in res)
    assert all(r.comm_time_s > 0 for r in res)


def _report(rtt_p99=130.0, loss=0.001, bps=5e6, rmem="4096 131072 6291456", cc="cubic", peer="tokyo"):
    return {
        "peer": {"address": peer},
        "measurements": {"path": {"rtt_ms": {"p50": rtt_p99 * 0.8, "p99": rtt_p99},
                                  "loss": {"ratio": loss}},
                         "throughput": {"bits_per_second": bps}},
        "host": {"sysctls": {"net.ipv4.tcp_rmem": rmem, "net.ipv4.tcp_congestion_control": cc}},
        "plan": {"changes": [{"tuner": "sysctl", "key": "net.ipv4.tcp_rmem", "value": "4096 131072 268435456"},
                             {"tuner": "sysctl", "key": "net.ipv4.tcp_congestion_control", "value": "bbr"}]},
    }


def test_candidate_from_report_uses_p99_and_measured_rate():
    c = candidate_from_report(_report(), "r.json", link_bps=10e9)
    assert c.name == "tokyo"
    assert c.path.rtt_s == pytest.approx(0.13)
    assert c.path.flow_rate(1) == 5e6
    assert c.path.window_bytes == pytest.approx(6291456 / 2)
    assert c.tuned_window_bytes == pytest.approx(268435456 / 2)
    assert c.tuned_cc == "bbr"
    assert planned_settings(None) == {}


def test_report_missing_key_names_it():
    doc = _report()
    del doc["measurements"]["path"]["rtt_ms"]["p99"]
    with pytest.raises(ConfigError, match=r"measurements\.path\.rtt_ms\.p99"):
        candidate_from_report(doc, "r.json")
    doc = _report()
    del doc["host"]["sysctls"]["net.ipv4.tcp_rmem"]
    with pytest.raises(ConfigError, match="net.ipv4.tcp_rmem"):
        candidate_from_report(doc, "r.json")
    doc = _report()
    doc["measurements"]["throughput"] = None
    with pytest.raises(ConfigError, match="bits_per_second"):
        candidate_from_report(doc, "r.json")  # no --bandwidth either


def test_slowest_peer_governs_a_joint_job():
    a = candidate_from_report(_report(rtt_p99=40, bps=500e6, peer="tokyo"), "a", 10e9)
    b = candidate_from_report(_report(rtt_p99=150, bps=20e6, peer="uswest"), "b", 10e9)
    p = slowest([a, b])
    assert p.rtt_s == pytest.approx(0.15)
    assert p.flow_rate(1) == 20e6


def test_assess_ranks_sites_and_models_the_job_on_the_slowest_path():
    """The ranking moved out of the CLI (issue 12): the nearer site ranks first; the job spanning
    both waits for the worst p99 RTT and the slower peer's rate."""
    from wanprobe.models.impact_sites import assess

    def doc(name, rtt_p99, bps):
        return {"peer": {"address": name},
                "measurements": {"path": {"rtt_ms": {"p99": rtt_p99}, "loss": {"ratio": 0.0}},
                                 "throughput": {"bits_per_second": bps}},
                "host": {"sysctls": {"net.ipv4.tcp_rmem": "4096 131072 6291456",
                                     "net.ipv4.tcp_congestion_control": "cubic"}}}
    far = candidate_from_report(doc("uswest", 140.0, 50e6), "far", 10e9)
    near = candidate_from_report(doc("tokyo", 36.0, 900e6), "near", 10e9)
    job = m.Job(params=7e9, compute_s=0.9)
    result = assess(job, m.Options(), candidates=[far, near])
    assert [s.candidate.name for s in result.sites] == ["tokyo", "uswest"]
    assert [s.rank for s in result.sites] == [1, 2]
    assert result.path.rtt_s == pytest.approx(0.14)
    assert result.path.flow_rate(1) == pytest.approx(50e6)
    assert result.to_json()["candidates"][0]["site"] == "tokyo"


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d["measurements"]["path"]["rtt_ms"].update(p99="130"), "rtt_ms.p99 missing or not a number"),
    (lambda d: d["measurements"]["path"]["rtt_ms"].update(p99=0), "rtt_ms.p99 missing or not a number > 0"),
    (lambda d: d["measurements"]["path"]["loss"].update(ratio=1.5), "loss.ratio missing or not a ratio"),
    (lambda d: d["measurements"]["throughput"].update(bits_per_second=-1), "bits_per_second missing or not"),
    (lambda d: d["host"]["sysctls"].update({"net.ipv4.tcp_rmem": "4096 x"}), "tcp_rmem missing or not 'min"),
    (lambda d: d.update(host=["not", "a", "host"]), "net.ipv4.tcp_rmem"),
    (lambda d: d.pop("peer"), "missing peer"),
    (lambda d: d["plan"]["changes"][0].update(value="big"), "plan's net.ipv4.tcp_rmem is not"),
])
def test_a_figure_of_the_wrong_type_or_range_is_named(edit, needle):
    """The typed parsers take a wrong-typed figure as absent; the reader names the key either way."""
    doc = _report()
    edit(doc)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        candidate_from_report(doc, "r.json", link_bps=10e9)
