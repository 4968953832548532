"""The daemon's state directory, checked the way the daemon uses it.

``daemon --check`` and the daemon's start run the same check, so a check that says "ok" means the
daemon will not fail on the directory later: create it (and ``reports/``) with parents, then
create, write, fsync and remove a file in each. Any failure is one ConfigError naming the path.
"""

from __future__ import annotations

import os
from pathlib import Path

from wanprobe.errors import ConfigError, shown

_PROBE_NAME = ".wanprobe-write-test"


def _writable(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / f"{_PROBE_NAME}.{os.getpid()}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, b"ok\n")
        os.fsync(fd)
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


def check_state_dir(state_dir: Path, reports_dir: Path) -> None:
    """Raise ConfigError unless both directories exist (or can be made) and take a file."""
    for directory in (state_dir, reports_dir):
        try:
            _writable(directory)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise ConfigError(f"daemon.state_dir {shown(str(directory), 200)}: cannot create or "
                              f"write it: {reason}") from None
