"""Issue 19, break 1: one output-path policy for every ``-o`` and state file.

``diagnose -o /dev/full`` as root turned /dev/full into a regular file and exited 0 (the atomic
writer renamed its temp file over whatever the path was); ``tune plan -o`` did the same. Device
nodes here are made with mknod in a temp dir, never in /dev (needs root: CAP_MKNOD)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from clirun import invoke, one_line_error
from hostile_reports import hostile_report
from tuner_cases import make_proc

REPORT = {"schema_version": "1.0", "id": "r19", "host": {}, "peer": {"address": "198.18.0.2"},
          "measurements": {}, "findings": [{"id": "window-limited", "severity": "high", "title": "w",
          "knobs": [{"tuner": "sysctl", "key": "net.ipv4.tcp_rmem", "value": "4096 131072 67108864",
                     "reason": "tcp_rmem max 6 MiB caps one stream at 390 Mbit/s"}]}]}


def need_mknod() -> None:
    if os.geteuid() != 0:
        pytest.skip("mknod of a character device needs root")


@pytest.fixture
def plan_args(tmp_path: Path) -> list[str]:
    (tmp_path / "r.json").write_text(json.dumps(REPORT))
    return ["tune", "plan", "-r", str(tmp_path / "r.json"), "--proc-root",
            str(make_proc(tmp_path / "proc")), "--state-dir", str(tmp_path / "st")]


def node(path: Path, minor: int) -> Path:
    """A memory character device (major 1: 3 = null, 7 = full) at ``path``."""
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    return path


def test_null_device_is_written_in_place_not_replaced(tmp_path, plan_args):
    need_mknod()
    null = node(tmp_path / "null", 3)
    r = invoke(*plan_args, "-o", str(null))
    assert r.returncode == 0, r.stderr
    assert stat.S_ISCHR(os.lstat(null).st_mode), "the device node was replaced by a file"


def test_full_device_is_a_one_line_io_error_and_stays_a_device(tmp_path, plan_args):
    need_mknod()
    full = node(tmp_path / "full", 7)
    r = invoke(*plan_args, "-o", str(full))
    line = one_line_error(r)
    assert r.returncode == 74 and "No space left on device" in line, line
    assert stat.S_ISCHR(os.lstat(full).st_mode), "the device node was replaced by a file"


def test_state_files_refuse_a_device_and_leave_it(tmp_path):
    from wanprobe.atomic_file import Refused, atomic_write

    need_mknod()
    null = node(tmp_path / "journal.json", 3)
    with pytest.raises(Refused):
        atomic_write(null, "{}")
    assert stat.S_ISCHR(os.lstat(null).st_mode)


def test_fifo_with_a_reader_gets_the_plan_and_without_one_is_refused(tmp_path, plan_args):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = invoke(*plan_args, "-o", str(fifo))  # nobody reads: refused at once, not waited on
    assert r.returncode == 2 and "no process reads" in one_line_error(r)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the reader's open() blocks until a writer comes
        r = invoke(*plan_args, "-o", str(fifo))
        if r.returncode == 0:
            break
        time.sleep(0.05)
    reader.join(10)
    assert r.returncode == 0, r.stderr
    assert json.loads(got[0])["plan_version"] == 1
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_dash_is_stdout_and_dev_stdout_writes_the_pipe(tmp_path, plan_args):
    r = invoke(*plan_args, "-o", "-")
    assert r.returncode == 0 and json.loads(r.stdout)["plan_version"] == 1, r.stderr
    p = subprocess.run([sys.executable, "-m", "wanprobe", *plan_args, "-o", "/dev/stdout"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout[:p.stdout.index("\n}\n") + 2])["plan_version"] == 1


def test_untrusted_symlink_in_sticky_dir_is_refused_and_own_link_followed(tmp_path):
    from wanprobe.atomic_file import Refused, write_output

    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    planted = sticky / "out.json"
    planted.symlink_to(victim)
    os.lchown(planted, 65534, 65534)  # another user's link in a /tmp-like directory
    if os.lstat(planted).st_uid == os.geteuid():
        pytest.skip("cannot give the link another owner (not root)")
    with pytest.raises(Refused):
        write_output(planted, "x")
    assert victim.read_text() == "precious\n" and planted.is_symlink()
    mine = tmp_path / "mine.json"
    mine.symlink_to(victim)  # our own link outside a sticky directory: followed
    write_output(mine, "new\n")
    assert victim.read_text() == "new\n" and mine.is_symlink()


def test_block_device_and_socket_are_refused(tmp_path):
    import socket

    from wanprobe.atomic_file import Refused, write_output

    sock_path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock_path))
        with pytest.raises(Refused, match="socket"):
            write_output(sock_path, "x")
    if os.geteuid() == 0:
        blk = tmp_path / "blk"
        os.mknod(blk, 0o600 | stat.S_IFBLK, os.makedev(7, 200))  # a loop device number
        with pytest.raises(Refused, match="block device"):
            write_output(blk, "x")
        assert stat.S_ISBLK(os.lstat(blk).st_mode)


def test_diagnose_report_save_writes_a_device_in_place(tmp_path):
    """`diagnose -o` saves through report.document.save: /dev/full's twin stays a device and
    the failure is an OutputError (exit 74), /dev/null's twin takes the report."""
    need_mknod()
    from wanprobe.errors import OutputError
    from wanprobe.report.document import load, save

    null, full = node(tmp_path / "null", 3), node(tmp_path / "full", 7)
    report = load(_write(tmp_path / "valid.json", hostile_report(2)))
    save(report, null)
    with pytest.raises(OutputError, match="No space left"):
        save(report, full)
    assert stat.S_ISCHR(os.lstat(null).st_mode) and stat.S_ISCHR(os.lstat(full).st_mode)


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path
