"""Named network namespaces: create/delete with iproute2, enter with setns(2), run inside.

Namespaces live as bind mounts under /run/netns (the iproute2 convention), so ``ip netns`` sees
them and ``ip netns exec`` can run any tool inside.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from wanprobe.errors import LabError
from wanprobe.netns import NETNS_DIR, setns


def netns_path(name: str) -> Path:
    return NETNS_DIR / name


def exists(name: str) -> bool:
    return netns_path(name).exists()


def _ip(args: Sequence[str], *, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], input=stdin, capture_output=True, text=True)


def create(name: str) -> None:
    """Create namespace ``name`` with loopback up; raise LabError if it cannot be made."""
    r = _ip(["netns", "add", name])
    if r.returncode != 0:
        raise LabError(f"cannot create network namespace {name}: {r.stderr.strip()}")
    batch(name, ["link set lo up"])


def batch(name: str, commands: Sequence[str]) -> None:
    """Run ``ip`` commands (one per line, as for ``ip -batch``) inside namespace ``name``."""
    r = _ip(["-n", name, "-batch", "-"], stdin="\n".join(commands) + "\n")
    if r.returncode != 0:
        raise LabError(f"configuring namespace {name} failed: {' '.join(r.stderr.split())}")


def tc_batch(name: str, commands: Sequence[str]) -> None:
    """Run ``tc`` commands (one per line, as for ``tc -batch``) inside namespace ``name``."""
    _checked(["tc", "-n", name, "-batch", "-"], f"tc in {name}", "\n".join(commands) + "\n")


def sysctl(name: str, settings: Sequence[str]) -> None:
    """Set ``key=value`` sysctls inside namespace ``name`` (its own, never the root's)."""
    _checked(["ip", "netns", "exec", name, "sysctl", "-q", "-w", *settings], f"sysctl in {name}")


def _checked(argv: list[str], what: str, stdin: str | None = None) -> None:
    r = subprocess.run(argv, input=stdin, capture_output=True, text=True)
    if r.returncode != 0:
        raise LabError(f"{what} failed: {' '.join(r.stderr.split())}")


def pids(name: str) -> list[int]:
    """Processes whose network namespace is ``name`` (as ``ip netns pids``)."""
    r = _ip(["netns", "pids", name])
    return [int(p) for p in r.stdout.split() if p.isdigit()] if r.returncode == 0 else []


def delete(name: str, *, kill_timeout_s: float = 2.0) -> None:
    """Stop every process inside ``name`` and delete it. Idempotent."""
    if not exists(name):
        return
    terminate([p for p in pids(name) if p != os.getpid()], kill_timeout_s)
    r = _ip(["netns", "delete", name])
    if r.returncode != 0 and exists(name):
        raise LabError(f"cannot delete network namespace {name}: {r.stderr.strip()}")


def terminate(pids: list[int], timeout_s: float = 2.0) -> None:
    """SIGTERM ``pids``, wait up to ``timeout_s`` for them to exit, then SIGKILL the rest."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout_s
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            if pids:
                time.sleep(0.01)
        if not pids:
            return


def stop(proc, timeout_s: float = 5.0) -> None:
    """Stop a child ``subprocess.Popen``: SIGTERM, wait ``timeout_s``, then SIGKILL and reap."""
    proc.terminate()
    try:
        proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@contextlib.contextmanager
def entered(name: str) -> Iterator[None]:
    """Run the body with the current thread inside namespace ``name``; always switch back."""
    original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        try:
            target = os.open(netns_path(name), os.O_RDONLY)
        except FileNotFoundError:
            raise LabError(f"network namespace {name} does not exist") from None
        try:
            setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            setns(original)
    finally:
        os.close(original)


class RunsInside:
    """Commands run inside the namespace ``netns_name`` (a lab's endpoint, a sites lab's host)."""

    @property
    def netns_name(self) -> str:
        raise NotImplementedError

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside this namespace."""
        return ["ip", "netns", "exec", self.netns_name, *[str(a) for a in argv]]

    def run(self, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        """subprocess.run inside this namespace."""
        return subprocess.run(self.argv(argv), **kwargs)

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """subprocess.Popen inside this namespace."""
        return subprocess.Popen(self.argv(argv), **kwargs)


@dataclass(frozen=True)
class Endpoint(RunsInside):
    """One side of a lab: its namespace, link device and address."""

    name: str
    ifname: str
    addr: str
    peer_addr: str

    @property
    def netns_name(self) -> str:
        return self.name

    def entered(self):
        """Context manager: this thread inside the namespace (sockets made there stay there)."""
        return entered(self.name)
