"""Build the tuners once (the composition root for ``wanprobe tune``), roots as arguments."""

from __future__ import annotations

from pathlib import Path

from tuners.knob import Tuner


def build_tuners(proc_root: Path = Path("/proc"), sys_root: Path = Path("/sys"),
                 *, nft: str | None = "nft", iptables: str = "iptables",
                 allow_network_control_dscp: bool = False) -> dict[str, Tuner]:
    """One tuner per area; each reads and writes only through the roots it is given. DSCP
    plans follow the one DSCP policy (``wanprobe.probe.access``): no network control (48-63) unless allowed."""
    from tuners.dscp import DscpTuner
    from tuners.link import LinkTuner
    from tuners.roce import RoceTuner
    from tuners.sysctl import SysctlTuner
    from wanprobe.probe.access import DEFAULT_COS_DSCP, DscpPolicy

    return {
        "sysctl": SysctlTuner(proc_root, sys_root=sys_root),
        "link": LinkTuner(),
        "dscp": DscpTuner(nft=nft, iptables=iptables, permitted=DscpPolicy(
            frozenset(range(64)) if allow_network_control_dscp else DEFAULT_COS_DSCP)),
        "roce": RoceTuner(sys_root),
    }
