"""One exception family for the whole tool; only cli.py turns it into a message and exit code."""

from __future__ import annotations


class WanprobeError(Exception):
    """An error a user can act on. ``str(err)`` is a single line; ``exit_code`` is non-zero."""

    exit_code = 1

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(" ".join(str(message).split()))
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
