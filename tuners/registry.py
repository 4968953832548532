"""Build the tuners once (the composition root for ``wanprobe tune``), roots as arguments."""

from __future__ import annotations

from pathlib import Path

from tuners.knob import Tuner


def build_tuners(proc_root: Path = Path("/proc"), sys_root: Path = Path("/sys"),
                 *, nft: str | None = "nft", iptables: str = "iptables") -> dict[str, Tuner]:
    """One tuner per area; each reads and writes only through the roots it is given."""
    from tuners.dscp import DscpTuner
    from tuners.link import LinkTuner
    from tuners.roce import RoceTuner
    from tuners.sysctl import SysctlTuner

    return {
        "sysctl": SysctlTuner(proc_root, sys_root=sys_root),
        "link": LinkTuner(),
        "dscp": DscpTuner(nft=nft, iptables=iptables),
        "roce": RoceTuner(sys_root),
    }
