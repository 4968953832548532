"""The emulated WAN lab: two network namespaces joined by a userspace delay line over TUN
devices (delay, jitter, per-direction loss, reordering, DSCP bleaching, black-hole MTU) with
kernel tbf for rate. See lab.py for the lifecycle and forwarder.py for the delay line."""

from wanprobe.lab.lab import ADDR_A, ADDR_B, Lab, list_labs
from wanprobe.lab.profiles import PROFILES, Profile
from wanprobe.lab.settings import LinkSettings

__all__ = ["ADDR_A", "ADDR_B", "PROFILES", "Lab", "LinkSettings", "Profile", "list_labs"]
