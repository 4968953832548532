"""Which network namespace this process is in, and entering a named one.

The inode of ``/proc/self/ns/net`` identifies a namespace while it exists (nsfs, see
namespaces(7)); the journal records it for every change so rollback and status only act on the
namespace they run in. ``SO_NETNS_COOKIE`` (socket option 71, Linux 5.14) is unique per boot and
guards against an inode reused after a namespace was destroyed.
"""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path

from wanprobe.errors import ConfigError, PermissionRequired, UsageError
from wanprobe.netns import NETNS_DIR as NETNS_RUN_DIR
from wanprobe.netns import current_inode as current_inode  # re-exported: the tuners' netns API
from wanprobe.netns import setns
from wanprobe.userfiles import check_path_text

SO_NETNS_COOKIE = 71


def current_cookie() -> int | None:
    """The kernel's per-boot unique cookie of this network namespace, or None if unsupported."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            cookie: int = struct.unpack("=Q", s.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8))[0]
            return cookie
    except OSError:
        return None


def is_init_netns() -> bool:
    """True when this process shares the network namespace of PID 1 (the host's, usually)."""
    try:
        return os.stat("/proc/1/ns/net").st_ino == current_inode()
    except OSError:  # /proc/1 not readable (unprivileged): assume a container
        return False


def enter(name: str) -> int:
    """Move this thread into the named namespace (``ip netns`` layout); returns its inode."""
    if not name or "/" in name or "\x00" in name or name in (".", ".."):
        raise UsageError(f"bad network namespace name {name!r}")
    path = check_path_text(NETNS_RUN_DIR / name, "network namespace")  # NUL, controls, length
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UsageError(f"network namespace {name!r} not found under {NETNS_RUN_DIR}") from None
    except PermissionError:
        raise PermissionRequired(f"entering network namespace {name!r} needs root") from None
    try:
        setns(fd)
    except OSError as exc:
        raise PermissionRequired(f"setns into {name!r} failed: {exc.strerror}") from None
    finally:
        os.close(fd)
    return current_inode()


def init_inode() -> int | None:
    """Inode of PID 1's network namespace (the host's), or None when /proc/1 is unreadable."""
    try:
        return os.stat("/proc/1/ns/net").st_ino
    except OSError:
        return None


def enter_command(inode: int, name: str | None = None) -> list[str]:
    """The argv prefix that runs a command in the network namespace ``inode``: [] for the host's
    (PID 1's), ``ip netns exec NAME`` for a named one (``name``, or found under /run/netns),
    ``nsenter --net=/proc/PID/ns/net`` for one only a process holds. ConfigError when there is
    none: a command printed without it would act on the wrong namespace."""
    if inode == init_inode():
        return []
    if name:
        return ["ip", "netns", "exec", name]
    for path in sorted(NETNS_RUN_DIR.glob("*")) if NETNS_RUN_DIR.is_dir() else ():
        try:
            if path.stat().st_ino == inode:
                return ["ip", "netns", "exec", path.name]
        except OSError:
            continue
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if (proc / "ns" / "net").stat().st_ino == inode:
                return ["nsenter", f"--net={proc / 'ns' / 'net'}"]
        except OSError:
            continue
    raise ConfigError(f"network namespace inode {inode} is not the host's and has no name under "
                      f"{NETNS_RUN_DIR} or process in it; run `wanprobe tune rollback` inside it")
