"""`tune` on a full disk (issue 37): exit 74 as the README's exit table says, one line, and never
a plan half-applied. The disk is a small tmpfs mounted in a private mount namespace this test
creates (`unshare -m`; the host's mounts never see it, and it is gone with the namespace); the
settings are those of a network namespace the test creates, never the root namespace's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_tool
from test_tuners_netns import KNOBS, netns, report_file, snapshot, wanprobe  # noqa: F401 - fixture

REPO = Path(__file__).resolve().parent.parent

# Runs as `unshare -m --propagation private python -c DRIVER MNT STEPS`: mounts a 256 KiB tmpfs
# on MNT, runs the steps in order ("fill" the disk, "free" it, "run" a command) and prints one
# JSON result per "run".
DRIVER = r"""
import errno, json, os, subprocess, sys
mnt, steps = sys.argv[1], json.loads(sys.argv[2])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "wanprobe-full", mnt], check=True)
os.mkdir(os.path.join(mnt, "st"), 0o755)
out = []
for step in steps:
    if step[0] == "fill":
        with open(os.path.join(mnt, "fill"), "ab", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    elif step[0] == "free":
        os.unlink(os.path.join(mnt, "fill"))
    else:
        r = subprocess.run(step[1:], capture_output=True, text=True, timeout=120)
        out.append({"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr})
subprocess.run(["umount", mnt], check=True)
print(json.dumps(out))
"""

# Inside the netns: apply four sysctls through the library, the disk filling up (a real ENOSPC
# from the tmpfs) just before the second change is written: the first is already live.
MIDWAY = r"""
import json, os, sys
sys.path.insert(0, sys.argv[2])
from tuners import transaction
from tuners.journal import JournalStore
from tuners.knob import Change
from tuners.plan import Plan, host_id, now_iso
from tuners.sysctl import SysctlTuner
from wanprobe.errors import WanprobeError
mnt = sys.argv[1]
changes = [("net.ipv4.tcp_rmem", "4096 131072 67108864"), ("net.ipv4.tcp_wmem", "4096 16384 67108864"),
           ("net.ipv4.tcp_notsent_lowat", "131072"), ("net.ipv4.tcp_slow_start_after_idle", "0")]
plan = Plan(host_id=host_id(), netns_inode=0, created_at=now_iso(),
            changes=tuple(Change("sysctl", k, None, v, "full disk") for k, v in changes))
def fill(i, change):
    if i == 1:
        with open(os.path.join(mnt, "fill"), "ab", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * 4096)
            except OSError:
                pass
try:
    transaction.apply_plan(plan, {"sysctl": SysctlTuner()}, JournalStore(mnt + "/st"),
                           host_id=host_id(), fault=fill)
    print(json.dumps({"exit": 0}))
except WanprobeError as exc:
    print(json.dumps({"exit": exc.exit_code, "error": str(exc)}))
"""


def in_full_disk(tmp_path: Path, steps: list[list[str]]) -> list[dict]:
    require_tool("unshare")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c",
                        DRIVER, str(mnt), json.dumps(steps)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert not any(mnt.iterdir()), "the tmpfs must never be seen outside its mount namespace"
    return json.loads(r.stdout)


def one_line(r: dict) -> str:
    lines = [ln for ln in r["stderr"].splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r["stderr"], r["stderr"]
    return lines[0]


@pytest.mark.netns
def test_apply_and_rollback_on_a_full_disk_exit_74_and_change_nothing(
        netns, tmp_path):  # noqa: F811
    ns = netns()
    before = snapshot(ns)
    r = wanprobe(ns, "tune", "plan", "-r", str(report_file(tmp_path, KNOBS[:2] + KNOBS[4:6])),
                 "-o", str(tmp_path / "p.json"), "--state-dir", str(tmp_path / "unused"))
    assert r.returncode == 0, r.stderr
    st = str(tmp_path / "mnt" / "st")
    tune = [sys.executable, "-m", "wanprobe", "tune"]
    apply = [*tune, "apply", str(tmp_path / "p.json"), "--yes", "--state-dir", st, "--netns", ns]
    cat = ["ip", "netns", "exec", ns, "cat", "/proc/sys/net/ipv4/tcp_rmem",
           "/proc/sys/net/ipv4/tcp_notsent_lowat"]
    full, cat_full, _, cat_applied, rollback, cat_rolled, status, again = in_full_disk(
        tmp_path, [["fill"], ["run", *apply], ["run", *cat], ["free"], ["run", *apply],
                   ["run", *cat], ["fill"], ["run", *tune, "rollback", "--state-dir", st,
                                            "--netns", ns], ["run", *cat], ["free"],
                   ["run", *tune, "status", "--state-dir", st, "--netns", ns],
                   ["run", *tune, "rollback", "--state-dir", st, "--netns", ns]])
    line = one_line(full)
    assert full["rc"] == 74, full
    assert "No space left on device" in line and "nothing changed" in line, line
    live = {"/proc/sys/net/ipv4/tcp_rmem": cat_full["stdout"].split("\n")[0],
            "/proc/sys/net/ipv4/tcp_notsent_lowat": cat_full["stdout"].split("\n")[1]}
    assert all(" ".join(before[k].split()) == " ".join(v.split()) for k, v in live.items())
    assert "131072" == cat_applied["stdout"].split("\n")[1].strip(), cat_applied
    # a rollback on a full disk still puts the settings back, and says the journal lags behind
    line = one_line(rollback)
    assert rollback["rc"] == 74 and "No space left on device" in line, rollback
    assert "tune rollback" in line and "4 of 4 keys at their old values" in line, line
    assert cat_rolled["stdout"] == cat_full["stdout"]
    assert status["rc"] == 9, status  # the journal still says applied: drift, until ...
    assert again["rc"] == 0, again    # ... the rollback runs again with room on the disk
    assert snapshot(ns) == before


@pytest.mark.netns
def test_disk_full_midway_rolls_back_what_was_written_and_exits_74(netns, tmp_path):  # noqa: F811
    ns = netns()
    before = snapshot(ns)
    st = str(tmp_path / "mnt" / "st")
    midway, status = in_full_disk(tmp_path, [
        ["run", "ip", "netns", "exec", ns, sys.executable, "-c", MIDWAY, str(tmp_path / "mnt"),
         str(REPO)],
        ["free"],
        ["run", sys.executable, "-m", "wanprobe", "tune", "status", "--state-dir", st,
         "--netns", ns]])
    out = json.loads(midway["stdout"] or "{}")
    assert out.get("exit") == 74, midway
    assert "step 2/4" in out["error"] and "No space left on device" in out["error"], out
    assert "rolled back (2 restored)" in out["error"] and "lags behind" in out["error"], out
    assert snapshot(ns) == before  # nothing half-applied
    # with room again, the next run records the rollback the full disk kept from the journal
    assert status["rc"] == 0 and "recovered" in status["stdout"], status
    assert snapshot(ns) == before


@pytest.mark.parametrize("where", ["/etc/passwd", "/etc/passwd/x"])
def test_status_with_a_file_as_state_dir_is_bad_input(where):
    """`tune status --state-dir /etc/passwd` was exit 6 "File exists"."""
    r = subprocess.run([sys.executable, "-m", "wanprobe", "tune", "status", "--state-dir", where],
                       capture_output=True, text=True, timeout=60)
    line = one_line({"stderr": r.stderr})
    assert r.returncode == 2 and line.startswith("wanprobe: error: --state-dir"), r.stderr
    assert "'/etc/passwd' is not a directory" in line
