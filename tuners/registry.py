"""Build the tuners once (the composition root for ``wanprobe tune``), roots as arguments."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tuners.knob import Tuner

if TYPE_CHECKING:
    from wanprobe.probe.access import DscpPolicy

# the tuners a signed-off plan may use when ``wanprobe-tune.service`` applies it unattended: what
# the daemon's ``[auto_apply] tuners`` may list and ``fleet kubernetes --plan`` may carry
AUTO_APPLY_TUNERS = ("sysctl", "link", "dscp", "roce", "nccl")


def dscp_policy(allow_network_control: bool = False) -> DscpPolicy:
    """The one DSCP policy (``wanprobe.probe.access``) that the DSCP tuner plans by and the
    journal store checks journals against: no network control (48-63) unless allowed."""
    from wanprobe.probe.access import DEFAULT_COS_DSCP, DscpPolicy

    return DscpPolicy(frozenset(range(64)) if allow_network_control else DEFAULT_COS_DSCP)


def build_tuners(proc_root: Path = Path("/proc"), sys_root: Path = Path("/sys"),
                 *, nft: str | None = "nft", iptables: str = "iptables",
                 permitted: DscpPolicy | None = None) -> dict[str, Tuner]:
    """One tuner per area; each reads and writes only through the roots it is given. DSCP
    plans follow ``permitted`` (:func:`dscp_policy`; by default no network control)."""
    from tuners.dscp import DscpTuner
    from tuners.link import LinkTuner
    from tuners.roce import RoceTuner
    from tuners.sysctl import SysctlTuner

    return {
        "sysctl": SysctlTuner(proc_root, sys_root=sys_root),
        "link": LinkTuner(),
        "dscp": DscpTuner(nft=nft, iptables=iptables, permitted=permitted or dscp_policy()),
        "roce": RoceTuner(sys_root),
    }
