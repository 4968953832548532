"""One exception family for the whole tool; only cli.py turns it into a message and exit code.

One exit code per kind of failure (the README's table; ``tests/test_exit_codes.py`` drives each):

====  =====================================================================================
0     success
1     the run failed or measured nothing (``probe``, ``paths``: no probe answered, as ping)
2     usage or configuration: a bad flag, config, mesh, plan, report, journal or path
      (systemd does not restart the daemon for it: ``RestartPreventExitStatus=2``)
3     the emulated lab could not be built, found or removed
4     permission: root or CAP_NET_ADMIN needed
5     peer unreachable: no answer, connection refused or timed out, not a wanprobe peer; for
      ``fleet``, a Prometheus unreachable, too slow, over its answer limits or absurd
6     tuning failed: apply, verify or rollback
7     the peer refused us: authentication (no key, wrong key) or its allow-list
8     the peer refused the request under its limits: busy, quota, a limit, tests disabled,
      DSCP policy, no room for a STAMP session (not counted as path loss)
9     drift: live settings differ from the applied plan (``tune status``; its output printed
      first, as ``diff`` exits 1 when the files differ)
70    internal error, a bug (sysexits.h EX_SOFTWARE; ``WANPROBE_DEBUG=1`` shows where)
74    an output or state file could not be written: disk full, read-only, I/O error
      (sysexits.h EX_IOERR; transient, so systemd restarts the daemon)
130   interrupted (SIGINT)
====  =====================================================================================
"""

from __future__ import annotations

SHOWN_CHARS = 80      # a bad value is quoted up to this many characters
MESSAGE_CHARS = 400   # no error line is longer than this (a 10 MB value stays out of the log)


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` cut to a readable length, saying how long the original was.

    Undecodable bytes and control characters come out escaped, so the line stays one line."""
    text = repr(value)
    if len(text) <= limit + 2:
        return text
    size = len(value) if isinstance(value, str | bytes) else len(text)
    return f"{text[:limit]}… ({size} characters)"


def one_line(message: object, limit: int = MESSAGE_CHARS) -> str:
    """``message`` with runs of whitespace (newlines included) folded and cut to ``limit``."""
    from wanprobe.safe_text import clean

    text = clean(" ".join(str(message).split()))
    if len(text) > limit:
        text = f"{text[:limit]}… ({len(text)} characters)"
    return text


class WanprobeError(Exception):
    """An error a user can act on. ``str(err)`` is a single line; ``exit_code`` is non-zero."""

    exit_code = 1

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(one_line(message))
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(WanprobeError):
    """Bad flag, value or unit given by the user."""

    exit_code = 2


class ConfigError(WanprobeError):
    """Bad configuration file or plan file."""

    exit_code = 2


class ConfigInvalid(ConfigError):
    """The configuration has one or more bad keys; ``problems`` holds one line per key."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        super().__init__(f"{source}: " + "; ".join(self.problems))


class PermissionRequired(WanprobeError):
    """The operation needs root / CAP_NET_ADMIN."""

    exit_code = 4


class LabError(WanprobeError):
    """The emulated WAN lab could not be created, found or removed."""

    exit_code = 3


class ProbeError(WanprobeError):
    """A measurement could not be made (peer unreachable, not listening, ...)."""

    exit_code = 5


class TuneError(WanprobeError):
    """Applying, verifying or rolling back a plan failed."""

    exit_code = 6


class AuthRefused(ProbeError):
    """The peer refused us: no key, a wrong key, or not on its allow-list."""

    exit_code = 7


class PeerLimit(ProbeError):
    """The peer refused the request under its limits (busy, quota, a range, disabled)."""

    exit_code = 8


class DriftFound(WanprobeError):
    """``tune status``: a live value differs from what an applied plan set (someone, or
    something such as tuned or a container runtime, changed it since)."""

    exit_code = 9


class OutputError(WanprobeError):
    """An output or state file could not be written (disk full, read-only, I/O error)."""

    exit_code = 74


# errno values of a write that may succeed later (a full disk is cleaned up, a quota raised)
TRANSIENT_WRITE_ERRNOS = frozenset({5, 12, 28, 30, 122})  # EIO ENOMEM ENOSPC EROFS EDQUOT
