"""The one setns(2) wrapper and namespace identity, shared by the lab and the tuners.

Python 3.11 has no ``os.setns`` (3.12 does), so it goes through libc. setns moves the calling
*thread*; sockets created while inside stay in that namespace (namespaces(7)).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

NETNS_DIR = Path("/run/netns")  # where `ip netns` keeps its named namespaces
CLONE_NEWNET = 0x40000000

_libc = ctypes.CDLL(None, use_errno=True)


def setns(fd: int, nstype: int = CLONE_NEWNET) -> None:
    """Move the calling thread into the namespace open at ``fd``; OSError on failure."""
    if _libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def current_inode() -> int:
    """Inode of this thread's network namespace (identifies it while it exists)."""
    return os.stat("/proc/thread-self/ns/net").st_ino
