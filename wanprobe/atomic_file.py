"""The one writer of every file wanprobe makes: ``-o`` outputs and state files alike.

The policy (issue 19), decided from what is at the path (``lstat``), never from the name:

- nothing there, or a regular file: replaced atomically — a temp name in the target's
  directory, fsync, rename, and the temp file removed when anything fails (client_python's
  ``write_to_textfile`` pattern; rename(2) is atomic within one filesystem, and fsync of the
  file then of the directory makes the new name survive a crash, as ext4/xfs document for the
  write-temp-then-rename idiom);
- a FIFO, a sink device (the null, zero and full devices, known by their numbers 1:3, 1:5, 1:7,
  not by name), or this process's own stdout/stderr: written in place, never replaced
  (``-o /dev/null`` and ``-o /dev/stdout`` do what a shell user expects; renaming over
  ``/dev/full`` turned it into a regular file). A FIFO nobody reads is refused, not waited on,
  and its reader gets WRITE_TIMEOUT_S to take the whole output (one that opens it and never
  reads would otherwise hold the command forever). State files (``in_place=False``) refuse these;
- any other character device (``/dev/mem``, a terminal, a disk's raw node): refused before it
  is opened — a report is never written into memory, a port or a serial line, and opening some
  devices has side effects of its own (a tape rewinds, a modem line raises DTR);
- a symlink: followed only if the kernel's own ``fs.protected_symlinks`` rule would follow it
  (not in a sticky world-writable directory such as /tmp, or owned by us or by that
  directory's owner), so a link planted in /tmp cannot steer a root write elsewhere;
- a block device, a socket, a directory: refused, each named for what it is.

A refusal is an ``OSError`` whose strerror says why (callers already turn OSError into one line);
a failed write (ENOSPC, EIO) is the OSError the kernel gave.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import sys
import tempfile
import time
from pathlib import Path

MAX_LINKS = 40  # as the kernel's MAXSYMLINKS
WRITE_TIMEOUT_S = 10.0  # a FIFO's reader takes the whole output within this, or the write fails
# drivers/char/mem.c: a write to null or zero is discarded, to full fails with ENOSPC
SINKS = {(1, 3): "/dev/null", (1, 5): "/dev/zero", (1, 7): "/dev/full"}
# Documentation/admin-guide/devices.txt: BSD ptys, ttyN/ttyS, tty/console/ptmx, Unix98 ptys,
# ttyACM, ttyUSB, low-density serial, hvc consoles
TTY_MAJORS = frozenset({2, 3, 4, 5, *range(128, 144), 166, 188, 204, 229})


class Refused(OSError):
    """A path this policy will not write; ``strerror`` says why."""


def refused(path: str | Path, why: str) -> Refused:
    return Refused(errno.EPERM, why, str(path))


def write_error(exc: OSError, label: str) -> Exception:
    """The one-line WanprobeError for a failed write of ``label`` (e.g. ``--output x.json``):
    a refusal by this policy is a usage error (exit 2), anything else (ENOSPC, EIO, EROFS) an
    OutputError (exit 74)."""
    from wanprobe.errors import ConfigError, OutputError

    reason = exc.strerror or str(exc)
    if isinstance(exc, Refused):
        return ConfigError(f"{label}: {reason}")
    return OutputError(f"{label}: cannot write: {reason}")


def kind(st: os.stat_result) -> str:
    """What a file is, in words, for a refusal (never "a FIFO" for a device)."""
    mode = st.st_mode
    if stat.S_ISCHR(mode):
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
        if major in TTY_MAJORS:
            return f"a terminal (tty character device {major}:{minor})"
        return SINKS.get((major, minor)) or f"a character device ({major}:{minor})"
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a symlink" if stat.S_ISLNK(mode) else "a regular file" if stat.S_ISREG(mode)
            else "not a regular file")


def in_place_ok(st: os.stat_result) -> bool:
    """A FIFO or a sink device: written in place by a user-named output."""
    if stat.S_ISFIFO(st.st_mode):
        return True
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) in SINKS


def _trusted_link(link: str, st: os.stat_result) -> bool:
    """The kernel's fs.protected_symlinks rule (Documentation/admin-guide/sysctl/fs.rst): a
    link in a sticky world-writable directory is followed only when its owner is the follower
    or the directory's owner."""
    parent = os.path.dirname(link) or "."
    try:
        dst = os.stat(parent)
    except OSError:
        return False
    sticky_world = dst.st_mode & stat.S_ISVTX and dst.st_mode & stat.S_IWOTH
    return not sticky_world or st.st_uid in (os.geteuid(), dst.st_uid)


def _own_stream(st: os.stat_result) -> int | None:
    """The fd (1 or 2) whose open file is ``st`` (``-o /dev/stdout`` under a shell, a pipe or
    journald's socket), else None."""
    for fd in (1, 2):
        try:
            own = os.fstat(fd)
        except OSError:
            continue
        if (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino):
            return fd
    return None


def resolve(path: str | Path) -> tuple[str, os.stat_result | None]:
    """(the path a write lands on, its lstat or None when absent), following only trusted
    symlinks; raises ``refused`` for an untrusted one or a loop."""
    p = os.fspath(path)
    for _ in range(MAX_LINKS):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return p, None
        if not stat.S_ISLNK(st.st_mode):
            return p, st
        if not _trusted_link(p, st):
            raise refused(path, f"is a symlink owned by uid {st.st_uid} in a world-writable "
                          "sticky directory; not followed")
        p = os.path.join(os.path.dirname(p), os.readlink(p))
    raise OSError(errno.ELOOP, "too many levels of symbolic links", str(path))


def check_writable(path: str | Path, *, in_place: bool = True) -> None:
    """Raise ``refused`` now if :func:`atomic_write` would refuse ``path`` later (a command
    checks its ``-o`` before it measures anything)."""
    _target(path, in_place)


def _target(path: str | Path, in_place: bool) -> tuple[str, int | None]:
    """(path to write, fd) — fd is 1/2 for our own stream, -1 for an in-place node, None for
    an atomic replace of a regular file (or a new one)."""
    try:
        followed = os.stat(path)
    except OSError:
        followed = None
    if followed is not None and in_place:  # `-o /dev/stdout`, whatever stdout is
        fd = _own_stream(followed)
        if fd is not None:
            return os.fspath(path), fd
    real, st = resolve(path)
    if st is None:
        if followed is not None:  # reached through a link we cannot read (/proc magic links)
            raise refused(path, "cannot tell what this path points to; not written")
        return real, None
    if stat.S_ISREG(st.st_mode):
        return real, None
    if in_place_ok(st):
        if not in_place:
            raise refused(path, f"is {kind(st)}, not a file; a state file must be a regular file")
        return real, -1
    only = ("; only a regular file, a FIFO or /dev/null, /dev/zero, /dev/full is written"
            if stat.S_ISCHR(st.st_mode) else "")
    raise refused(path, f"is {kind(st)}; not written{only}")


def _write_all(fd: int, raw: bytes) -> None:
    view = memoryview(raw)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _write_by_deadline(fd: int, raw: bytes, path: str) -> None:
    """Write all of ``raw`` to a non-blocking ``fd`` within WRITE_TIMEOUT_S, waiting in poll(2)
    while the reader's pipe is full; ETIMEDOUT (an OutputError, exit 74) when it is not taken."""
    view = memoryview(raw)
    deadline = time.monotonic() + WRITE_TIMEOUT_S
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    while view:
        try:
            view = view[os.write(fd, view):]
            continue
        except BlockingIOError:
            pass
        left = deadline - time.monotonic()
        if left <= 0:
            raise OSError(errno.ETIMEDOUT, f"the FIFO's reader took {len(raw) - len(view):,} of "
                          f"{len(raw):,} bytes in {WRITE_TIMEOUT_S:g} s (the write deadline)", path)
        poller.poll(max(1, int(left * 1e3)))


def _write_in_place(path: str, raw: bytes) -> None:
    """Write a FIFO or sink device without creating, truncating or replacing it."""
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO and stat.S_ISFIFO(os.stat(path).st_mode):
            raise refused(path, "is a FIFO that no process reads; not written") from None
        raise
    try:
        st = os.fstat(fd)
        if not in_place_ok(st):  # swapped meanwhile
            raise refused(path, f"changed while it was opened (now {kind(st)}); not written")
        _write_by_deadline(fd, raw, path)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, data: str | bytes, mode: int = 0o644, *,
                 in_place: bool = False) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` under the policy above: a reader sees the old
    or the new file, never half of one. ``in_place`` lets a user-named output be a sink device,
    FIFO or our stdout/stderr. Creates missing parent directories; raises OSError on failure."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise TypeError(f"data must be str or bytes, not {type(data).__name__}")
    real, fd = _target(path, in_place)
    if fd is not None and fd >= 0:
        if fd == 1:
            sys.stdout.flush()
        _write_all(fd, raw)
        return Path(path)
    if fd == -1:
        _write_in_place(real, raw)
        return Path(path)
    target = Path(real)
    directory = target.parent if str(target.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    tfd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(tfd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return Path(path)


def write_output(path: str | Path, data: str | bytes, mode: int = 0o644) -> Path | None:
    """A user-named output (``-o``): ``-`` is stdout, anything else :func:`atomic_write` with
    devices and FIFOs written in place. Returns the path, None for stdout."""
    if os.fspath(path) == "-":
        raw = data.encode("utf-8") if isinstance(data, str) else data
        out = getattr(sys.stdout, "buffer", None)
        if out is None:
            sys.stdout.write(raw.decode("utf-8", "replace"))
        else:
            out.write(raw)
        sys.stdout.flush()
        return None
    return atomic_write(path, data, mode, in_place=True)
