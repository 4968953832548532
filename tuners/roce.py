"""RoCE tuner: trust DSCP, ECN (DCQCN) per priority, PFC on the RoCE priority.

Where the kernel exposes a file, wanprobe writes it: MLNX_OFED ``/sys/class/net/<if>/qos/trust``
and ``ecn/roce_{np,rp}/enable/<prio>`` (roce-nccl.md §2.4). PFC has no sysfs file; it is set
with iproute2 ``dcb pfc`` when the device answers ``dcb pfc show``, otherwise the plan carries
the exact commands (``dcb``/``mlnx_qos``) as a manual step. Keys: ``<if>/trust``,
``<if>/ecn_np/<prio>``, ``<if>/ecn_rp/<prio>``, ``<if>/pfc`` (value ``0,0,0,1,0,0,0,0``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tuners import sysfs_path
from tuners.knob import Change, Manual, Skip, WrittenValue, same_value
from wanprobe.errors import ConfigError, TuneError, UsageError, shown
from wanprobe.units import parse_ifname

_KEY = re.compile(r"^(?P<if>[^/\s]{1,15})/(?P<what>trust|pfc|ecn_np/[0-7]|ecn_rp/[0-7])$")


def parse_key(key: str) -> tuple[str, str]:
    m = _KEY.fullmatch(key)
    if not m or not _valid_ifname(m["if"]):
        raise ConfigError(f"unknown roce key {shown(key)} (want <if>/trust, <if>/pfc, <if>/ecn_np/<prio>, <if>/ecn_rp/<prio>)")
    return m["if"], m["what"]


def _valid_ifname(name: str) -> bool:
    try:
        parse_ifname(name)  # dev_valid_name: no "..", so a key cannot walk out of class/net
    except UsageError:
        return False
    return True


def pfc_value(value: Any) -> str:
    """``3`` or ``[3]`` or ``"0,0,0,1,0,0,0,0"`` → the 8-flag form ``mlnx_qos --pfc`` uses."""
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit() and len(value) == 1):
        value = [int(value)]
    if isinstance(value, list):
        if not all(isinstance(p, int) and 0 <= p <= 7 for p in value):
            raise ConfigError(f"pfc priorities must be 0..7, got {shown(value)}")
        return ",".join("1" if p in value else "0" for p in range(8))
    flags = str(value).replace(" ", "").split(",")
    if len(flags) != 8 or any(f not in ("0", "1") for f in flags):
        raise ConfigError(f"pfc value must be 8 comma-separated 0/1 flags, got {shown(value)}")
    return ",".join(flags)


class RoceTuner(WrittenValue):
    name = "roce"

    def __init__(self, sys_root: Path = Path("/sys"), dcb: str | None = "dcb") -> None:
        self.sys_root = Path(sys_root)
        self.dcb = shutil.which(dcb) if dcb else None

    def _file(self, ifname: str, what: str) -> Path:
        if what == "trust":
            return sysfs_path.resolve(self.sys_root, "class/net", ifname, "qos/trust")
        kind, prio = what.split("/")
        sub = "roce_np" if kind == "ecn_np" else "roce_rp"
        return sysfs_path.resolve(self.sys_root, "class/net", ifname, "ecn", sub, "enable", prio)

    def _dcb_pfc(self, ifname: str) -> str | None:
        if not self.dcb:
            return None
        r = subprocess.run([self.dcb, "pfc", "show", "dev", ifname, "prio-pfc"],
                           capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            return None
        on = dict(re.findall(r"(\d):(on|off)", r.stdout))
        return ",".join("1" if on.get(str(p)) == "on" else "0" for p in range(8)) if on else None

    def current(self, key: str) -> str | None:
        ifname, what = parse_key(key)
        if what == "pfc":
            return self._dcb_pfc(ifname)
        try:
            return self._file(ifname, what).read_text().strip()
        except OSError:
            return None

    def _manual(self, ifname: str, what: str, value: str, reason: str) -> Manual:
        cmds: tuple[str, ...]
        if what == "pfc":
            prios = [str(p) for p, f in enumerate(value.split(",")) if f == "1"]
            cmds = (f"dcb pfc set dev {ifname} prio-pfc all:off " + " ".join(f"{p}:on" for p in prios),
                    f"mlnx_qos -i {ifname} --pfc {value}")
        elif what == "trust":
            cmds = (f"dcb apptrust set dev {ifname} order {value}", f"mlnx_qos -i {ifname} --trust {value}")
        else:
            kind, prio = what.split("/")
            sub = "roce_np" if kind == "ecn_np" else "roce_rp"
            cmds = (f"echo {value} > /sys/class/net/{ifname}/ecn/{sub}/enable/{prio}  # MLNX_OFED",)
        return Manual(self.name, f"{ifname}/{what}", value, reason + " (no kernel interface here)", cmds)

    def _normal(self, what: str, value: Any) -> str:
        if what == "pfc":
            return pfc_value(value)
        if what == "trust":
            if str(value) not in ("dscp", "pcp"):
                raise ConfigError(f"trust must be dscp or pcp, got {shown(value)}")
            return str(value)
        if str(value) not in ("0", "1", "True", "False", "true", "false"):
            raise ConfigError(f"ecn enable must be 0 or 1, got {shown(value)}")
        return "1" if str(value) in ("1", "True", "true") else "0"

    def plan(self, key: str, value: Any, reason: str) -> Change | Skip | Manual:
        ifname, what = parse_key(key)
        new = self._normal(what, value)
        live = self.current(key)
        if live is None:
            return self._manual(ifname, what, new, reason)
        if same_value(live, new):
            return Skip(self.name, key, f"already {live}")
        return Change(self.name, key, live, new, reason)

    def validate(self, change: Change) -> None:
        _, what = parse_key(change.key)
        self._normal(what, change.new)
        if self.current(change.key) is None:
            raise ConfigError(f"{change.key}: no kernel interface for it here")

    def _write(self, key: str, value: str) -> None:
        ifname, what = parse_key(key)
        try:
            if what == "pfc":
                args = [f"{p}:{'on' if f == '1' else 'off'}" for p, f in enumerate(value.split(","))]
                r = subprocess.run([self.dcb or "dcb", "pfc", "set", "dev", ifname, "prio-pfc", *args],
                                   capture_output=True, text=True, timeout=10)
                if r.returncode != 0:
                    raise TuneError(f"dcb pfc set {ifname} failed: {' '.join(r.stderr.split())[:160]}")
                return
            with open(self._file(ifname, what), "w") as f:
                f.write(value)
        except OSError as exc:
            raise TuneError(f"writing {key}={value} failed: {exc.strerror}") from None

    def restore_command(self, change: Change) -> str:
        ifname, what = parse_key(change.key)
        return self._manual(ifname, what, change.old or "", "").commands[0]

    def rollback(self, change: Change) -> None:
        if change.old is not None:
            self._write(change.key, change.old)
