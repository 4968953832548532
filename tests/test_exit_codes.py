"""Issue 19, break 8: one exit code per kind of failure, the README's table, each one driven.

An authentication refusal exited 5 ("peer unreachable"), and the daemon on a full disk exited 2,
which the unit's RestartPreventExitStatus=2 never retries: a transient failure must not look
like a bad config. Codes 7 and 8 (peer refusals) are driven in test_throughput_hostile.py."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clirun import invoke, one_line_error
from conftest import REPO, netns_unavailable_reason, require
from tuner_cases import make_proc

from wanprobe import errors


def readme_table() -> dict[int, str]:
    """The README's exit-code table: {code: meaning}."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    return {int(m.group(1)): m.group(2).strip()
            for m in re.finditer(r"^\| (\d+) +\| (.+?) \|$", section, re.M)}


def test_readme_table_matches_the_error_classes():
    table = readme_table()
    classes = {cls.exit_code for cls in vars(errors).values()
               if isinstance(cls, type) and issubclass(cls, errors.WanprobeError)}
    assert classes - {1} <= set(table), f"codes without a README row: {classes - set(table)}"
    assert set(table) == {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 70, 74, 130}
    documented = {int(m.group(1)) for m in re.finditer(r"^(\d+) {2,}", errors.__doc__, re.M)}
    assert documented == set(table), "errors.py's table and the README's differ"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_usage_config_lab_unreachable_and_nothing_answered(tmp_path):
    assert invoke("report", "schema").returncode == 0
    assert invoke("probe", "127.0.0.1", "--count", "nan").returncode == 2          # usage
    (tmp_path / "bad.toml").write_text("[daemon]\nstate_dir = 5\n")
    assert invoke("daemon", "--check", "--config", str(tmp_path / "bad.toml")).returncode == 2
    assert invoke("lab", "exec", "t19-no-such-lab", "a", "--", "true").returncode == 3
    port = str(closed_port())
    assert invoke("throughput", "127.0.0.1", "--port", port, "--duration", "1s").returncode == 5
    r = invoke("probe", "127.0.0.1", "--port", port, "--count", "2", "--interval", "10ms",
               "--timeout", "200ms")
    assert r.returncode == 1, r.stderr  # as ping: ran, nothing answered


def test_tuning_failure_is_6(tmp_path):
    proc = make_proc(tmp_path / "proc")
    rmem = proc / "sys/net/ipv4/tcp_rmem"
    rmem.unlink()
    rmem.mkdir()  # the kernel's file cannot be read: the live value is unknown, nothing written
    from tuners.plan import host_id

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"plan_version": 1, "host_id": host_id(), "changes": [
        {"tuner": "sysctl", "key": "net.ipv4.tcp_rmem", "old": None,
         "new": "4096 131072 67108864"}]}))
    r = invoke("tune", "apply", str(plan), "--yes", "--proc-root", str(proc),
               "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 6 and "cannot read net.ipv4.tcp_rmem" in one_line_error(r)


def applied_plan(tmp_path) -> tuple[Path, list[str]]:
    """Two sysctls applied on a /proc tree in tmp_path; (that proc root, the common flags)."""
    from tuners.plan import host_id

    proc = make_proc(tmp_path / "proc")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"plan_version": 1, "host_id": host_id(), "changes": [
        {"tuner": "sysctl", "key": "net.ipv4.tcp_rmem", "old": None,
         "new": "4096 131072 67108864"},
        {"tuner": "sysctl", "key": "net.ipv4.tcp_mtu_probing", "old": None, "new": "1"}]}))
    common = ["--proc-root", str(proc), "--state-dir", str(tmp_path / "st")]
    assert invoke("tune", "apply", str(plan), "--yes", *common).returncode == 0
    return proc, common


def test_drift_is_9_and_the_status_still_prints(tmp_path):
    """Issue 36: `tune status` said "drift" and exited 0, so no script or timer could act on it."""
    proc, common = applied_plan(tmp_path)
    r = invoke("tune", "status", "--json", *common)
    assert r.returncode == 0 and json.loads(r.stdout)["drift"] is False
    (proc / "sys/net/ipv4/tcp_mtu_probing").write_text("2\n")  # someone else's write
    r = invoke("tune", "status", "--json", *common)
    assert r.returncode == 9 and json.loads(r.stdout)["drift"] is True
    assert "net.ipv4.tcp_mtu_probing live '2', applied '1'" in one_line_error(r)
    r = invoke("tune", "status", *common)
    assert r.returncode == 9 and "drift" in r.stdout  # the table first (its key column folds)
    assert "tcp_mtu_probing live '2'" in one_line_error(r)


def test_a_partial_rollback_is_6_and_names_what_happened_to_each_key(tmp_path):
    """Issue 36: a retried rollback once exited 0 with a key left as someone else set it, and a
    --force retry printed "restored ... (left alone)" from the earlier run's note."""
    proc, common = applied_plan(tmp_path)
    probing = proc / "sys/net/ipv4/tcp_mtu_probing"
    probing.write_text("2\n")
    for _ in range(2):  # the retry is as partial as the first run
        r = invoke("tune", "rollback", *common)
        assert r.returncode == 6 and "incomplete" in one_line_error(r)
        assert "NOT restored sysctl net.ipv4.tcp_mtu_probing (old value 0)" in r.stdout
        assert "restored sysctl net.ipv4.tcp_rmem = 4096 131072 6291456" in r.stdout
        assert probing.read_text().strip() == "2"
    r = invoke("tune", "rollback", "--force", *common)
    assert r.returncode == 0, r.stderr
    assert "restored sysctl net.ipv4.tcp_mtu_probing = 0 (--force: over live '2'" in r.stdout
    assert "left alone" not in r.stdout and "NOT" not in r.stdout
    assert probing.read_text().strip() == "0"


def test_permission_is_4(tmp_path):
    """A state dir root may not create (an immutable parent: EPERM even for root)."""
    locked = tmp_path / "immutable"
    locked.mkdir()
    if subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i needs root and a filesystem with attributes")
    try:
        r = invoke("tune", "rollback", "--proc-root", str(make_proc(tmp_path / "proc")),
                   "--state-dir", str(locked / "st"))
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)
    assert r.returncode == 4 and "cannot write state dir" in one_line_error(r)


def test_internal_error_is_70_and_one_line(monkeypatch):
    from wanprobe.report import document

    monkeypatch.setattr(document, "schema", lambda: (_ for _ in ()).throw(RuntimeError("bug")))
    r = invoke("report", "schema")
    assert r.returncode == 70 and "internal error" in one_line_error(r)


@pytest.mark.lab
def test_interrupt_is_130(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "wanprobe", "probe", "127.0.0.1", "--port",
                          str(closed_port()), "--count", "1000", "--interval", "100ms"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err


def test_full_output_device_is_74(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    full = tmp_path / "full"
    os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    (tmp_path / "r.json").write_text(json.dumps({
        "schema_version": "1.0", "id": "r", "host": {}, "peer": {"address": "198.18.0.2"},
        "measurements": {}, "findings": [{"id": "window-limited", "severity": "high", "title": "w",
        "knobs": [{"tuner": "sysctl", "key": "net.ipv4.tcp_rmem", "value": "4096 131072 67108864",
                   "reason": "r"}]}]}))
    r = invoke("tune", "plan", "-r", str(tmp_path / "r.json"), "-o", str(full), "--proc-root",
               str(make_proc(tmp_path / "proc")), "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 74 and "No space left" in one_line_error(r)


FULL_DISK = """
set -e
mount -t tmpfs -o size=64k tmpfs "$1"
dd if=/dev/zero of="$1/filler" bs=4k count=64 2>/dev/null || true
shift
exec "$@"
"""


@pytest.mark.netns
def test_daemon_on_a_full_disk_is_retried_by_systemd_and_a_bad_config_is_not(tmp_path):
    """In a private mount namespace (unshare -m, nothing changes outside it) the daemon's state
    dir is a full 64 KiB tmpfs: it exits 74, which the unit does not list in
    RestartPreventExitStatus (so Restart=on-failure retries); a config error still exits 2."""
    require(netns_unavailable_reason())
    unit = (REPO / "systemd" / "wanprobe.service").read_text()
    prevent = re.search(r"^RestartPreventExitStatus=(.*)$", unit, re.M).group(1).split()
    assert re.search(r"^Restart=on-failure$", unit, re.M)
    assert "2" in prevent and str(errors.OutputError.exit_code) not in prevent
    state = tmp_path / "state"
    state.mkdir()
    cfg = tmp_path / "wanprobe.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{state}"\nmetrics_listen = "127.0.0.1:0"\n'
                   'reflector = false\n[[peers]]\nname = "p"\naddress = "127.0.0.1"\n')
    codes = {}
    for extra in ([], ["--check"]):
        r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", FULL_DISK,
                            "sh", str(state), sys.executable, "-m", "wanprobe", "daemon",
                            "--config", str(cfg), *extra], capture_output=True, text=True,
                           timeout=60)
        codes[tuple(extra)] = r.returncode
        assert "No space left on device" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert codes == {(): 74, ("--check",): 74}
    assert not any(Path(state).iterdir())  # the tmpfs lived in the private namespace only
