"""Build the tuners once (the composition root for ``wanprobe tune``), roots as arguments."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tuners.knob import Tuner
from wanprobe.diagnose.finding import TUNERS

if TYPE_CHECKING:
    from wanprobe.probe.access import DscpPolicy

# Every tuner name comes from the one list a Knob may carry (``diagnose/finding.TUNERS``: below
# the report, which validates knobs against it, and below the tuners; issue 38).
# ``nccl`` knobs are a job's environment (tuners/nccl_env.py): a plan lists them as manual steps.
MANUAL_ONLY_TUNERS = ("nccl",)
# the tuners that change this host: what build_tuners builds and a plan's changes may name
APPLIABLE = tuple(t for t in TUNERS if t not in MANUAL_ONLY_TUNERS)
# the tuners a signed-off plan may use when ``wanprobe-tune.service`` applies it unattended: what
# the daemon's ``[auto_apply] tuners`` may list and ``fleet kubernetes --plan`` may carry
AUTO_APPLY_TUNERS = TUNERS


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

    built: tuple[Tuner, ...] = (
        SysctlTuner(proc_root, sys_root=sys_root), LinkTuner(),
        DscpTuner(nft=nft, iptables=iptables, permitted=permitted or dscp_policy()),
        RoceTuner(sys_root))
    by_name = {t.name: t for t in built}   # each tuner's name is its class's own
    return {name: by_name[name] for name in APPLIABLE}
