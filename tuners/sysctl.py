"""sysctl tuner: TCP congestion control, buffers, pacing qdisc, MTU probing and friends.

All I/O goes through ``proc_root`` (``/proc`` on a host, a tmp tree in unit tests). Rules from
tcp-tuning.md §6: only a cc the kernel offers (R-11) and, in a non-init namespace, one in
``tcp_allowed_congestion_control`` (R-12, EPERM otherwise); never above 2^31-1 and
``tcp_rmem[2]`` ≤ 1 GiB (R-3); never lower what an administrator set higher (R-5, tuned ``>``);
host-global keys are absent or read-only inside a namespace (§4.1, R-29); no huge
``rmem_default`` (R-30: not in the allow-list at all).
"""

from __future__ import annotations

import errno
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuners.knob import Change, Skip, WrittenValue, normalise, same_value
from wanprobe.errors import ConfigError, TuneError, shown

INT_MAX = 2**31 - 1
UINT_MAX = 2**32 - 1
TCP_BUF_MAX_CAP = 2**30  # fasterdata 100G tier: tcp_rmem[2] = 1 GiB
QDISC_BUILTIN = {"pfifo_fast", "pfifo", "bfifo", "noqueue"}


@dataclass(frozen=True)
class Spec:
    """What the kernel accepts for one key and how wanprobe may change it."""

    kind: str  # "int" | "triple" | "cc" | "qdisc"
    lo: int = 0
    hi: int = INT_MAX
    raise_only: bool = False  # tuned ">" semantics


SPECS: dict[str, Spec] = {
    "net.ipv4.tcp_rmem": Spec("triple", 1, INT_MAX, raise_only=True),
    "net.ipv4.tcp_wmem": Spec("triple", 1, INT_MAX, raise_only=True),
    "net.core.rmem_max": Spec("int", 4096, INT_MAX, raise_only=True),
    "net.core.wmem_max": Spec("int", 4096, INT_MAX, raise_only=True),
    "net.core.netdev_max_backlog": Spec("int", 1, INT_MAX, raise_only=True),
    "net.ipv4.tcp_congestion_control": Spec("cc"),
    "net.core.default_qdisc": Spec("qdisc"),
    "net.ipv4.tcp_mtu_probing": Spec("int", 0, 2),
    "net.ipv4.tcp_slow_start_after_idle": Spec("int", 0, 1),
    "net.ipv4.tcp_no_metrics_save": Spec("int", 0, 1),
    "net.ipv4.tcp_notsent_lowat": Spec("int", 1, UINT_MAX),
    "net.ipv4.tcp_ecn": Spec("int", 0, 2),
}


def key_path(proc_root: Path, key: str) -> Path:
    """``net.ipv4.tcp_rmem`` → ``<proc_root>/sys/net/ipv4/tcp_rmem``."""
    return Path(proc_root, "sys", *key.split("."))


def _ints(value: str, key: str) -> list[int]:
    try:
        return [int(x) for x in str(value).split()]
    except ValueError:
        raise ConfigError(f"{key}: value {shown(value)} is not a number") from None


class SysctlTuner(WrittenValue):
    """current / plan / validate / apply / verify / rollback for sysctls under ``proc_root``."""

    name = "sysctl"

    def __init__(self, proc_root: Path = Path("/proc"), *, sys_root: Path = Path("/sys"),
                 init_netns: bool | None = None, modules_dir: Path | None = None) -> None:
        self.proc_root = Path(proc_root)
        self.sys_root = Path(sys_root)
        if init_netns is None:
            from tuners.netns import is_init_netns
            init_netns = is_init_netns()
        self.init_netns = init_netns
        self.modules_dir = modules_dir

    # -- reading ---------------------------------------------------------------------------
    def current(self, key: str) -> str | None:
        try:
            return normalise(key_path(self.proc_root, key).read_text())
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise TuneError(f"cannot read {key}: {exc.strerror}") from None

    def writable(self, key: str) -> bool:
        """Mode bits, as the kernel checks them for net sysctls even for root (§4.1)."""
        try:
            return bool(key_path(self.proc_root, key).stat().st_mode & 0o222)
        except OSError:
            return False

    def _cc_list(self, which: str) -> list[str]:
        return (self.current(f"net.ipv4.tcp_{which}_congestion_control") or "").split()

    def _qdisc_available(self, name: str) -> bool:
        if name in QDISC_BUILTIN:
            return True
        if (self.sys_root / "module" / f"sch_{name}").exists():
            return True
        mods = self.modules_dir or Path("/lib/modules", os.uname().release)
        return any(mods.rglob(f"sch_{name}.ko*")) if mods.is_dir() else False

    # -- validation ------------------------------------------------------------------------
    def check_value(self, key: str, value: str) -> str:
        """The normalised value if the kernel (and wanprobe's caps) accept it; else ConfigError."""
        spec = SPECS.get(key)
        if spec is None:
            raise ConfigError(f"unknown sysctl key {shown(key)} (allowed: {', '.join(sorted(SPECS))})")
        value = normalise(value) or ""
        if spec.kind == "cc":
            avail = self._cc_list("available")
            if value not in avail:
                raise ConfigError(f"{key}: {shown(value)} is not offered by the kernel (available: {' '.join(avail)})")
            allowed = self._cc_list("allowed")
            if not self.init_netns and value not in allowed:
                raise ConfigError(f"{key}: {shown(value)} is not in tcp_allowed_congestion_control "
                                  f"({' '.join(allowed)}); a non-init namespace gets EPERM")
            return value
        if spec.kind == "qdisc":
            if not value.isidentifier() or not self._qdisc_available(value):
                raise ConfigError(f"{key}: qdisc {shown(value)} is not available in this kernel")
            return value
        nums = _ints(value, key)
        if spec.kind == "triple":
            if len(nums) != 3:
                raise ConfigError(f"{key}: needs three numbers 'min default max', got {shown(value)}")
            if not nums[0] <= nums[1] <= nums[2]:
                raise ConfigError(f"{key}: needs min ≤ default ≤ max, got {shown(value)}")
            if nums[2] > TCP_BUF_MAX_CAP:
                raise ConfigError(f"{key}: max {nums[2]} is above the 1 GiB cap (R-3)")
        elif len(nums) != 1:
            raise ConfigError(f"{key}: needs one number, got {shown(value)}")
        for n in nums:
            if not spec.lo <= n <= spec.hi:
                raise ConfigError(f"{key}: {n} is outside the kernel's range {spec.lo}..{spec.hi}")
        return " ".join(str(n) for n in nums)

    def validate(self, change: Change) -> None:
        self.check_value(change.key, change.new)
        if self.current(change.key) is None:
            raise ConfigError(f"{change.key} is absent in this network namespace")
        if not self.writable(change.key):
            raise ConfigError(f"{change.key} is read-only in this network namespace (host-global)")

    def lowers_admin_value(self, key: str, value: str) -> bool:
        """True if writing ``value`` would lower a raise-only key below its live value (R-5)."""
        spec, live = SPECS.get(key), self.current(key)
        if spec is None or not spec.raise_only or live is None:
            return False
        try:
            lv, nv = [int(x) for x in live.split()], [int(x) for x in value.split()]
        except ValueError:
            return False
        return nv[-1] < lv[-1]  # for tcp_rmem/tcp_wmem compare the max field

    # -- planning --------------------------------------------------------------------------
    def unavailable(self, key: str) -> str | None:
        """Why ``key`` cannot be set here (absent, or host-global and read-only in this
        namespace), or None: a plan made on another host skips it here as this host's own plan
        would (transaction.prepare)."""
        if self.current(key) is None:
            return "absent in this network namespace"
        if not self.writable(key):
            return "read-only in this network namespace (set it on the host)"
        return None

    def plan(self, key: str, value: Any, reason: str) -> Change | Skip:
        spec = SPECS.get(key)
        if spec is None:
            return Skip(self.name, key, "not a key wanprobe manages")
        why = self.unavailable(key)
        if why is not None:
            return Skip(self.name, key, why)
        live = self.current(key)
        if live is None:  # gone since unavailable() read it
            return Skip(self.name, key, "absent in this network namespace")
        text = normalise(str(value)) or ""
        if spec.kind in ("int", "triple"):
            nums = _ints(text, key)
            if spec.kind == "triple" and len(nums) == 3:
                nums = [min(n, INT_MAX) for n in nums]
                nums[2] = min(nums[2], TCP_BUF_MAX_CAP)  # clamp
                nums[0], nums[1] = min(nums[0], nums[2]), min(nums[1], nums[2])
                if spec.raise_only:  # field-wise max: never lower min/default either
                    lv = _ints(live, key)
                    if len(lv) == 3:
                        nums = [max(a, b) for a, b in zip(nums, lv, strict=True)]
            elif len(nums) == 1:
                nums = [max(spec.lo, min(nums[0], spec.hi))]
                if spec.raise_only and nums[0] < _ints(live, key)[0]:
                    return Skip(self.name, key, f"live {live} is higher than {value}; never lowered")
            text = " ".join(str(n) for n in nums)
        if spec.kind == "cc":
            avail, allowed = self._cc_list("available"), self._cc_list("allowed")
            if text not in avail:
                return Skip(self.name, key, f"{text} not offered by this kernel ({' '.join(avail)})")
            if not self.init_netns and text not in allowed:
                return Skip(self.name, key, f"{text} not allowed in a non-init namespace ({' '.join(allowed)})")
        try:
            text = self.check_value(key, text)
        except ConfigError as exc:
            return Skip(self.name, key, str(exc))
        if same_value(live, text):
            return Skip(self.name, key, f"already {live}")
        return Change(self.name, key, live, text, reason)

    # -- writing ---------------------------------------------------------------------------
    def _write(self, key: str, value: str) -> None:
        path = key_path(self.proc_root, key)
        try:
            with open(path, "w") as f:  # one write(2): the kernel parses the whole buffer
                f.write(value)
        except OSError as exc:
            why = errno.errorcode.get(exc.errno or 0, "error")
            raise TuneError(f"writing {key}={shown(value)} failed: {why} {exc.strerror}") from None

    def rollback(self, change: Change) -> None:
        if change.old is None:
            return  # nothing existed; a sysctl cannot be removed
        self._write(change.key, change.old)

    def restore_command(self, change: Change) -> str:
        """A paste-able shell command putting the old value back (R-25)."""
        if change.old is None:
            return f"# {change.key}: no old value"
        return f"sysctl -w {change.key}={shlex.quote(str(change.old))}"

    def persist_lines(self, changes: list[Change]) -> list[str]:
        """``key = value`` lines for /etc/sysctl.d (R-27)."""
        return [f"{c.key} = {c.new}" for c in changes if c.tuner == self.name]
