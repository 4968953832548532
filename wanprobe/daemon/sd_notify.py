"""sd_notify(3) without libsystemd: newline-separated ``KEY=VALUE`` in one datagram to the
AF_UNIX socket named by ``$NOTIFY_SOCKET`` (a leading ``@`` means the Linux abstract namespace).

The watchdog is pinged at half of ``$WATCHDOG_USEC``, as sd_watchdog_enabled(3) recommends, and
only when ``$WATCHDOG_PID`` is unset or names this process. Outside systemd every call is a no-op.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def socket_address(value: str) -> str | bytes:
    """Map ``$NOTIFY_SOCKET`` to a ``sendto`` address: ``@name`` → ``b"\\0name"``."""
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    return value


def format_message(**fields: str | int) -> bytes:
    """``format_message(READY=1, STATUS="probing 3 peers")`` → ``b"READY=1\\nSTATUS=..."``.

    Values are single lines: a newline would start a new assignment (sd_notify(3)).
    """
    return "\n".join(f"{k}={' '.join(str(v).split())}" for k, v in fields.items()).encode()


def watchdog_interval_s(env: Mapping[str, str] | None = None, pid: int | None = None) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings (half of ``WATCHDOG_USEC``), or None if disabled."""
    env = os.environ if env is None else env
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    wpid = env.get("WATCHDOG_PID")
    if usec <= 0 or (wpid and wpid.strip() != str(pid if pid is not None else os.getpid())):
        return None
    return usec / 2e6


class Notifier:
    """Sends notifications to systemd; a missing or broken socket never raises."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        value = env.get("NOTIFY_SOCKET", "")
        self.address = socket_address(value) if value else None
        self._sock: socket.socket | None = None
        self.last_error: str | None = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, **fields: str | int) -> bool:
        """Send one datagram; True if it was sent."""
        if self.address is None:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(format_message(**fields), self.address)
            return True
        except OSError as exc:
            self.last_error = f"sd_notify to {self.address!r} failed: {exc.strerror or exc}"
            return False

    def ready(self, status: str = "") -> bool:
        return self.notify(READY=1, STATUS=status) if status else self.notify(READY=1)

    def status(self, status: str) -> bool:
        return self.notify(STATUS=status)

    def watchdog(self) -> bool:
        return self.notify(WATCHDOG=1)

    def reloading(self) -> bool:
        return self.notify(RELOADING=1)

    def stopping(self, status: str = "stopping") -> bool:
        return self.notify(STOPPING=1, STATUS=status)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
