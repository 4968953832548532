"""ECN / DCQCN configuration from MLNX_OFED's ``<sys_root>/class/net/<if>/ecn/`` tree.

Layout (OFED ECN docs; prometheus/procfs ``sysfs/net_class_ecn.go``; reference §2.4):
``ecn/roce_np/enable/<prio>`` and ``ecn/roce_rp/enable/<prio>`` hold 0/1 per priority (NP =
notification point, sends CNPs on CE-marked packets; RP = reaction point, cuts rate on CNPs);
scalar parameters (``cnp_dscp``, ``cnp_802p_prio``, ``min_time_between_cnps``, ``rpg_*``...) sit
next to ``enable/``. Upstream mlx5 has no such tree: absent means "not exposed", not "off".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from collectors.sample import CollectError
from collectors.sysfs_read import list_dir, read_int, resolve_entry

SOURCE = "sysfs_ecn"
ROLES = ("roce_np", "roce_rp")


@dataclass(frozen=True)
class EcnConfig:
    """``enabled[role][prio]`` (bool) and ``params[role][name]`` (int) for one netdev."""

    path: str
    enabled: dict[str, dict[int, bool]] = field(default_factory=dict)
    params: dict[str, dict[str, int]] = field(default_factory=dict)

    def enabled_on(self, role: str, prio: int) -> bool | None:
        """True/False for the priority, None when the driver does not expose it."""
        return self.enabled.get(role, {}).get(prio)

    def to_json(self) -> dict:
        return {role: {"enable": {str(p): v for p, v in sorted(self.enabled.get(role, {}).items())},
                       **dict(sorted(self.params.get(role, {}).items()))}
                for role in ROLES if role in self.enabled or role in self.params}


def read_ecn(sys_root: Path, ifname: str) -> tuple[EcnConfig | None, list[CollectError]]:
    """The ECN tree of ``ifname``; ``(None, [])`` when the tree is absent."""
    base = resolve_entry(sys_root / "class" / "net" / ifname) / "ecn"
    if not base.is_dir():
        return None, []
    enabled: dict[str, dict[int, bool]] = {}
    params: dict[str, dict[str, int]] = {}
    errors: list[CollectError] = []
    for role in ROLES:
        rdir = base / role
        for name in list_dir(rdir):
            if name == "enable":
                for prio in list_dir(rdir / "enable"):
                    if not prio.isdigit():
                        continue
                    value, why = read_int(rdir / "enable" / prio)
                    if value is None:
                        errors.append(CollectError(SOURCE, str(rdir / "enable" / prio), why,
                                                   counter=f"{role}.enable.{prio}"))
                    else:
                        enabled.setdefault(role, {})[int(prio)] = value != 0
                continue
            value, why = read_int(rdir / name)
            if value is None:
                errors.append(CollectError(SOURCE, str(rdir / name), why, counter=f"{role}.{name}"))
            else:
                params.setdefault(role, {})[name] = value
    return EcnConfig(str(base), enabled, params), errors
