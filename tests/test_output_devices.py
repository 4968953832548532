"""Issue 37: ``-o`` onto special files. A FIFO whose reader opens it and never reads held the
command forever (no write deadline); ``/dev/mem`` and tty nodes were called "a FIFO that no process
reads" (the label came from ENXIO, not from the node), and a device node other than /dev/null
was written in place. Device nodes are made with mknod in a temp dir (root: CAP_MKNOD); the
memory device's twin sits on a ``nodev`` tmpfs, so even a writer that tried could not open it."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
from clirun import invoke, one_line_error, run_forked
from hostile_reports import hostile_report
from test_output_policy import need_mknod, plan_args  # noqa: F401 - the fixture

from wanprobe import atomic_file
from wanprobe.atomic_file import Refused, atomic_write, check_writable, write_output


@pytest.fixture
def nodev(tmp_path: Path):
    """A directory on a tmpfs mounted nodev: a device node there cannot be opened at all."""
    need_mknod()
    d = tmp_path / "nodev"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "nodev,size=1m", "wanprobe-test", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a nodev tmpfs: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def chardev(path: Path, major: int, minor: int) -> Path:
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    return path


def test_fifo_whose_reader_never_reads_ends_at_the_write_deadline(tmp_path, monkeypatch):
    report = tmp_path / "r.json"
    report.write_text(json.dumps(hostile_report(400, "x" * 200)))   # far over a pipe's 64 KiB
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)   # opens it, never reads
    fcntl.fcntl(reader, fcntl.F_SETPIPE_SZ, 65536)         # whatever the page size
    monkeypatch.setattr(atomic_file, "WRITE_TIMEOUT_S", 1.0, raising=False)
    try:
        t0 = time.monotonic()
        doc = run_forked(["report", "show", str(report), "--format", "json", "-o", str(fifo)],
                         tmp_path, timeout_s=20)
        took = time.monotonic() - t0
    finally:
        os.close(reader)
    assert "timeout" not in doc, "the write waited on the reader past the deadline"
    assert doc["code"] == 74, doc
    lines = [ln for ln in doc["stderr"].splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in doc["stderr"], doc["stderr"]
    assert "cannot write: the FIFO's reader took 65,536 of" in lines[0] and "1 s (the write deadline)" in lines[0]
    assert took < 10   # the 1 s deadline, with a generous margin for a loaded machine
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_fifo_reader_that_reads_gets_everything_within_the_deadline(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    data = os.urandom(1 << 20)
    got = bytearray()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child writes while the parent reads
        code = 1
        try:
            write_output(fifo, data)
            code = 0
        finally:
            os._exit(code)
    status = None
    try:
        while status is None:
            try:
                chunk = os.read(reader, 65536)   # b"": no writer yet, or the writer is done
            except BlockingIOError:
                chunk = None
            if chunk:
                got += chunk
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            status = None if done == 0 else status
            time.sleep(0.001)
        got += os.read(reader, len(data))
    finally:
        os.close(reader)
    assert os.waitstatus_to_exitcode(status) == 0 and bytes(got) == data


def test_memory_device_is_named_and_never_opened(nodev, plan_args):  # noqa: F811
    mem = chardev(nodev / "mem", 1, 1)   # /dev/mem's numbers
    with pytest.raises(Refused, match=r"is a character device \(1:1\); not written"):
        check_writable(mem)
    line = one_line_error(r := invoke(*plan_args, "-o", str(mem)))
    assert r.returncode == 2, line
    assert "is a character device (1:1); not written; only a regular file, a FIFO or /dev/null" \
        in line
    assert stat.S_ISCHR(os.lstat(mem).st_mode)


def test_device_without_a_driver_is_not_called_a_fifo(tmp_path, plan_args):  # noqa: F811
    need_mknod()
    ghost = chardev(tmp_path / "ghost", 1, 250)   # no memory device has minor 250: ENXIO
    line = one_line_error(r := invoke(*plan_args, "-o", str(ghost)))
    assert r.returncode == 2 and "no process reads" not in line, line
    assert "is a character device (1:250); not written" in line


def test_terminal_is_refused_and_gets_nothing(plan_args):  # noqa: F811
    master, slave = os.openpty()
    try:
        tty = os.ttyname(slave)
        rdev = os.stat(tty).st_rdev
        line = one_line_error(r := invoke(*plan_args, "-o", tty))
        assert r.returncode == 2, line
        assert (f"is a terminal (tty character device {os.major(rdev)}:{os.minor(rdev)}); "
                "not written") in line
        os.set_blocking(master, False)
        with pytest.raises(BlockingIOError):
            os.read(master, 4096)   # the plan never reached the terminal
    finally:
        os.close(master)
        os.close(slave)


def test_each_special_file_is_named_for_what_it_is(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(Refused, match="is a FIFO, not a file; a state file must be a regular"):
        atomic_write(fifo, "{}")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))
        with pytest.raises(Refused, match="is a socket; not written:"):
            check_writable(tmp_path / "sock")
    if os.geteuid() == 0:
        null = chardev(tmp_path / "null", 1, 3)
        with pytest.raises(Refused, match="is /dev/null, not a file; a state file must be"):
            atomic_write(null, "{}")
        write_output(null, "x" * 100_000)   # a sink: written in place, still a device
        assert stat.S_ISCHR(os.lstat(null).st_mode)
