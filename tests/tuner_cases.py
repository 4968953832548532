"""Shared test data for the tuners: the /proc/sys tree a fresh non-init namespace shows on the CI
kernel (tcp-tuning.md §4.1: rmem_max/wmem_max present but read-only, default_qdisc and
netdev_max_backlog absent, default cc restricted to reno/bbr), and hypothesis strategies that
draw sysctl plans from it."""

from __future__ import annotations

from pathlib import Path

from hypothesis import strategies as st

NETNS_TREE = {
    "net/ipv4/tcp_rmem": "4096\t131072\t6291456",
    "net/ipv4/tcp_wmem": "4096\t16384\t4194304",
    "net/ipv4/tcp_congestion_control": "reno",
    "net/ipv4/tcp_available_congestion_control": "reno bbr cubic",
    "net/ipv4/tcp_allowed_congestion_control": "reno bbr",
    "net/ipv4/tcp_mtu_probing": "0",
    "net/ipv4/tcp_slow_start_after_idle": "1",
    "net/ipv4/tcp_notsent_lowat": "4294967295",
    "net/ipv4/tcp_no_metrics_save": "0",
    "net/ipv4/tcp_ecn": "2",
    "net/core/rmem_max": "212992",
    "net/core/wmem_max": "212992",
}
READ_ONLY = ("net/core/rmem_max", "net/core/wmem_max")


def make_proc(root: Path, tree: dict[str, str] = NETNS_TREE) -> Path:
    """Write ``tree`` under ``root/sys`` (read-only where the namespace has it read-only)."""
    for rel, value in tree.items():
        p = root / "sys" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(value + "\n")
        if rel in READ_ONLY:
            p.chmod(0o444)
    return root


def knob_values(buffer_max_bytes: int) -> dict[str, st.SearchStrategy[str]]:
    """A value strategy per writable namespaced knob; buffer maxima up to ``buffer_max_bytes``."""
    triple = st.tuples(st.integers(4096, 65536), st.integers(65536, 2**20),
                       st.integers(2**20, buffer_max_bytes)).map(lambda t: " ".join(map(str, t)))
    return {
        "net.ipv4.tcp_rmem": triple,
        "net.ipv4.tcp_wmem": triple,
        "net.ipv4.tcp_congestion_control": st.sampled_from(["reno", "bbr"]),
        "net.ipv4.tcp_mtu_probing": st.sampled_from(["0", "1", "2"]),
        "net.ipv4.tcp_slow_start_after_idle": st.sampled_from(["0", "1"]),
        "net.ipv4.tcp_notsent_lowat": st.integers(1, 2**32 - 1).map(str),
        "net.ipv4.tcp_no_metrics_save": st.sampled_from(["0", "1"]),
        "net.ipv4.tcp_ecn": st.sampled_from(["0", "1", "2"]),
    }


@st.composite
def sysctl_plans(draw, buffer_max_bytes: int = 2**30) -> list[tuple[str, str]]:
    """1..all distinct knobs with drawn values, as (key, value) pairs."""
    values = knob_values(buffer_max_bytes)
    keys = draw(st.lists(st.sampled_from(sorted(values)), min_size=1, max_size=len(values),
                         unique=True))
    return [(k, draw(values[k])) for k in keys]
