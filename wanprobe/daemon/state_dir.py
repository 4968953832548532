"""The daemon's state directory, checked the way the daemon uses it.

``daemon --check``, SIGHUP's reload and the daemon's start run the same check, so a check that says "ok" means the
daemon will not fail on the directory later: create it (and ``reports/``) with parents, then
create (O_EXCL, never through a symlink), write, fsync and remove a file in each. A failure that
may pass by itself (a full disk, a quota, EIO) is an OutputError (exit 74: systemd restarts the
unit); anything else (permissions, a file where the directory should be) a ConfigError (exit 2:
``RestartPreventExitStatus=2``, a restart cannot fix it).
"""

from __future__ import annotations

import os
from pathlib import Path

from wanprobe.errors import TRANSIENT_WRITE_ERRNOS, ConfigError, OutputError, shown

_PROBE_NAME = ".wanprobe-write-test"


def _writable(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / f"{_PROBE_NAME}.{os.getpid()}"
    probe.unlink(missing_ok=True)  # a leftover of a killed run
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
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
            kind = (OutputError if getattr(exc, "errno", None) in TRANSIENT_WRITE_ERRNOS
                    else ConfigError)
            raise kind(f"daemon.state_dir {shown(str(directory), 200)}: cannot create or "
                       f"write it: {reason}") from None
