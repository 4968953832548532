"""Which network namespace this process is in, and entering a named one.

The inode of ``/proc/self/ns/net`` identifies a namespace while it exists (nsfs, see
namespaces(7)); the journal records it for every change so rollback and status only act on the
namespace they run in. ``SO_NETNS_COOKIE`` (socket option 71, Linux 5.14) is unique per boot and
guards against an inode reused after a namespace was destroyed.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
from pathlib import Path

from wanprobe.errors import PermissionRequired, UsageError

CLONE_NEWNET = 0x40000000
SO_NETNS_COOKIE = 71
NETNS_RUN_DIR = Path("/run/netns")


def current_inode() -> int:
    """Inode of this thread's network namespace."""
    return os.stat("/proc/thread-self/ns/net").st_ino


def current_cookie() -> int | None:
    """The kernel's per-boot unique cookie of this network namespace, or None if unsupported."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            return struct.unpack("=Q", s.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8))[0]
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
    if not name or "/" in name or name in (".", ".."):
        raise UsageError(f"bad network namespace name {name!r}")
    path = NETNS_RUN_DIR / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UsageError(f"network namespace {name!r} not found under {NETNS_RUN_DIR}") from None
    except PermissionError:
        raise PermissionRequired(f"entering network namespace {name!r} needs root") from None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise PermissionRequired(f"setns into {name!r} failed: {os.strerror(err)}")
    finally:
        os.close(fd)
    return current_inode()
