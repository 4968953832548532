"""Each diagnose rule fires on the fault it names and stays silent on a clean input; the engine
ranks the intended fault first on crafted measurement sets (issue 6 "the top finding names it").

Inputs are plain dicts in the JSON shapes of issues 3 (probe), 4 (throughput) and 5 (counters),
and the report's host dict (typed by the report codec, ``measured_of`` and ``host_of``, as the
engine's callers do).
Fabric rules and their ranking: test_diagnose_fabric.py."""

from __future__ import annotations

import pytest
import test_diagnose_fabric as fabric
from conftest import FIXTURE_TREES

from wanprobe.diagnose import rules_host, rules_path
from wanprobe.diagnose.engine import ALL_RULES, rank, run_rules
from wanprobe.diagnose.host_inputs import Host
from wanprobe.diagnose.inputs import DiagnoseConfig
from wanprobe.diagnose.measured import Measured
from wanprobe.models.bdp import window_limited_rate_bps
from wanprobe.models.tcp_rate import mathis_rate_bps
from wanprobe.report.codec import host_of, measured_of
from wanprobe.report.document import Finding

SYN = FIXTURE_TREES / "synthetic"
NETDEV = "ens1f0np0"


# ---------------------------------------------------------------- builders

def host(**sysctls) -> dict:
    """An untuned-looking Linux host (values as this kernel prints them by default)."""
    base = {"net.ipv4.tcp_rmem": "4096 131072 6291456", "net.ipv4.tcp_wmem": "4096 16384 4194304",
            "net.core.rmem_max": "212992", "net.core.wmem_max": "212992",
            "net.ipv4.tcp_congestion_control": "bbr", "net.core.default_qdisc": "fq",
            "net.ipv4.tcp_mtu_probing": "1", "net.ipv4.tcp_slow_start_after_idle": "0",
            "net.ipv4.tcp_notsent_lowat": "131072", "net.ipv4.tcp_no_metrics_save": "1"}
    base.update({k.replace("__", "."): v for k, v in sysctls.items()})
    return {"hostname": "h", "kernel": "6.18.0", "machine_id": None, "netns_inode": 1,
            "sysctls": base, "available_cc": ["reno", "bbr", "cubic"],
            "allowed_cc": ["reno", "bbr"], "fq_available": True,
            "ifaces": {"wan0": {"mtu": 1500, "txqueuelen": 1000, "qdisc": "fq"}}}


def typed(h: dict | None) -> Host | None:
    """The typed host a rule takes, from the report's host dict (the report codec)."""
    return host_of(h)


def measured(m: dict) -> Measured:
    """The typed measurements a rule takes, from the report's measurement dict (the report
    codec)."""
    return measured_of(m)


def tuned_host() -> dict:
    return host(net__ipv4__tcp_rmem="4096 131072 1073741824",
                net__ipv4__tcp_wmem="4096 131072 1073741824")


def probe(rtt_ms=130.0, loss=0.0, sent=1000, dscp=(26, 26, 26)) -> dict:
    return {"method": "stamp", "peer": "198.18.0.2",
            "rtt_ms": {"min": rtt_ms, "p50": rtt_ms + 0.1, "p90": rtt_ms + 0.2,
                       "p99": rtt_ms + 0.4, "max": rtt_ms + 1, "mean": rtt_ms + 0.1, "stdev": 0.1},
            "loss": {"sent": sent, "received": round(sent * (1 - loss)), "ratio": loss,
                     "forward_ratio": loss, "reverse_ratio": 0.0, "ci95": [0, 0]},
            "jitter_ms": 0.05, "reordered": 0, "duplicates": 0,
            "dscp": {"sent": dscp[0], "at_reflector": dscp[1], "returned": dscp[2]}}


def throughput(bps, verdict="network", cc="bbr", rtt_ms=130.0, rwnd_us=0, busy_us=1_000_000,
               retrans=0, sent=10**9, **ev) -> dict:
    """wanprobe.throughput's ThroughputResult.to_json() shape (streams[].tcp_info in ms)."""
    return {"bits_per_second": bps, "sender_bits_per_second": bps, "retransmits": 0,
            "cc": cc, "duration_s": 5.0, "peer": "198.18.0.2", "bdp_bytes": bps * rtt_ms / 8e3,
            "min_rtt_ms": rtt_ms, "limited_by": {"verdict": verdict, "evidence": ev},
            "streams": [{"stream_id": 0, "bits_per_second": bps, "tcp_info": {
                "min_rtt_ms": rtt_ms, "rwnd_limited_ms": rwnd_us / 1e3,
                "busy_time_ms": busy_us / 1e3, "sndbuf_limited_ms": 0.0,
                "bytes_retrans": retrans, "bytes_sent": sent, "snd_mss_bytes": 1448}}],
            "intervals": []}


def meas(**parts) -> dict:
    out = {"path": None, "mtu": None, "throughput": None, "counters": None}
    out.update(parts)
    return out


def ids(findings: list[Finding]) -> list[str]:
    return [f.id for f in findings]


# ---------------------------------------------------------------- path rules: fire / silent

def test_window_limited_fires_with_model_numbers():
    m = meas(path=probe(130), throughput=throughput(190e6, "receive_window", rwnd_us=900_000))
    f = rules_path.window_limited(measured(m), typed(host()), DiagnoseConfig(link_rate_bps=10e9))
    assert f is not None and f.severity == "critical"
    # no window in the throughput evidence: local tcp_rmem[2] (6 MiB) × 0.5 over 130 ms
    cap = window_limited_rate_bps(6291456 * 0.5, 0.130)
    assert f.evidence["window_limited_rate_bps"] == pytest.approx(cap)
    assert f.evidence["rwnd_limited_share"] == pytest.approx(0.9)
    knob = {k.key: k.value for k in f.knobs}
    assert int(knob["net.ipv4.tcp_rmem"].split()[2]) >= 2 * 10e9 * 0.130 / 8
    assert "130 ms" in f.expected_effect and "2×BDP" in f.expected_effect
    assert f.impact == pytest.approx(1 - 190e6 / 10e9, abs=1e-3)


def test_window_limited_is_info_when_already_at_link_rate():
    m = meas(path=probe(0.05), throughput=throughput(11e9, "receive_window", rtt_ms=0.05,
                                                     rwnd_us=500_000))
    f = rules_path.window_limited(measured(m), typed(host()), DiagnoseConfig())
    assert f.severity == "info"


def test_window_limited_by_a_slow_reader_gets_no_buffer_knobs():
    """The peer advertised 28 MiB (TCP_INFO snd_wnd) yet 4 Gbit/s came through at 0.05 ms: the
    window was full because the receiving application lagged, not because it is small."""
    t = throughput(4.3e9, "receive_window", rtt_ms=0.05, rwnd_us=420_000,
                   peer_window_max_bytes=30_000_000)
    f = rules_path.window_limited(measured(meas(path=probe(0.05), throughput=t)), typed(host()),
                                  DiagnoseConfig())
    assert f.id == "path.receiver_app_limited" and f.severity == "warning" and f.knobs == ()
    t2 = throughput(4.3e9, "receive_window", rtt_ms=2, rwnd_us=420_000,
                    peer_window_max_bytes=30_000_000)
    out = run_rules(measured_of(meas(path=probe(2), throughput=t2)), host_of(host()), DiagnoseConfig(link_rate_bps=1e11))
    assert "host.buffers_below_bdp" in ids(out)  # not merged into a finding that says "no"
    assert next(f for f in out if f.id == "path.receiver_app_limited").knobs == ()


def test_window_limited_silent_when_network_limited():
    m = meas(path=probe(130), throughput=throughput(9.4e9, "network", rwnd_us=10_000))
    assert rules_path.window_limited(measured(m), typed(host()), DiagnoseConfig()) is None


def test_send_buffer_limited_fires_and_stays_silent():
    t = throughput(300e6, "send_buffer")
    f = rules_path.send_buffer_limited(measured(meas(path=probe(60), throughput=t)), typed(host()),
                                       DiagnoseConfig())
    assert f is not None and [k.key for k in f.knobs] == ["net.ipv4.tcp_wmem"]
    assert rules_path.send_buffer_limited(measured(meas(throughput=throughput(9e9))), typed(host()),
                                          DiagnoseConfig()) is None


def test_lossy_reno_fires_with_mathis_bound():
    m = meas(path=probe(60, loss=0.01, sent=10**6),
             throughput=throughput(20e6, "congestion", cc="reno", retrans=10**6, sent=10**8))
    f = rules_path.lossy_loss_based_cc(measured(m), typed(host()),
                                       DiagnoseConfig(link_rate_bps=1e9))
    assert f is not None and f.severity == "critical"
    assert f.evidence["mathis_rate_bps"] == pytest.approx(mathis_rate_bps(1448, 0.060, 0.01))
    assert f.evidence["bbr_rate_bps"] == pytest.approx(0.99e9)
    assert [(k.key, k.value) for k in f.knobs] == [("net.ipv4.tcp_congestion_control", "bbr")]


@pytest.mark.parametrize("case", ["bbr", "short_rtt", "tiny_loss"])
def test_lossy_silent(case):
    cc = "bbr" if case == "bbr" else "cubic"
    rtt = 5.0 if case == "short_rtt" else 60.0
    loss = 1e-6 if case == "tiny_loss" else 0.01
    m = meas(path=probe(rtt, loss=loss, sent=10**6), throughput=throughput(1e8, cc=cc))
    assert rules_path.lossy_loss_based_cc(measured(m), typed(host()), DiagnoseConfig()) is None


def test_lossy_falls_back_to_tcp_retransmissions_without_probe():
    m = meas(throughput=throughput(5e7, "congestion", cc="cubic", rtt_ms=100, retrans=10**6,
                                   sent=10**8))
    f = rules_path.lossy_loss_based_cc(measured(m), typed(host()), DiagnoseConfig())
    assert f is not None and f.evidence["loss_ratio"] == pytest.approx(0.01)
    assert "bytes_retrans" in f.evidence["sources"]["loss_ratio"]


def test_loss_estimate_comes_from_the_larger_sample():
    from wanprobe.diagnose.inputs import loss_ratio

    small_probe = meas(path=probe(60, loss=0.005, sent=200),
                       throughput=throughput(5e7, retrans=2 * 10**5, sent=10**8))
    assert loss_ratio(measured(small_probe))[0] == pytest.approx(0.002)      # ≈69 000 segments
    big_probe = meas(path=probe(60, loss=0.005, sent=10**6),
                     throughput=throughput(5e7, retrans=2 * 10**5, sent=10**8))
    assert loss_ratio(measured(big_probe)) == (0.005, "probe loss.ratio over 1000000 probes")


def test_loss_excessive_fires_and_stays_silent():
    assert rules_path.loss_excessive(measured(meas(path=probe(60, loss=0.3))), None,
                                     DiagnoseConfig()).id == "path.loss_excessive"
    assert rules_path.loss_excessive(measured(meas(path=probe(60, loss=0.05))), None,
                                     DiagnoseConfig()) is None


def test_dscp_bleached_forward_and_reverse():
    def bleached(dscp):
        return rules_path.dscp_bleached(measured(meas(path=probe(dscp=dscp))), None,
                                        DiagnoseConfig())

    fwd = bleached((26, 0, 0))
    assert fwd.evidence["direction"] == "forward" and fwd.severity == "critical"
    rev = bleached((26, 26, 0))
    assert rev.evidence["direction"] == "reverse"
    remark = bleached((46, 10, 10))
    assert remark.severity == "warning" and "AF11" in remark.title


@pytest.mark.parametrize("dscp", [(26, 26, 26), (0, 0, 0), (26, None, None)])
def test_dscp_silent(dscp):
    assert rules_path.dscp_bleached(measured(meas(path=probe(dscp=dscp))), None,
                                    DiagnoseConfig()) is None


def test_mtu_black_hole_fires_without_icmp():
    m = meas(mtu={"path_mtu": 1380, "iface": "wan0", "icmp_seen": False, "method": "df-search"})
    f = rules_path.mtu_black_hole(measured(m), typed(host(net__ipv4__tcp_mtu_probing="0")),
                                  DiagnoseConfig())
    assert f.severity == "critical" and f.impact == 1.0
    assert {(k.tuner, k.key, k.value) for k in f.knobs} == {
        ("sysctl", "net.ipv4.tcp_mtu_probing", "1"), ("link", "wan0/mtu", "1380")}


@pytest.mark.parametrize("mtu", [{"path_mtu": 1500, "iface": "wan0"},
                                 {"path_mtu": 9244, "iface_mtu": 65535, "search_max_bytes": 9244},
                                 {"path_mtu": 1380, "iface": "wan0", "icmp_seen": True}])
def test_mtu_black_hole_silent(mtu):
    assert rules_path.mtu_black_hole(measured(meas(mtu=mtu)), typed(host()),
                                     DiagnoseConfig()) is None


# ---------------------------------------------------------------- host rules: fire / silent

HOST_CASES = [
    (rules_host.buffers_below_bdp, {}, {"net__ipv4__tcp_rmem": "4096 131072 1073741824",
                                        "net__ipv4__tcp_wmem": "4096 131072 1073741824"}),
    (rules_host.loss_based_default_cc, {"net__ipv4__tcp_congestion_control": "cubic"}, {}),
    (rules_host.no_fq_pacing, {"net__core__default_qdisc": "pfifo_fast"}, {}),
    (rules_host.mtu_probing_off, {"net__ipv4__tcp_mtu_probing": "0"}, {}),
    (rules_host.slow_start_after_idle, {"net__ipv4__tcp_slow_start_after_idle": "1"}, {}),
    (rules_host.notsent_lowat_unlimited, {"net__ipv4__tcp_notsent_lowat": "4294967295"}, {}),
    (rules_host.metrics_saved, {"net__ipv4__tcp_no_metrics_save": "0"}, {}),
]


@pytest.mark.parametrize("fn,bad,good", HOST_CASES, ids=[c[0].rule_id for c in HOST_CASES])
def test_host_rule_fires_and_stays_silent(fn, bad, good):
    m = meas(path=probe(60))
    cfg = DiagnoseConfig(link_rate_bps=10e9)
    bad_host = host(**bad)
    if fn is rules_host.no_fq_pacing:
        bad_host["ifaces"]["wan0"]["qdisc"] = "pfifo_fast"
    f = fn(measured(m), typed(bad_host), cfg)
    assert f is not None and f.id == fn.rule_id and f.knobs
    assert all(k.tuner in ("sysctl", "link") for k in f.knobs)
    assert fn(measured(m), typed(host(**good)), cfg) is None


def test_rings_below_max_fires_and_stays_silent():
    from tuners.link import split_key

    h = host()
    h["ifaces"]["wan0"].update(rx_ring=256, rx_ring_max=4096, tx_ring=1024, tx_ring_max=1024)
    f = rules_host.rings_below_max(measured(meas()), typed(h), DiagnoseConfig())
    assert [(k.key, k.value) for k in f.knobs] == [("wan0/rx_ring", "4096")]
    assert split_key(f.knobs[0].key) == ("wan0", "rx_ring")
    h["ifaces"]["wan0"]["rx_ring"] = 4096
    assert rules_host.rings_below_max(measured(meas()), typed(h), DiagnoseConfig()) is None
    # unknown rings
    assert rules_host.rings_below_max(measured(meas()), typed(host()), DiagnoseConfig()) is None


def test_buffers_never_lowered_and_clamped_to_1gib():
    h = host(net__ipv4__tcp_rmem="4096 131072 2000000000")  # admin set rmem above 1 GiB
    f = rules_host.buffers_below_bdp(measured(meas(path=probe(200))), typed(h),
                                     DiagnoseConfig(link_rate_bps=100e9))
    keys = {k.key: k.value for k in f.knobs}
    assert "net.ipv4.tcp_rmem" not in keys           # never lower
    assert keys["net.ipv4.tcp_wmem"].split()[2] == str(2**30)  # clamp


def test_buffers_demoted_when_measured_transfer_was_not_window_limited():
    m = meas(path=probe(10), throughput=throughput(9e9, "network", rtt_ms=10))
    f = rules_host.buffers_below_bdp(measured(m), typed(host()), DiagnoseConfig(link_rate_bps=10e9))
    assert f.severity == "info" and f.evidence["throughput_verdict"] == "network"
    m["throughput"] = None
    f = rules_host.buffers_below_bdp(measured(m), typed(host()), DiagnoseConfig(link_rate_bps=10e9))
    assert f.severity == "critical"


def test_no_fq_when_module_missing_is_info_without_knobs():
    h = host(net__core__default_qdisc="pfifo_fast")
    h["fq_available"] = None
    h["ifaces"]["wan0"]["qdisc"] = "pfifo_fast"
    f = rules_host.no_fq_pacing(measured(meas()), typed(h), DiagnoseConfig())
    assert f.severity == "info" and f.knobs == () and "sch_fq" in f.title


def test_typed_host_from_report_and_from_facts():
    h = host()
    h["sysctls"].pop("net.ipv4.tcp_notsent_lowat")
    t = host_of(h)
    assert t.tcp_rmem_bytes == (4096, 131072, 6291456) and t.tcp_mtu_probing == 1
    assert t.tcp_notsent_lowat_bytes is None and t.cc_current == "bbr"  # absent is None
    assert t.iface("wan0").mtu_bytes == 1500 and t.iface("eth9") is None
    assert host_of(None) is None and host_of({}) is None
    assert host_of(["not", "a", "host"]) is None and host_of("x") is None
    p = Host.from_facts(host_of(dict(h, facts=peer_facts("cubic"))).facts)
    assert p.which == "peer" and p.cc_current == "cubic" and p.default_qdisc is None
    assert p.iface("wan0").qdisc == "pfifo_fast" and p.tcp_rmem_bytes == (4096, 131072, 6291456)


def peer_facts(cc: str, available=("reno", "cubic", "bbr"), qdisc="pfifo_fast") -> dict:
    """The far end's host facts (``measurements.peer_facts``, collectors/host_facts.py)."""
    from collectors.host_facts import HostFacts

    return HostFacts(cc_current=cc, cc_allowed=("reno", cc), cc_available=tuple(available),
                     tcp_rmem_bytes=(4096, 131072, 6291456),
                     tcp_wmem_bytes=(4096, 16384, 4194304), tcp_mem_pages=None,
                     page_size_bytes=4096, rmem_max_bytes=212992, wmem_max_bytes=212992,
                     iface="wan0", iface_mtu_bytes=1500, iface_qdisc=qdisc).to_json()


def test_peer_default_cc_is_judged_from_its_host_facts():
    """A bbr host measuring a cubic peer: the cc rule judges the peer on the facts it sent, and
    its finding and knob name the peer. Its qdisc is not judged (the facts cannot say whether
    sch_fq exists there)."""
    cfg = DiagnoseConfig(link_rate_bps=10e9)
    out = run_rules(measured_of(meas(path=probe(60), peer_facts=peer_facts("cubic"))), host_of(host()), cfg)
    f = next(f for f in out if f.id == "host.loss_based_default_cc")
    assert f.host == "peer" and "peer host" in f.title
    assert f.evidence["tcp_congestion_control"] == "cubic"
    assert f.evidence["sources"]["tcp_congestion_control"] == "peer host facts cc_current"
    assert [(k.key, k.value, k.host) for k in f.knobs] == [
        ("net.ipv4.tcp_congestion_control", "bbr", "peer")]
    assert [g.host for g in out if g.id == "host.no_fq_pacing"] == []
    for quiet in (peer_facts("bbr"), peer_facts("cubic", available=("reno", "cubic")), None):
        out = run_rules(measured_of(meas(path=probe(60), peer_facts=quiet)), host_of(host()), cfg)
        assert "host.loss_based_default_cc" not in ids(out)
    # both ends on a loss-based cc: one finding each, the local one as before (for both ends)
    out = run_rules(measured_of(meas(path=probe(60), peer_facts=peer_facts("cubic"))),
                    host_of(host(net__ipv4__tcp_congestion_control="cubic")), cfg)
    both = [f for f in out if f.id == "host.loss_based_default_cc"]
    assert sorted(str(f.host) for f in both) == ["None", "peer"]
    assert next(f for f in both if f.host is None).knobs[0].side == "both"


# ---------------------------------------------------------------- engine: top finding names it

def untuned_host() -> dict:
    return host(net__ipv4__tcp_congestion_control="reno", net__ipv4__tcp_mtu_probing="0",
                net__ipv4__tcp_slow_start_after_idle="1", net__ipv4__tcp_no_metrics_save="0",
                net__ipv4__tcp_notsent_lowat="4294967295", net__core__default_qdisc="pfifo_fast")


SCENARIOS = {
    "window_limited": (meas(path=probe(130), throughput=throughput(
        190e6, "receive_window", cc="reno", rwnd_us=950_000)), "path.window_limited"),
    "lossy_reno": (meas(path=probe(60, loss=0.01), throughput=throughput(
        8e6, "congestion", cc="reno", rtt_ms=60, retrans=10**7)), "path.lossy_loss_based_cc"),
    "bleaching": (meas(path=probe(10, dscp=(26, 0, 0)), throughput=throughput(
        9e9, "network", cc="bbr", rtt_ms=10)), "path.dscp_bleached"),
    "black_hole": (meas(path=probe(60), mtu={"path_mtu": 1380, "iface": "wan0",
                                             "icmp_seen": False}), "path.mtu_black_hole"),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_engine_ranks_path_fault_first(name):
    m, want = SCENARIOS[name]
    out = run_rules(measured_of(m), host_of(untuned_host()), DiagnoseConfig(link_rate_bps=10e9 if name != "lossy_reno" else 1e9))
    assert "engine.rule_error" not in ids(out)
    assert out[0].id == want, ids(out)
    assert len(ids(out)) == len(set(ids(out)))


def test_engine_merges_host_buffer_knobs_into_window_finding():
    m, _ = SCENARIOS["window_limited"]
    out = run_rules(measured_of(m), host_of(untuned_host()), DiagnoseConfig(link_rate_bps=10e9))
    assert "host.buffers_below_bdp" not in ids(out)
    assert {"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"} <= {k.key for k in out[0].knobs}


def test_rule_error_is_reported_not_raised():
    def broken(m, h, c):
        raise KeyError("boom")

    broken.rule_id = "path.broken"
    out = run_rules(measured_of(meas()), None, rules=(broken,))
    assert ids(out) == ["engine.rule_error"] and "boom" in out[0].evidence["error"]


def test_rank_orders_by_severity_then_impact():
    def f(i, sev, imp):
        return Finding(i, sev, i, {}, "", "", (), imp)

    got = rank([f("a.info", "info", 0.9), f("a.low", "critical", 0.1),
                f("a.none", "critical", None), f("a.high", "critical", 0.8)])
    assert ids(got) == ["a.high", "a.low", "a.none", "a.info"]


def test_every_rule_has_a_unique_id():
    rule_ids = [fn.rule_id for fn in ALL_RULES]
    assert len(rule_ids) == len(set(rule_ids))


def test_knobs_use_the_tuners_key_formats(tmp_path):
    """Contract with tuners/: every knob the rules emit names a key its tuner accepts."""
    from tuners.link import split_key
    from tuners.roce import parse_key, pfc_value
    from tuners.sysctl import SPECS

    knobs = []
    for m, _ in SCENARIOS.values():
        knobs += [k for f in run_rules(measured_of(m), host_of(untuned_host()), DiagnoseConfig(link_rate_bps=10e9))
                  for k in f.knobs]
    for make in (fabric.drops_pfc_off, fabric.ecn_off, fabric.storm):
        knobs += [k for f in run_rules(measured_of(meas(counters=make(tmp_path / make.__name__)[0])), None)
                  for k in f.knobs]
    h = untuned_host()
    h["ifaces"]["wan0"]["qdisc"] = "pfifo_fast"
    knobs += list(rules_host.no_fq_pacing(measured(meas()), typed(h), DiagnoseConfig()).knobs)
    assert {k.tuner for k in knobs} == {"sysctl", "link", "roce"}
    for k in knobs:
        if k.tuner == "sysctl":
            assert k.key in SPECS, k
        elif k.tuner == "link":
            assert split_key(k.key) == (k.iface, "mtu")
        else:
            assert parse_key(k.key)[0] == k.iface
            if k.key.endswith("/pfc"):
                assert pfc_value(k.value) == "0,0,0,1,0,0,0,0"
