"""One exception family for the whole tool; only cli.py turns it into a message and exit code."""

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
    text = " ".join(str(message).split())
    if len(text) > limit:
        text = f"{text[:limit]}… ({len(text)} characters)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


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
