"""Health rules: each fires on crafted deltas and stays silent on clean ones."""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import FIXTURE_TREES

from collectors.rates import rates
from collectors.snapshot import collect
from wanprobe.diagnose.rules_fabric import COUNTER_RULES as RULES
from wanprobe.services.counters import findings_of as evaluate

_spec = importlib.util.spec_from_file_location(
    "mlx5_tree", Path(__file__).parent / "fixtures" / "collectors" / "mlx5_tree.py")
tree = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tree)

WINDOW = 10.0
HW = "class/infiniband/mlx5_0/ports/1/hw_counters"
PMA = "class/infiniband/mlx5_0/ports/1/counters"


class Host:
    """A crafted host: sys/proc/ethtool roots in tmp_path, sampled twice ``WINDOW`` apart."""

    def __init__(self, tmp_path: Path, *, mtu=4200, ecn=None, ethtool=None, hw=None, pma=None,
                 tcp=None, bnxt=False):
        self.sys, self.proc, self.eth = tmp_path / "sys", tmp_path / "proc", tmp_path / "eth"
        tree.add_netdev(self.sys, "ens1f0np0", mtu=mtu, ecn=ecn)
        hw_base = dict(tree.MLX5_HW) if not bnxt else {
            "oos_drop_count": 0, "seq_err_naks_rcvd": 0, "to_retransmits": 0, "missing_resp": 0,
            "tx_cnp_pkts": 0, "rx_cnp_pkts": 0}
        tree.add_rdma_port(self.sys, "mlx5_0", 1, "ens1f0np0", hw={**hw_base, **(hw or {})}, pma=pma)
        if bnxt:  # only the bnxt_re names
            for k in tree.MLX5_HW:
                if k not in hw_base and k != "lifespan":
                    (self.sys / HW / k).unlink()
        tree.add_proc(self.proc, tcp)
        self.ethtool = dict(ethtool or {})
        tree.add_ethtool(self.eth, "ens1f0np0", self.ethtool)

    def sample(self):
        return collect(self.sys, self.proc, self.eth)

    def bump(self, rel: str, name: str, by: int) -> None:
        p = self.sys / rel / name
        p.write_text(f"{int(p.read_text()) + by}\n")

    def bump_ethtool(self, name: str, by: int) -> None:
        self.ethtool[name] += by
        tree.add_ethtool(self.eth, "ens1f0np0", self.ethtool)

    def bump_tcp(self, **by) -> None:
        path = self.proc / "net" / "snmp"
        head, vals = [ln.split()[1:] for ln in path.read_text().splitlines()]
        vals = [str(int(v) + by.get(k, 0)) for k, v in zip(head, vals, strict=True)]
        path.write_text("Tcp: " + " ".join(head) + "\nTcp: " + " ".join(vals) + "\n")

    def findings(self, change=None):
        s0 = self.sample()
        if change:
            change(self)
        s1 = replace(self.sample(), monotonic_s=s0.monotonic_s + WINDOW)
        r = rates(s0, s1)
        return {f.id: f for f in evaluate(s1, r, WINDOW)}


PFC3 = {"rx_prio3_pause": 100, "rx_prio3_pause_duration": 1000, "tx_prio3_pause": 0,
        "tx_prio3_pause_duration": 0, "rx_out_of_buffer": 0, "rx_prio3_discards": 0,
        "rx_pcs_symbol_err_phy": 0, "rx_corrected_bits_phy": 0, "link_down_events_phy": 0,
        "tx_pause_storm_error_events": 0}


def test_clean_host_is_silent(tmp_path):
    h = Host(tmp_path, ecn={3: (1, 1)}, ethtool=PFC3)
    assert h.findings() == {}


@pytest.mark.parametrize("counter", ["out_of_sequence", "packet_seq_err", "implied_nak_seq_err",
                                     "local_ack_timeout_err"])
def test_roce_drops_on_lossless_priority(tmp_path, counter):
    h = Host(tmp_path, ecn={3: (1, 1)}, ethtool=PFC3)
    f = h.findings(lambda h: h.bump(HW, counter, 120))
    d = f["roce.lossless_drops"]
    assert d.severity == "critical"
    ev = d.evidence
    assert ev["counter"] == counter and ev["delta"] == 120 and ev["rate_per_s"] == 12.0
    assert ev["window_s"] == WINDOW and ev["path"].endswith(f"hw_counters/{counter}")


@pytest.mark.parametrize("counter", ["oos_drop_count", "seq_err_naks_rcvd", "to_retransmits",
                                     "missing_resp"])
def test_roce_drops_bnxt_names_without_pfc(tmp_path, counter):
    h = Host(tmp_path, bnxt=True)
    f = h.findings(lambda h: h.bump(HW, counter, 3))
    assert f["roce.drops"].severity == "warning"       # no PFC seen: lossy RoCE
    assert f["roce.drops"].evidence["counter"] == counter


def test_roce_drops_silent_when_only_benign_counters_move(tmp_path):
    h = Host(tmp_path, ethtool=PFC3, ecn={3: (1, 1)})
    f = h.findings(lambda h: h.bump(HW, "rx_write_requests", 10**6))
    assert not {k for k in f if k.startswith("roce.")}


def test_retry_exceeded(tmp_path):
    h = Host(tmp_path)
    assert h.findings(lambda h: h.bump(HW, "req_transport_retries_exceeded", 1))[
        "roce.retry_exceeded"].severity == "critical"


def test_synthetic_ethtool_snapshots_10s_apart(tmp_path):
    """The synthetic mlx5 captures (PFC on prio 3): 3400 µs paused in 10 s = 0.034 % → PFC active
    (info), no storm, no loss findings."""
    src = FIXTURE_TREES / "synthetic" / "ethtool" / "ens1f0np0"
    snaps = []
    for i, name in enumerate(("statistics.t0", "statistics.t1_plus10s")):
        root = tmp_path / f"e{i}" / "ens1f0np0"
        root.mkdir(parents=True)
        shutil.copy(src / name, root / "statistics")
        snaps.append(collect(FIXTURE_TREES / "synthetic" / "sys",
                             FIXTURE_TREES / "procfs" / "proc", tmp_path / f"e{i}"))
    s1 = replace(snaps[1], monotonic_s=snaps[0].monotonic_s + 10)
    r = rates(snaps[0], s1)
    assert r.get(("netdevs", "ens1f0np0", "ethtool"), "rx_prio3_pause").per_s == 2100.0
    found = {f.id: f for f in evaluate(s1, r, 10)}
    assert set(found) == {"pfc.pause_active"}
    ev = found["pfc.pause_active"].evidence
    assert ev["counter"] == "rx_prio3_pause_duration" and ev["delta"] == 3400
    assert ev["paused_share"] == pytest.approx(3400 / 10e6)


@pytest.mark.parametrize("paused_us,severity", [(3_000_000, "warning"), (6_000_000, "critical")])
def test_pfc_storm_share_of_window(tmp_path, paused_us, severity):
    h = Host(tmp_path, ecn={3: (1, 1)}, ethtool=PFC3)
    f = h.findings(lambda h: h.bump_ethtool("rx_prio3_pause_duration", paused_us))
    assert f["pfc.pause_storm"].severity == severity
    assert f["pfc.pause_storm"].evidence["paused_share"] == pytest.approx(paused_us / 10e6)


def test_pfc_storm_bnxt_duration_and_storm_events(tmp_path):
    eth = {"pfc_pri3_rx_duration_us": 0, "tx_pause_storm_error_events": 0}
    h = Host(tmp_path, ethtool=eth)

    def change(h):
        h.bump_ethtool("pfc_pri3_rx_duration_us", 2_500_000)
        h.bump_ethtool("tx_pause_storm_error_events", 1)
    f = h.findings(change)
    assert f["pfc.pause_storm"].severity == "warning"
    assert f["pfc.storm_events"].severity == "critical"


def test_dcqcn_info_and_cnp_ignored_warning(tmp_path):
    h = Host(tmp_path)
    f = h.findings(lambda h: h.bump(HW, "np_cnp_sent", 5000))
    assert f["roce.dcqcn_active"].severity == "info" and "roce.cnp_ignored" not in f
    h2 = Host(tmp_path / "b")
    f = h2.findings(lambda h: h.bump(HW, "rp_cnp_ignored", 7))
    assert f["roce.cnp_ignored"].severity == "warning"


def test_ecn_disabled_on_roce_priority(tmp_path):
    h = Host(tmp_path, ecn={3: (0, 1), 5: (1, 1)})
    f = h.findings()["roce.ecn_disabled"]
    assert f.evidence["roce_priorities"] == [3]
    assert f.evidence["path"].endswith("ecn/roce_np/enable/3")
    assert f.knobs[0].key == "ens1f0np0/ecn_np/3" and f.knobs[0].tuner == "roce"


def test_ecn_follows_the_pfc_priority(tmp_path):
    # PFC on prio 4 (mlx5 emits rx_prio4_pause only then); ECN enabled on 3 only → flagged
    h = Host(tmp_path, ecn={3: (1, 1)}, ethtool={"rx_prio4_pause": 0})
    assert h.findings()["roce.ecn_disabled"].evidence["roce_priorities"] == [4]


def test_ecn_silent_on_real_ofed_tree():
    snap = collect(FIXTURE_TREES / "procfs" / "sys", FIXTURE_TREES / "procfs" / "proc")
    assert snap.netdevs["eth0"].ecn.enabled_on("roce_np", 3) is True
    assert not [f for f in evaluate(snap) if f.id == "roce.ecn_disabled"]


def test_roce_mtu_limited_by_netdev_mtu(tmp_path):
    f = Host(tmp_path, mtu=1500).findings()
    assert f["roce.active_mtu_low"].evidence["value"] == 1024       # iboe_get_mtu(1500)
    assert "roce.active_mtu_low" not in Host(tmp_path / "ok", mtu=4200).findings()


def test_roce_active_mtu_below_allowed_and_mismatch(tmp_path):
    sysr = tmp_path / "sys"
    tree.add_netdev(sysr, "p0", pci="0000:17:00.0", mtu=9000)
    tree.add_netdev(sysr, "p1", pci="0000:18:00.0", mtu=9000, ifindex=5)
    tree.add_rdma_port(sysr, "mlx5_0", 1, "p0", pci="0000:17:00.0", active_mtu=1024)
    tree.add_rdma_port(sysr, "mlx5_1", 1, "p1", pci="0000:18:00.0")
    tree.add_proc(tmp_path / "proc")
    found = {f.id: f for f in evaluate(collect(sysr, tmp_path / "proc"))}
    assert found["roce.active_mtu_low"].evidence["allowed_active_mtu"] == 4096
    assert found["roce.mtu_mismatch"].evidence["values"] == {"mlx5_0/1": 1024, "mlx5_1/1": 4096}


def test_link_downed(tmp_path):
    h = Host(tmp_path)
    assert h.findings(lambda h: h.bump(PMA, "link_downed", 1))["link.downed"].evidence[
        "counter"] == "link_downed"


def test_phy_errors_and_fec_corrected_is_not_an_error(tmp_path):
    h = Host(tmp_path, ethtool=PFC3)
    assert h.findings(lambda h: h.bump(PMA, "symbol_error", 5))["link.phy_errors"].severity == "warning"
    h2 = Host(tmp_path / "b", ethtool=PFC3)
    assert h2.findings(lambda h: h.bump_ethtool("rx_pcs_symbol_err_phy", 2))[
        "link.phy_errors"].severity == "critical"
    h3 = Host(tmp_path / "c", ethtool=PFC3)
    assert "link.phy_errors" not in h3.findings(lambda h: h.bump_ethtool("rx_corrected_bits_phy", 900))


def test_rx_out_of_buffer(tmp_path):
    h = Host(tmp_path, ethtool=PFC3)
    f = h.findings(lambda h: h.bump_ethtool("rx_out_of_buffer", 40))["nic.rx_out_of_buffer"]
    assert f.evidence["counter"] == "rx_out_of_buffer" and f.evidence["rate_per_s"] == 4.0
    assert f.evidence["path"].endswith("eth/ens1f0np0/statistics#rx_out_of_buffer")


def test_nic_discards_on_lossless_priority(tmp_path):
    h = Host(tmp_path, ethtool=PFC3, ecn={3: (1, 1)})
    assert h.findings(lambda h: h.bump_ethtool("rx_prio3_discards", 9))[
        "nic.discards"].severity == "critical"


@pytest.mark.parametrize("retrans,out,expected", [(50, 1000, "warning"), (2, 1000, "info"),
                                                  (0, 1000, None), (5, 50, None)])
def test_tcp_retransmission_rate(tmp_path, retrans, out, expected):
    h = Host(tmp_path)
    f = h.findings(lambda h: h.bump_tcp(RetransSegs=retrans, OutSegs=out))
    if expected is None:
        assert "tcp.retrans_rate" not in f
    else:
        assert f["tcp.retrans_rate"].severity == expected
        assert f["tcp.retrans_rate"].evidence["retrans_ratio"] == pytest.approx(retrans / out)
        assert f["tcp.retrans_rate"].evidence["path"].endswith("net/snmp#Tcp.RetransSegs")


def test_single_sample_runs_only_config_rules(tmp_path):
    h = Host(tmp_path, mtu=1500, ecn={3: (0, 0)})
    found = {f.id for f in evaluate(h.sample())}
    assert found == {"roce.active_mtu_low", "roce.ecn_disabled"}


def test_every_rule_has_a_docstring_and_finding_ids_fit_the_report_schema(tmp_path):
    import re
    assert all(r.__doc__ for r in RULES)
    h = Host(tmp_path, mtu=1500, ecn={3: (0, 0)}, ethtool=PFC3)
    for f in h.findings(lambda h: h.bump(HW, "out_of_sequence", 1)).values():
        assert re.fullmatch(r"[a-z]+\.[a-z0-9_]+", f.id)
        assert set(f.to_json()) >= {"id", "severity", "title", "evidence", "recommendation",
                                    "expected_effect", "knobs"}


def test_roce_drops_lossless_only_if_that_ports_netdev_has_pfc(tmp_path):
    h = Host(tmp_path, ecn={3: (1, 1)}, ethtool=PFC3)
    tree.add_netdev(h.sys, "other0", pci="0000:18:00.0", ifindex=9)
    tree.add_ethtool(h.eth, "other0", {"rx_prio3_pause": 1})
    (h.eth / "ens1f0np0" / "statistics").unlink()            # the RoCE port's netdev: no PFC seen
    f = h.findings(lambda h: h.bump(HW, "packet_seq_err", 4))
    assert "roce.drops" in f and "roce.lossless_drops" not in f


def test_findings_validate_against_the_report_schema(tmp_path):
    import json

    jsonschema = pytest.importorskip("jsonschema")
    schema_path = Path(__file__).resolve().parent.parent / "wanprobe" / "report" / "schema.json"
    if not schema_path.exists():
        pytest.skip("report schema not present")
    schema = json.loads(schema_path.read_text())
    finding_schema = {"$defs": schema["$defs"], "$ref": "#/$defs/finding"}
    h = Host(tmp_path, mtu=1500, ecn={3: (0, 0)}, ethtool=PFC3)

    def change(h):
        h.bump(HW, "out_of_sequence", 1)
        h.bump_ethtool("rx_out_of_buffer", 3)
        h.bump_ethtool("rx_prio3_pause_duration", 4_000_000)
        h.bump_tcp(RetransSegs=30, OutSegs=1000)
    found = h.findings(change)
    assert len(found) >= 6
    for f in found.values():
        jsonschema.validate(f.to_json(), finding_schema)


# ------------------------------------------------ the diagnose engine on the synthetic mlx5 tree

SYN = FIXTURE_TREES / "synthetic"
NETDEV = "ens1f0np0"
CAPTURES = ("statistics.t0", "statistics.t1_plus10s")  # two `ethtool -S` captures 10 s apart


def _capture(text: str, *, pfc_off: bool, bump: dict[str, int]) -> str:
    """An `ethtool -S` capture as mlx5 prints it with PFC off on priority 3 (its pause counters
    are not emitted), and with ``bump`` added to the named counters."""
    out = []
    for line in text.splitlines():
        name, _, value = line.strip().partition(": ")
        if pfc_off and name.startswith(("rx_prio3_pause", "tx_prio3_pause")):
            continue
        if name in bump:
            line = f"     {name}: {int(value) + bump.pop(name)}"
        out.append(line)
    assert not bump, f"not in the capture: {bump}"
    return "\n".join(out) + "\n"


def counters(tmp: Path, *, pfc_off=False, ecn_off=(), hw=None, ethtool=None) -> dict:
    """The counters document ``diagnose`` builds (services/diagnose.counters_json: snapshots, rates, fabric
    findings) from a copy of the synthetic mlx5 tree sampled twice 10 s apart. ``ecn_off`` roles
    get 0 in ``ecn/<role>/enable/3``; ``hw`` / ``ethtool`` deltas land in the later sample."""
    from collectors.snapshot import collect
    from wanprobe.services.diagnose import counters_json

    sys_copy = tmp / "sys"
    shutil.copytree(SYN / "sys", sys_copy, symlinks=True)
    for role in ecn_off:
        (hit,) = sys_copy.glob(f"devices/**/net/{NETDEV}/ecn/{role}/enable/3")
        hit.chmod(0o644)
        hit.write_text("0\n")
    snaps = []
    for i, name in enumerate(CAPTURES):
        eth = tmp / f"eth{i}" / NETDEV
        eth.mkdir(parents=True)
        text = (SYN / "ethtool" / NETDEV / name).read_text()
        (eth / "statistics").write_text(
            _capture(text, pfc_off=pfc_off, bump=dict(ethtool or {}) if i else {}))
        for counter, by in (hw or {}).items() if i else ():
            (p,) = sys_copy.glob(f"devices/**/infiniband/mlx5_0/ports/1/hw_counters/{counter}")
            p.chmod(0o644)
            p.write_text(f"{int(p.read_text()) + by}\n")
        snaps.append(collect(sys_root=sys_copy, proc_root=tmp / "noproc",
                             ethtool_root=eth.parent, dcb=False))
    return counters_json(snaps[0], replace(snaps[1], monotonic_s=snaps[0].monotonic_s + 10.0))


def meas(**parts) -> dict:
    return {"path": None, "mtu": None, "throughput": None, "counters": None, **parts}


def ids(findings) -> list[str]:
    return [f.id for f in findings]


def drops_pfc_off(tmp: Path):
    return counters(tmp, pfc_off=True, hw={"packet_seq_err": 400},
                    ethtool={"rx_discards_phy": 9000}), "roce.drops_pfc_off"


def ecn_off(tmp: Path):
    return counters(tmp, ecn_off=("roce_np", "roce_rp")), "roce.ecn_disabled"


def storm(tmp: Path):
    # a storm usually comes with ECN not reacting first: paused 40 % of 10 s, storm warnings
    return counters(tmp, ecn_off=("roce_np", "roce_rp"),
                    ethtool={"tx_prio3_pause_duration": 4_000_000,
                             "tx_pause_storm_warning_events": 3}), "pfc.pause_storm"


def test_fixture_tree_is_clean_with_pfc_on_prio3(tmp_path):
    from collectors.snapshot import collect
    from wanprobe.diagnose.engine import run_rules
    from wanprobe.diagnose.fabric_counters import pfc_off, pfc_priorities
    from wanprobe.report.codec import measured_of

    c = counters(tmp_path)
    eth = tmp_path / "eth1"
    nd = collect(sys_root=SYN / "sys", proc_root=tmp_path / "noproc", ethtool_root=eth,
                 dcb=False).netdevs[NETDEV]
    assert pfc_priorities(nd) == {3} and not pfc_off(nd, 3) and pfc_off(nd, 0)
    assert nd.ecn.enabled_on("roce_np", 3) and nd.ecn.enabled_on("roce_rp", 3)
    # clean: PFC pausing briefly is an info note
    out = run_rules(measured_of(meas(counters=c)), None)
    assert ids(out) == ["pfc.pause_active"] and out[0].severity == "info"


def test_roce_drops_pfc_off_has_roce_knobs(tmp_path):
    c, want = drops_pfc_off(tmp_path)
    f = {f["id"]: f for f in c["findings"]}[want]
    assert f["severity"] == "critical" and f["evidence"]["pfc_off"] == [NETDEV]
    assert f["evidence"]["counter"] == "packet_seq_err" and f["evidence"]["delta"] == 400
    assert {(k["tuner"], k["key"], k["value"]) for k in f["knobs"]} == {
        ("roce", f"{NETDEV}/pfc", "3"), ("roce", f"{NETDEV}/trust", "dscp")}
    assert "nic.discards" in [f["id"] for f in c["findings"]]


def test_roce_drops_with_pfc_on_is_lossless_drops(tmp_path):
    c = counters(tmp_path, hw={"out_of_sequence": 50})
    f = {f["id"]: f for f in c["findings"]}
    assert f["roce.lossless_drops"]["severity"] == "critical" and "roce.drops_pfc_off" not in f


@pytest.mark.parametrize("make", [drops_pfc_off, ecn_off, storm])
def test_engine_ranks_fabric_fault_first(tmp_path, make):
    from wanprobe.diagnose.engine import run_rules
    from wanprobe.report.codec import measured_of

    c, want = make(tmp_path)
    out = run_rules(measured_of(meas(counters=c)), None)
    assert out[0].id == want, ids(out)
    assert len(ids(out)) == len(set(ids(out)))


def test_storm_share_and_impact(tmp_path):
    c = counters(tmp_path, ethtool={"rx_prio3_pause_duration": 6_500_000})  # 65 % of 10 s
    f = {f["id"]: f for f in c["findings"]}["pfc.pause_storm"]
    assert f["severity"] == "critical" and f["impact"] == pytest.approx(0.65, abs=0.01)


def test_ecn_off_gives_one_finding_with_both_knobs(tmp_path):
    from wanprobe.diagnose.engine import run_rules
    from wanprobe.report.codec import measured_of

    out = run_rules(measured_of(meas(counters=counters(tmp_path, ecn_off=("roce_np", "roce_rp")))),
                    None)
    assert ids(out).count("roce.ecn_disabled") == 1
    f = out[ids(out).index("roce.ecn_disabled")]
    assert {k.key for k in f.knobs} == {f"{NETDEV}/ecn_np/3", f"{NETDEV}/ecn_rp/3"}
    assert f.evidence["disabled"] == ["roce_np", "roce_rp"]


def test_counter_names_one_table_every_kind_used():
    """Every kind in the driver table is asked for by a rule (no dead rows), and a name means
    one kind of event only, except the uncorrectable/error subsets of phy_errors/storm_events."""
    import inspect

    from wanprobe.diagnose import counter_names, fabric_counters, rules_fabric, rules_nic

    src = "".join(inspect.getsource(m) for m in (rules_fabric, rules_nic, fabric_counters))
    kinds = {k for d in counter_names.DRIVERS.values() for k in d}
    assert {k for k in kinds if f'"{k}"' not in src} == set()
    subsets = {"phy_uncorrectable": "phy_errors", "storm_errors": "storm_events"}
    seen: dict[str, str] = {}
    for kind in sorted(kinds - set(subsets)):
        for name in counter_names.names(kind):
            assert seen.setdefault(name, kind) == kind, (name, kind, seen[name])
    for sub, whole in subsets.items():
        assert counter_names.names(sub) <= counter_names.names(whole)
