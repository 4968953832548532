"""Apply as a transaction on a tmp /proc tree: journal first, verify, undo on failure, recover
after a crash, refuse bad plans before anything changes (no root needed)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tuner_cases import make_proc, sysctl_plans

from tuners import transaction
from tuners.journal import JournalStore
from tuners.knob import Change
from tuners.plan import Plan, host_id, now_iso
from tuners.sysctl import SysctlTuner
from wanprobe.errors import ConfigError, TuneError


def snapshot(proc: Path) -> dict[str, str]:
    return {str(p.relative_to(proc)): " ".join(p.read_text().split())
            for p in sorted((proc / "sys").rglob("*")) if p.is_file()}


def plan_of(*changes: tuple[str, str], host: str | None = None) -> Plan:
    return Plan(host_id=host or host_id(), netns_inode=0, created_at=now_iso(),
                changes=tuple(Change("sysctl", k, None, v, "test") for k, v in changes))


GOOD = (("net.ipv4.tcp_rmem", "4096 131072 67108864"), ("net.ipv4.tcp_congestion_control", "bbr"),
        ("net.ipv4.tcp_mtu_probing", "1"), ("net.ipv4.tcp_slow_start_after_idle", "0"))


@pytest.fixture
def env(tmp_path: Path):
    proc = make_proc(tmp_path / "proc")
    tuners = {"sysctl": SysctlTuner(proc, init_netns=False)}
    return proc, tuners, JournalStore(tmp_path / "state")


def test_apply_then_rollback_restores_exactly(env) -> None:
    proc, tuners, store = env
    before = snapshot(proc)
    journal, _ = transaction.apply_plan(plan_of(*GOOD), tuners, store, host_id=host_id())
    assert journal.state == "applied" and len(journal.entries) == 4
    assert tuners["sysctl"].current("net.ipv4.tcp_rmem") == "4096 131072 67108864"
    assert journal.entries[0].change.old == "4096 131072 6291456"
    assert all(e.change.netns_inode == os.stat("/proc/thread-self/ns/net").st_ino for e in journal.entries)
    rows = transaction.status(store, tuners)
    assert rows[0]["journal"] == journal.id and not rows[0]["drift"]
    done = transaction.rollback(store, tuners)
    assert done.state == "rolled_back" and snapshot(proc) == before


def test_journal_is_on_disk_before_the_first_write(env) -> None:
    proc, tuners, store = env
    seen = {}

    def fault(i: int, change: Change) -> None:
        files = list(store.dir.glob("*.json"))
        seen["journal"] = json.loads(files[0].read_text())
        seen["live"] = tuners["sysctl"].current("net.ipv4.tcp_rmem")
        raise TuneError("injected")

    with pytest.raises(TuneError):
        transaction.apply_plan(plan_of(*GOOD), tuners, store, host_id=host_id(), fault=fault)
    j = seen["journal"]
    assert j["state"] == "applying" and j["journal_version"] == 1
    assert j["entries"][0]["old"] == "4096 131072 6291456" == seen["live"]
    assert j["entries"][0]["netns_inode"] == j["netns_inode"] > 0


def test_status_reports_drift(env) -> None:
    proc, tuners, store = env
    transaction.apply_plan(plan_of(*GOOD), tuners, store, host_id=host_id())
    (proc / "sys/net/ipv4/tcp_mtu_probing").write_text("2\n")  # someone else
    rows = transaction.status(store, tuners)
    drift = [e["key"] for e in rows[0]["entries"] if e["drift"]]
    assert drift == ["net.ipv4.tcp_mtu_probing"] and rows[0]["drift"]
    with pytest.raises(TuneError, match="changed by someone else"):
        transaction.rollback(store, tuners)  # leaves the foreign value alone ...
    assert tuners["sysctl"].current("net.ipv4.tcp_mtu_probing") == "2"
    assert tuners["sysctl"].current("net.ipv4.tcp_rmem") == "4096 131072 6291456"  # ... restores the rest
    transaction.rollback(store, tuners, force=True)  # an explicit retry with --force takes it back too
    assert tuners["sysctl"].current("net.ipv4.tcp_mtu_probing") == "0"


def test_crash_leaves_applying_and_next_run_recovers(env) -> None:
    proc, tuners, store = env
    before = snapshot(proc)

    def crash(i: int, change: Change) -> None:
        if i == 2:
            raise KeyboardInterrupt  # not handled by apply: like a kill, the journal stays "applying"

    with pytest.raises(KeyboardInterrupt):
        transaction.apply_plan(plan_of(*GOOD), tuners, store, host_id=host_id(), fault=crash)
    assert store.all()[0].state == "applying" and snapshot(proc) != before
    rows = transaction.status(store, tuners)  # any tune run recovers first
    assert rows[0]["recovered"] and snapshot(proc) == before
    assert store.all()[0].state == "recovered"


def test_failed_write_midway_restores_and_says_where(env) -> None:
    proc, tuners, store = env
    before = snapshot(proc)
    os.chmod(proc / "sys/net/ipv4/tcp_mtu_probing", 0o444)  # validate() refuses read-only ...
    with pytest.raises(ConfigError, match="read-only"):
        transaction.apply_plan(plan_of(*GOOD), tuners, store, host_id=host_id())
    assert snapshot(proc) == before and store.all() == []  # ... before any journal or write
    os.chmod(proc / "sys/net/ipv4/tcp_mtu_probing", 0o644)

    class Flaky(SysctlTuner):
        def apply(self, change: Change) -> None:
            if change.key == "net.ipv4.tcp_mtu_probing":
                raise TuneError("writing net.ipv4.tcp_mtu_probing=1 failed: EPERM")
            super().apply(change)

    flaky = {"sysctl": Flaky(proc, init_netns=False)}
    with pytest.raises(TuneError) as err:
        transaction.apply_plan(plan_of(*GOOD), flaky, store, host_id=host_id())
    msg = str(err.value)
    assert "step 3/4" in msg and "tcp_mtu_probing" in msg and "2 restored" in msg and "\n" not in msg
    assert snapshot(proc) == before and store.all()[0].state == "failed"


def test_verify_failure_rolls_back(env) -> None:
    proc, tuners, store = env
    before = snapshot(proc)

    class Clamping(SysctlTuner):  # a kernel that silently clamps what it is given
        def apply(self, change: Change) -> None:
            super().apply(Change(change.tuner, change.key, change.old, "1", ""))

    with pytest.raises(TuneError, match="verify failed"):
        transaction.apply_plan(plan_of(("net.ipv4.tcp_congestion_control", "bbr"),
                                       ("net.ipv4.tcp_ecn", "0")),
                               {"sysctl": Clamping(proc, init_netns=False)}, store, host_id=host_id())
    assert snapshot(proc) == before


def test_rollback_refuses_older_journal_under_a_newer_one(env) -> None:
    proc, tuners, store = env
    before = snapshot(proc)
    j1, _ = transaction.apply_plan(plan_of(("net.ipv4.tcp_mtu_probing", "1")), tuners, store, host_id=host_id())
    transaction.apply_plan(plan_of(("net.ipv4.tcp_mtu_probing", "2")), tuners, store, host_id=host_id())
    with pytest.raises(ConfigError, match="roll it back first"):
        transaction.rollback(store, tuners, j1.id)
    transaction.rollback(store, tuners)
    transaction.rollback(store, tuners)
    assert snapshot(proc) == before
    with pytest.raises(ConfigError, match="nothing applied"):
        transaction.rollback(store, tuners)


def test_apply_never_lowers_a_higher_live_value(env) -> None:
    proc, tuners, store = env
    (proc / "sys/net/ipv4/tcp_rmem").write_text("4096\t131072\t134217728\n")  # an admin raised it since
    j, prep = transaction.apply_plan(plan_of(*GOOD[:2]), tuners, store, host_id=host_id())
    assert [e.change.key for e in j.entries] == ["net.ipv4.tcp_congestion_control"]
    assert "never lowered" in prep.skipped[0].reason
    assert tuners["sysctl"].current("net.ipv4.tcp_rmem") == "4096 131072 134217728"


def test_persist_failure_rolls_back_everything(env, tmp_path: Path) -> None:
    proc, tuners, store = env
    before = snapshot(proc)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(TuneError, match="persisting to .*; rolled back \\(2 restored\\)"):
        transaction.apply_plan(plan_of(*GOOD[:2]), tuners, store, host_id=host_id(), persist_dir=blocker / "sysctl.d")
    assert snapshot(proc) == before and store.all()[0].state == "failed"


def test_persist_writes_and_rollback_removes(env, tmp_path: Path) -> None:
    proc, tuners, store = env
    sysctl_d = tmp_path / "sysctl.d"
    j, _ = transaction.apply_plan(plan_of(*GOOD[:2]), tuners, store, host_id=host_id(), persist_dir=sysctl_d)
    text = (sysctl_d / "90-wanprobe.conf").read_text()
    assert "net.ipv4.tcp_rmem = 4096 131072 67108864\n" in text and "tcp_congestion_control = bbr" in text
    transaction.rollback(store, tuners)
    assert not (sysctl_d / "90-wanprobe.conf").exists()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=sysctl_plans(), fail_at=st.integers(0, 9), mode=st.sampled_from(["error", "crash", "none"]))
def test_property_any_plan_any_failure_restores_snapshot(tmp_path_factory, changes, fail_at, mode) -> None:
    root = tmp_path_factory.mktemp("prop")
    proc = make_proc(root / "proc")
    tuners = {"sysctl": SysctlTuner(proc, init_netns=False)}
    store = JournalStore(root / "state")
    before = snapshot(proc)

    def fault(i: int, change: Change) -> None:
        if i == fail_at and mode == "error":
            raise TuneError("injected")
        if i == fail_at and mode == "crash":
            raise KeyboardInterrupt

    try:
        journal, _ = transaction.apply_plan(plan_of(*changes), tuners, store, host_id=host_id(), fault=fault)
    except TuneError:
        assert snapshot(proc) == before  # rolled back at once
    except KeyboardInterrupt:
        transaction.status(store, tuners)  # the next run recovers
    else:
        after = snapshot(proc)
        changed = {k for k in before if before[k] != after[k]}
        assert changed <= {"sys/" + k.replace(".", "/") for k, _ in changes}  # nothing outside the plan
        if journal is None:  # every value was already in place: nothing written, nothing journalled
            assert not changed and store.all() == []
        else:
            transaction.rollback(store, tuners)
    assert snapshot(proc) == before


# -- CLI: bad input is one line, exit 2, nothing changed --------------------------------------

@pytest.fixture
def run_cli(capsys):
    """Run the real CLI entry point in this process (no interpreter start-up per call)."""
    from wanprobe.cli import main

    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)

    return run


def write_plan(path: Path, changes: list[dict], host: str | None = None) -> Path:
    path.write_text(json.dumps({"plan_version": 1, "host_id": host or host_id(), "netns_inode": 0,
                                "created_at": now_iso(), "changes": changes}))
    return path


@pytest.mark.parametrize("change,host,why", [
    ({"tuner": "sysctl", "key": "net.ipv4.tcp_fancy", "old": None, "new": "1"}, None, "unknown sysctl key"),
    ({"tuner": "sysctl", "key": "net.ipv4.tcp_mtu_probing", "old": "0", "new": "7"}, None, "outside the kernel's range"),
    ({"tuner": "sysctl", "key": "net.ipv4.tcp_rmem", "old": "", "new": "4096 131072 99999999999"}, None, "above the 1 GiB cap"),
    ({"tuner": "sysctl", "key": "net.ipv4.tcp_mtu_probing", "old": "0", "new": "1"}, "other-machine/otherhost", "made for host"),
    ({"tuner": "bogus", "key": "x", "old": None, "new": "1"}, None, "unknown tuner"),
])
def test_cli_refuses_bad_plans_before_any_change(run_cli, tmp_path: Path, change, host, why) -> None:
    proc = make_proc(tmp_path / "proc")
    before = snapshot(proc)
    good = {"tuner": "sysctl", "key": "net.ipv4.tcp_slow_start_after_idle", "old": "1", "new": "0"}
    plan = write_plan(tmp_path / "plan.json", [good, change], host)
    r = run_cli("tune", "apply", str(plan), "--yes", "--proc-root", str(proc), "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and why in lines[0] and "Traceback" not in r.stderr
    assert snapshot(proc) == before
    assert not list((tmp_path / "st").glob("journal/*.json"))


@pytest.mark.parametrize("text,why", [
    ('{"plan_version": 1, "changes": [', "not JSON"),
    ('{"plan_version": 1, "host_id": "x", "netns_inode": "abc", "changes": []}', "malformed plan"),
    ('{"plan_version": 7, "host_id": "x", "changes": []}', "unsupported plan_version"),
    ('{"plan_version": 1, "host_id": "x", "changes": [{"tuner": "sysctl"}]}', "bad change"),
    ('[1, 2]', "must be a JSON object"),
])
def test_cli_refuses_bad_plan_files(run_cli, tmp_path: Path, text: str, why: str) -> None:
    (tmp_path / "plan.json").write_text(text)
    r = run_cli("tune", "apply", str(tmp_path / "plan.json"), "--yes", "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_cli_plan_dry_run_apply_status_rollback(run_cli, tmp_path: Path) -> None:
    proc = make_proc(tmp_path / "proc")
    before = snapshot(proc)
    rep = {"schema_version": "1.0", "id": "r9", "host": {}, "peer": {"address": "198.18.0.2"},
           "measurements": {}, "findings": [{"id": "window-limited", "severity": "high", "title": "w",
           "knobs": [{"tuner": "sysctl", "key": "net.ipv4.tcp_rmem", "value": "4096 131072 67108864",
                      "reason": "tcp_rmem max 6 MiB caps one stream at 390 Mbit/s"}]}]}
    (tmp_path / "r.json").write_text(json.dumps(rep))
    common = ["--proc-root", str(proc)]
    st_dir = ["--state-dir", str(tmp_path / "st")]
    r = run_cli("tune", "plan", "-r", str(tmp_path / "r.json"), "-o", str(tmp_path / "p.json"), *common)
    assert r.returncode == 0, r.stderr
    r = run_cli("tune", "apply", str(tmp_path / "p.json"), *common, *st_dir)
    assert r.returncode == 0 and "nothing changed" in r.stdout and "67108864" in r.stdout
    assert snapshot(proc) == before
    r = run_cli("tune", "apply", str(tmp_path / "p.json"), "--yes", "--json", *common, *st_dir,
                "--persist", "--sysctl-d", str(tmp_path / "sysctl.d"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["journal"]["state"] == "applied"
    assert (tmp_path / "sysctl.d/90-wanprobe.conf").exists()
    (proc / "sys/net/ipv4/tcp_rmem").write_text("4096 131072 8388608\n")
    r = run_cli("tune", "status", "--json", *common, *st_dir)  # not the configured sysctl.d:
    assert "refused, left alone" in r.stderr and "--sysctl-d" in r.stderr  # the journal is
    assert json.loads(r.stdout)["journals"] == []  # refused, in one line (issue 19)
    st_dir += ["--sysctl-d", str(tmp_path / "sysctl.d")]
    r = run_cli("tune", "status", "--json", *common, *st_dir)
    assert json.loads(r.stdout)["drift"] is True
    (proc / "sys/net/ipv4/tcp_rmem").write_text("4096 131072 67108864\n")
    r = run_cli("tune", "rollback", "--print", *common, *st_dir)  # paste-able, changes nothing
    assert r.returncode == 0 and "sysctl -w net.ipv4.tcp_rmem='4096 131072 6291456'" in r.stdout
    assert "rm -f " in r.stdout and (tmp_path / "sysctl.d/90-wanprobe.conf").exists()
    r = run_cli("tune", "rollback", *common, *st_dir)
    assert r.returncode == 0, r.stderr
    assert snapshot(proc) == before and not (tmp_path / "sysctl.d/90-wanprobe.conf").exists()
    r = run_cli("tune", "rollback", *common, *st_dir)
    assert r.returncode == 2 and "nothing applied" in r.stderr
