"""Live apply / rollback / recovery inside network namespaces this test creates (never root's).

The conftest session check asserts the root namespace's TCP sysctls are unchanged at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import new_lab_name
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tuner_cases import sysctl_plans

from tuners.knob import Change
from tuners.plan import Plan, host_id, now_iso, save

pytestmark = pytest.mark.netns
REPO = Path(__file__).resolve().parent.parent

# Runs inside a namespace: snapshot / apply-with-fault / recover, all through the library.
HELPER = r"""
import json, os, signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from tuners import transaction
from tuners.journal import JournalStore
from tuners.knob import Change
from tuners.plan import Plan, host_id, now_iso
from tuners.sysctl import SysctlTuner
from wanprobe.errors import WanprobeError
args = json.loads(sys.argv[1])
def snap():
    out = {}
    for d in ("/proc/sys/net/ipv4", "/proc/sys/net/core"):
        for p in sorted(Path(d).iterdir()):
            if d.endswith("ipv4") and not p.name.startswith("tcp"):
                continue
            try:
                out[str(p)] = " ".join(p.read_text().split())
            except OSError:
                pass
    return out
if args["op"] == "snapshot":
    print(json.dumps(snap())); sys.exit(0)
# "kernel_refuses": validate as if in the init namespace, so the kernel itself says EPERM (cubic)
tuners = {"sysctl": SysctlTuner(init_netns=True if args.get("kernel_refuses") else None)}
store = JournalStore(Path(args["state"]))
if args["op"] == "recover":
    transaction.status(store, tuners); print(json.dumps(snap())); sys.exit(0)
if args["op"] == "rollback":
    transaction.rollback(store, tuners); print(json.dumps(snap())); sys.exit(0)
before = snap()
plan = Plan(host_id=host_id(), netns_inode=0, created_at=now_iso(),
            changes=tuple(Change("sysctl", k, None, v, "prop") for k, v in args["changes"]))
def fault(i, change):
    if i == args["fail_at"]:
        if args["mode"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if args["mode"] == "error":
            raise WanprobeError("injected failure")
try:
    journal, _ = transaction.apply_plan(plan, tuners, store, host_id=host_id(), fault=fault)
    print(json.dumps({"applied": journal is not None, "before": before, "snap": snap()}))
except WanprobeError as exc:
    print(json.dumps({"applied": False, "error": str(exc), "before": before, "snap": snap()}))
"""


def sh(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, **kw)


def in_ns(ns: str, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return sh("ip", "netns", "exec", ns, *argv, env={**os.environ, **(env or {})})


def helper(ns: str, **args) -> subprocess.CompletedProcess:
    return in_ns(ns, sys.executable, "-c", HELPER, json.dumps(args), str(REPO))


def snapshot(ns: str) -> dict[str, str]:
    r = helper(ns, op="snapshot")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wanprobe(ns: str | None, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "wanprobe", *args]
    return in_ns(ns, *argv, env=env) if ns else sh(*argv, env={**os.environ, **(env or {})})


@pytest.fixture
def netns():
    """Factory of empty namespaces (loopback up), deleted afterwards even on failure."""
    made: list[str] = []

    def make() -> str:
        name = new_lab_name() + "tu"
        subprocess.run(["ip", "netns", "add", name], check=True)
        made.append(name)
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        return name

    yield make
    for name in made:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def report_file(tmp_path: Path, knobs: list[dict]) -> Path:
    rep = {"schema_version": "1.0", "id": "live-1", "host": {}, "peer": {"address": "198.18.0.2"},
           "measurements": {}, "findings": [{"id": "window-limited", "severity": "high",
                                             "title": "window-limited", "knobs": knobs}]}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(rep))
    return path


KNOBS = [
    {"tuner": "sysctl", "key": "net.ipv4.tcp_rmem", "value": "4096 131072 67108864", "reason": "2×BDP"},
    {"tuner": "sysctl", "key": "net.ipv4.tcp_wmem", "value": "4096 16384 67108864", "reason": "2×BDP"},
    {"tuner": "sysctl", "key": "net.ipv4.tcp_congestion_control", "value": "cubic", "reason": "loss"},
    {"tuner": "sysctl", "key": "net.ipv4.tcp_congestion_control", "value": "reno", "reason": "fallback"},
    {"tuner": "sysctl", "key": "net.ipv4.tcp_notsent_lowat", "value": 131072},
    {"tuner": "sysctl", "key": "net.ipv4.tcp_slow_start_after_idle", "value": 0},
    {"tuner": "sysctl", "key": "net.core.rmem_max", "value": 67108864},
    {"tuner": "link", "key": "lo/txqueuelen", "value": 10000},
]


def test_plan_apply_rollback_in_a_namespace(netns, tmp_path: Path) -> None:
    ns = netns()
    before = snapshot(ns)
    st_dir = ["--state-dir", str(tmp_path / "st")]
    r = wanprobe(ns, "tune", "plan", "-r", str(report_file(tmp_path, KNOBS)), "-o", str(tmp_path / "p.json"), "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    keys = {c["key"]: c["new"] for c in plan["changes"]}
    assert keys["net.ipv4.tcp_congestion_control"] == "reno"  # cubic is not allowed in a netns (EPERM)
    skipped = {s["key"]: s["reason"] for s in plan["skipped"]}
    assert "read-only" in skipped["net.core.rmem_max"]
    r = wanprobe(ns, "tune", "apply", str(tmp_path / "p.json"), "--yes", "--persist", *st_dir)
    assert r.returncode == 2 and "non-init network namespace" in r.stderr  # would write the host's /etc
    assert snapshot(ns) == before
    r = wanprobe(ns, "tune", "apply", str(tmp_path / "p.json"), "--yes", *st_dir)
    assert r.returncode == 0, r.stderr
    live = snapshot(ns)
    assert live["/proc/sys/net/ipv4/tcp_rmem"] == "4096 131072 67108864"
    assert live["/proc/sys/net/ipv4/tcp_notsent_lowat"] == "131072"
    assert re.search(r"qlen 10000\b", sh("ip", "-n", ns, "link", "show", "lo").stdout)
    r = wanprobe(ns, "tune", "status", "--json", *st_dir)
    assert json.loads(r.stdout)["drift"] is False
    r = wanprobe(ns, "tune", "rollback", *st_dir)
    assert r.returncode == 0, r.stderr
    assert snapshot(ns) == before
    assert re.search(r"qlen 1000\b", sh("ip", "-n", ns, "link", "show", "lo").stdout)


def test_netns_option_enters_the_named_namespace(netns, tmp_path: Path) -> None:
    ns = netns()
    before = snapshot(ns)
    r = wanprobe(None, "tune", "plan", "-r", str(report_file(tmp_path, KNOBS[:2])), "-o",
                 str(tmp_path / "p.json"), "--netns", ns)
    assert r.returncode == 0, r.stderr
    st_dir = ["--state-dir", str(tmp_path / "st"), "--netns", ns]
    assert wanprobe(None, "tune", "apply", str(tmp_path / "p.json"), "--yes", *st_dir).returncode == 0
    assert snapshot(ns)["/proc/sys/net/ipv4/tcp_wmem"] == "4096 16384 67108864"
    r = wanprobe(None, "tune", "status", "--json", "--state-dir", str(tmp_path / "st"))
    assert json.loads(r.stdout)["journals"] == []  # the root namespace sees none of it
    assert wanprobe(None, "tune", "rollback", *st_dir).returncode == 0
    assert snapshot(ns) == before


def test_two_namespaces_sharing_a_state_dir_do_not_undo_each_other(netns, tmp_path: Path) -> None:
    a, b = netns(), netns()
    before_a, before_b = snapshot(a), snapshot(b)
    st_dir = ["--state-dir", str(tmp_path / "shared")]
    for ns, rmem in ((a, "33554433"), (b, "50331648")):
        plan = Plan(host_id=host_id(), netns_inode=0, created_at=now_iso(),
                    changes=(Change("sysctl", "net.ipv4.tcp_rmem", None, f"4096 131072 {rmem}", "2×BDP"),))
        save(plan, tmp_path / f"{ns}.json")
        assert wanprobe(ns, "tune", "apply", str(tmp_path / f"{ns}.json"), "--yes", *st_dir).returncode == 0
    assert wanprobe(a, "tune", "rollback", *st_dir).returncode == 0
    assert snapshot(a) == before_a
    assert snapshot(b)["/proc/sys/net/ipv4/tcp_rmem"] == "4096 131072 50331648"  # b untouched
    r = wanprobe(a, "tune", "rollback", *st_dir)
    assert r.returncode == 2 and "nothing applied" in r.stderr  # a never rolls back b's journal
    status_b = json.loads(wanprobe(b, "tune", "status", "--json", *st_dir).stdout)
    assert len(status_b["journals"]) == 1 and status_b["drift"] is False
    assert wanprobe(b, "tune", "rollback", *st_dir).returncode == 0
    assert snapshot(b) == before_b


def apply_four(ns: str, tmp_path: Path, cc: str, **failure) -> subprocess.CompletedProcess:
    """The helper applies four sysctls in ``ns`` (state in tmp_path/st), the third the default
    cc, failing as ``failure`` says (fail_at, mode, kernel_refuses)."""
    changes = [["net.ipv4.tcp_rmem", "4096 131072 67108864"], ["net.ipv4.tcp_mtu_probing", "1"],
               ["net.ipv4.tcp_congestion_control", cc], ["net.ipv4.tcp_ecn", "0"]]
    return helper(ns, op="apply", state=str(tmp_path / "st"), changes=changes, **failure)


def test_kill_9_mid_apply_is_recovered_by_the_next_run(netns, tmp_path: Path) -> None:
    ns = netns()
    before = snapshot(ns)
    r = apply_four(ns, tmp_path, "reno", fail_at=2, mode="kill")
    assert r.returncode == -signal.SIGKILL
    assert snapshot(ns) != before  # two changes were made before the kill
    journal = json.loads(next((tmp_path / "st/journal").glob("*.json")).read_text())
    assert journal["state"] == "applying"
    r = wanprobe(ns, "tune", "status", "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 0 and "recovered" in r.stdout
    assert snapshot(ns) == before


def test_kernel_refusal_midway_restores_earlier_changes(netns, tmp_path: Path) -> None:
    ns = netns()
    before = snapshot(ns)
    r = apply_four(ns, tmp_path, "cubic", fail_at=-1, mode="none", kernel_refuses=True)
    out = json.loads(r.stdout)
    assert not out["applied"] and "step 3/4" in out["error"] and "EPERM" in out["error"]
    assert "2 restored" in out["error"] and out["snap"] == before == snapshot(ns)


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=sysctl_plans(buffer_max_bytes=2**28), fail_at=st.integers(0, 8), mode=st.sampled_from(["error", "kill", "none"]))
def test_property_live_any_plan_any_failure(netns, tmp_path_factory, changes, fail_at, mode) -> None:
    ns = netns()  # a fresh namespace per example; all are deleted after the test
    state = str(tmp_path_factory.mktemp("st"))
    before = snapshot(ns)
    r = helper(ns, op="apply", state=state, changes=changes, fail_at=fail_at, mode=mode)
    if r.returncode == -signal.SIGKILL:
        after = json.loads(helper(ns, op="recover", state=state).stdout)  # the next run recovers
    else:
        out = json.loads(r.stdout)
        assert out["before"] == before
        if out["applied"]:
            changed = {k for k in before if before[k] != out["snap"][k]}
            assert changed <= {"/proc/sys/" + k.replace(".", "/") for k, _ in changes}
            after = json.loads(helper(ns, op="rollback", state=state).stdout)
        elif "error" in out:
            assert "injected failure" in out["error"]
            after = out["snap"]  # restored by the failed apply itself, before it returned
        else:
            after = out["snap"]  # every value already in place: nothing written
    assert after == before


def _ns_snapshot(node) -> dict[str, str]:
    r = node.run([sys.executable, "-c", HELPER, json.dumps({"op": "snapshot"}), str(REPO)],
                 capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow
def test_real_diagnose_report_plan_apply_rollback_on_the_lab(lab_factory, tmp_path: Path) -> None:
    """The contract with `wanprobe diagnose`: its report drives plans on both ends of a lab
    link; apply then rollback leaves every TCP/core sysctl of both namespaces as it was."""
    lab = lab_factory(rtt_ms=60, rate_bps=200e6)
    for node in (lab.a, lab.b):  # an untuned far and near end: reno, 1 MiB buffers
        node.run(["sysctl", "-q", "-w", "net.ipv4.tcp_rmem=4096 131072 1048576",
                  "net.ipv4.tcp_wmem=4096 16384 1048576", "net.ipv4.tcp_congestion_control=reno"], check=True)
    before = {n.name: _ns_snapshot(n) for n in (lab.a, lab.b)}
    refl = lab.b.popen([sys.executable, "-m", "wanprobe", "reflect", "--bind", lab.b.addr],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        report = tmp_path / "report.json"
        for _ in range(20):  # the reflector needs a moment to bind
            r = lab.a.run([sys.executable, "-m", "wanprobe", "diagnose", lab.b.addr, "--link-rate", "200mbit",
                           "--no-throughput", "-o", str(report)], capture_output=True, text=True, timeout=120)
            if r.returncode == 0:
                break
        assert r.returncode == 0, r.stderr
    finally:
        refl.kill()
        refl.wait()
    state = str(tmp_path / "state")  # one state dir shared by both namespaces
    for side, node in (("local", lab.a), ("peer", lab.b)):
        r = node.run([sys.executable, "-m", "wanprobe", "tune", "plan", "-r", str(report), "--side", side,
                      "--json"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        plan = json.loads(r.stdout)
        keys = {c["key"]: c["new"] for c in plan["changes"]}
        assert int(keys["net.ipv4.tcp_rmem"].split()[2]) > 1048576
        assert keys["net.ipv4.tcp_congestion_control"] == "bbr"
        (tmp_path / f"{side}.json").write_text(r.stdout)
        r = node.run([sys.executable, "-m", "wanprobe", "tune", "apply", str(tmp_path / f"{side}.json"), "--yes",
                      "--state-dir", state], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    assert _ns_snapshot(lab.a)["/proc/sys/net/ipv4/tcp_congestion_control"] == "bbr"
    for node in (lab.b, lab.a):
        r = node.run([sys.executable, "-m", "wanprobe", "tune", "rollback", "--state-dir", state],
                     capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    assert {n.name: _ns_snapshot(n) for n in (lab.a, lab.b)} == before
