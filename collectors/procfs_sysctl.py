"""Sysctls that matter for WAN/RoCE transfers, read from ``<proc_root>/sys/...``.

Values are the kernel's text with whitespace normalised (``"4096\\t131072\\t6291456"`` →
``"4096 131072 6291456"``), keyed by dotted name; an absent sysctl is left out.
"""

from __future__ import annotations

from pathlib import Path

from collectors.sample import CollectError
from collectors.sysfs_read import MISSING, read_text

SOURCE = "procfs_sysctl"
SYSCTLS = (
    "net.ipv4.tcp_congestion_control", "net.ipv4.tcp_available_congestion_control",
    "net.ipv4.tcp_allowed_congestion_control", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
    "net.core.rmem_max", "net.core.wmem_max", "net.core.rmem_default", "net.core.wmem_default",
    "net.core.default_qdisc", "net.core.netdev_max_backlog", "net.ipv4.tcp_mtu_probing",
    "net.ipv4.tcp_ecn", "net.ipv4.tcp_sack", "net.ipv4.tcp_timestamps",
    "net.ipv4.tcp_window_scaling", "net.ipv4.tcp_slow_start_after_idle",
    "net.ipv4.tcp_notsent_lowat", "net.ipv4.tcp_no_metrics_save", "net.ipv4.tcp_adv_win_scale",
    "net.ipv4.tcp_moderate_rcvbuf", "net.ipv4.udp_mem", "net.ipv4.tcp_mem",
    "net.ipv4.tcp_base_mss",
)


def read_sysctls(proc_root: Path, names=SYSCTLS) -> tuple[dict[str, str], list[CollectError]]:
    """``({dotted name: value}, errors)``."""
    out: dict[str, str] = {}
    errors: list[CollectError] = []
    for name in names:
        path = proc_root / "sys" / Path(*name.split("."))
        text, why = read_text(path)
        if text is None:
            if why != MISSING:
                errors.append(CollectError(SOURCE, str(path), why, counter=name))
            continue
        out[name] = " ".join(text.split())
    return out, errors
