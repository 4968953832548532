"""sysctl tuner and plan building on a tmp /proc tree (no root, no namespaces)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tuner_cases import make_proc

from tuners.from_report import build_plan
from tuners.knob import Change, Skip, same_value
from tuners.plan import Plan
from tuners.sysctl import SysctlTuner
from wanprobe.errors import ConfigError


def report(*knobs: dict) -> dict:
    return {"schema_version": "1.0", "id": "rep-1", "host": {"hostname": "h"}, "peer": {"address": "198.18.0.2"},
            "measurements": {}, "findings": [{"id": "window-limited", "severity": "high",
                                              "title": "window", "knobs": list(knobs)}]}


@pytest.fixture
def tuner(tmp_path: Path) -> SysctlTuner:
    return SysctlTuner(make_proc(tmp_path / "proc"), sys_root=tmp_path / "sys",
                       init_netns=False, modules_dir=tmp_path / "mods")


def test_current_normalises_tabs(tuner: SysctlTuner) -> None:
    assert tuner.current("net.ipv4.tcp_rmem") == "4096 131072 6291456"
    assert tuner.current("net.core.default_qdisc") is None


def test_same_value_compares_fields_as_ints() -> None:
    assert same_value("4096\t131072\t6291456", "4096 131072 6291456")
    assert same_value("0010", "10")
    assert not same_value("4096 131072 6291456", "4096 131072 6291457")
    assert same_value("bbr", " bbr\n") and not same_value("bbr", "reno")
    assert not same_value(None, "1") and same_value(None, None)


def test_plan_cc_only_what_the_namespace_allows(tuner: SysctlTuner) -> None:
    skip = tuner.plan("net.ipv4.tcp_congestion_control", "cubic", "loss")
    assert isinstance(skip, Skip) and "non-init" in skip.reason
    assert isinstance(tuner.plan("net.ipv4.tcp_congestion_control", "htcp", "x"), Skip)
    change = tuner.plan("net.ipv4.tcp_congestion_control", "bbr", "loss")
    assert change == Change("sysctl", "net.ipv4.tcp_congestion_control", "reno", "bbr", "loss")


def test_plan_cc_in_init_namespace_may_use_any_available(tmp_path: Path) -> None:
    t = SysctlTuner(make_proc(tmp_path), init_netns=True)
    assert isinstance(t.plan("net.ipv4.tcp_congestion_control", "cubic", "x"), Change)


def test_plan_clamps_buffers(tuner: SysctlTuner) -> None:
    c = tuner.plan("net.ipv4.tcp_rmem", f"4096 131072 {2**33}", "bdp")
    assert isinstance(c, Change) and c.new == f"4096 131072 {2**30}"


def test_plan_never_lowers_admin_value(tuner: SysctlTuner) -> None:
    s = tuner.plan("net.ipv4.tcp_rmem", "4096 87380 4194304", "bdp")
    assert isinstance(s, Skip)  # field-wise max equals the live value
    c = tuner.plan("net.ipv4.tcp_rmem", "1024 65536 33554432", "bdp")
    assert c.new == "4096 131072 33554432"  # min/default not lowered either
    assert tuner.lowers_admin_value("net.ipv4.tcp_rmem", "4096 131072 1048576")
    assert not tuner.lowers_admin_value("net.ipv4.tcp_rmem", "4096 131072 67108864")


def test_plan_skips_absent_and_read_only_keys(tuner: SysctlTuner) -> None:
    ro = tuner.plan("net.core.rmem_max", 67108864, "x")
    assert isinstance(ro, Skip) and "read-only" in ro.reason
    absent = tuner.plan("net.core.default_qdisc", "fq", "x")
    assert isinstance(absent, Skip) and "absent" in absent.reason


@pytest.mark.parametrize("key,value,why", [
    ("net.ipv4.tcp_rmem", "4096 131072", "three numbers"),
    ("net.ipv4.tcp_rmem", "4096 131072 2147483648", "1 GiB cap"),
    ("net.ipv4.tcp_rmem", "8192 4096 65536", "min ≤ default"),
    ("net.ipv4.tcp_mtu_probing", "3", "outside the kernel's range 0..2"),
    ("net.ipv4.tcp_slow_start_after_idle", "x", "not a number"),
    ("net.ipv4.tcp_congestion_control", "cubic", "tcp_allowed_congestion_control"),
    ("net.core.rmem_default", "134217728", "unknown sysctl key"),
    ("net.core.default_qdisc", "fq", "not available"),
])
def test_check_value_refuses_with_reason(tuner: SysctlTuner, key: str, value: str, why: str) -> None:
    with pytest.raises(ConfigError) as err:
        tuner.check_value(key, value)
    assert why in str(err.value) and "\n" not in str(err.value)


def test_build_plan_from_report(tuner: SysctlTuner, tmp_path: Path) -> None:
    rep = report(
        {"tuner": "sysctl", "key": "net.ipv4.tcp_rmem", "value": "4096 131072 67108864", "reason": "2×BDP"},
        {"tuner": "sysctl", "key": "net.ipv4.tcp_congestion_control", "value": "cubic"},
        {"tuner": "sysctl", "key": "net.ipv4.tcp_congestion_control", "value": "bbr"},
        {"tuner": "sysctl", "key": "net.core.rmem_max", "value": 67108864},
        {"tuner": "nccl", "key": "NCCL_SOCKET_NTHREADS", "value": 4},
    )
    path = tmp_path / "r.json"
    path.write_text(json.dumps(rep))
    plan = build_plan(rep, {"sysctl": tuner}, host_id="m/h", report_path=path)
    assert [(c.key, c.new) for c in plan.changes] == [
        ("net.ipv4.tcp_rmem", "4096 131072 67108864"), ("net.ipv4.tcp_congestion_control", "bbr")]
    assert "2×BDP" in plan.changes[0].reason
    assert [s.key for s in plan.skipped] == ["net.core.rmem_max"]
    assert plan.manual[0].key == "NCCL_SOCKET_NTHREADS"
    again = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again.changes == plan.changes and again.id == plan.id
    assert plan.source_report["id"] == "rep-1"


def test_build_plan_respects_side(tuner: SysctlTuner) -> None:
    rep = report(
        {"tuner": "sysctl", "key": "net.ipv4.tcp_rmem", "value": "4096 131072 67108864", "side": "peer"},
        {"tuner": "sysctl", "key": "net.ipv4.tcp_mtu_probing", "value": "1", "side": "both"},
        {"tuner": "sysctl", "key": "net.ipv4.tcp_slow_start_after_idle", "value": "0", "side": "local"},
    )
    local = build_plan(rep, {"sysctl": tuner}, host_id="m/h")
    assert [c.key for c in local.changes] == ["net.ipv4.tcp_mtu_probing", "net.ipv4.tcp_slow_start_after_idle"]
    assert "--side peer" in local.skipped[0].reason
    peer = build_plan(rep, {"sysctl": tuner}, host_id="m/h", side="peer")
    assert [c.key for c in peer.changes] == ["net.ipv4.tcp_rmem", "net.ipv4.tcp_mtu_probing"]
    with pytest.raises(ConfigError):
        build_plan(rep, {"sysctl": tuner}, host_id="m/h", side="remote")


def test_no_buffer_tuning_on_a_100_mbit_nic(tuner: SysctlTuner) -> None:
    rep = report({"tuner": "sysctl", "key": "net.ipv4.tcp_rmem", "value": "4096 131072 67108864"},
                 {"tuner": "sysctl", "key": "net.ipv4.tcp_congestion_control", "value": "bbr"})
    rep["host"]["ifaces"] = {"eth0": {"speed_mbps": 100}}
    rep["measurements"] = {"mtu": {"iface": "eth0"}}
    plan = build_plan(rep, {"sysctl": tuner}, host_id="m/h")
    assert [c.key for c in plan.changes] == ["net.ipv4.tcp_congestion_control"]
    assert "100 Mbit/s" in plan.skipped[0].reason
