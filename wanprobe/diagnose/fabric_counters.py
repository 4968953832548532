"""What the fabric rules ask of a counter snapshot and its rates: which counters of a kind grew
over the window (with path, delta and rate as evidence), which priorities have PFC on, and
whether the netdev behind an RDMA port is lossless. Pure functions over the collectors' typed
:class:`~collectors.snapshot.Snapshot` and :class:`~collectors.rates.Rates`; names come from
:mod:`wanprobe.diagnose.counter_names`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from collectors.rates import Rates
from wanprobe.diagnose.counter_names import is_kind, prio_of

if TYPE_CHECKING:  # types only: the collectors stay unloaded until a snapshot is taken
    from collectors.sample import CounterSet
    from collectors.snapshot import Netdev, Snapshot

DEFAULT_ROCE_PRIO = 3  # NVIDIA/Cumulus default RoCE priority (roce-nccl.md §2.6)


@dataclass(frozen=True)
class Growth:
    """One counter that moved over the window."""

    subject: str
    counter: str
    path: str
    delta: int
    rate_per_s: float
    value: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"subject": self.subject, "counter": self.counter, "path": self.path,
                "delta": self.delta, "rate_per_s": round(self.rate_per_s, 6), "value": self.value}


def evidence(items: list[Growth], window_s: float, **extra: Any) -> dict[str, Any]:
    """The largest mover first (subject, counter, path, delta, rate), then all of them."""
    top = max(items, key=lambda g: g.delta)
    return {"subject": top.subject, "counter": top.counter, "path": top.path, "delta": top.delta,
            "rate_per_s": round(top.rate_per_s, 6), "window_s": round(window_s, 3),
            "counters": [g.to_json() for g in items], **extra}


def _groups(snap: Snapshot,
            groups: tuple[str, ...]) -> Iterable[tuple[tuple[str, ...], str, CounterSet]]:
    """(key, subject, CounterSet) for counter groups whose last key part is in ``groups``."""
    for key, cs in snap.counter_sets().items():
        if key[-1] in groups:
            if key[0] == "rdma":
                subject = f"{key[1]}/{key[3]}" if len(key) > 3 else key[1]
            elif key[0] == "netdevs":
                subject = key[1]
            else:
                subject = key[0]
            yield key, subject, cs


def growing(snap: Snapshot, rates: Rates | None, groups: tuple[str, ...],
            *kinds: str) -> list[Growth]:
    """Counters of ``kinds`` in groups ``groups`` (``hw_counters``, ``ethtool``, ...) that grew
    over the window; none without rates (a single sample)."""
    if rates is None:
        return []
    out: list[Growth] = []
    for key, subject, cs in _groups(snap, groups):
        for name in cs.values:
            if not is_kind(name, *kinds):
                continue
            r = rates.get(key, name)
            if r is not None and r.delta and r.per_s is not None:
                out.append(Growth(subject, name, cs.counter_path(name), r.delta, r.per_s,
                                  cs.values.get(name)))
    return out


def pfc_priorities(netdev: Netdev) -> set[int]:
    """Priorities with PFC on: from ``dcb`` when read, else inferred from ethtool names —
    mlx5 emits ``rx_prio<p>_pause`` only for PFC-enabled priorities (K-MLX5EN); bnxt/ice
    counters exist for all priorities, so a non-zero PFC frame count marks the priority."""
    if netdev.dcb and netdev.dcb.pfc_enabled:
        return {p for p, on in netdev.dcb.pfc_enabled.items() if on}
    prios: set[int] = set()
    for name, value in (netdev.ethtool.values.items() if netdev.ethtool else ()):
        p = prio_of(name, "pfc_present")
        if p is None and value:
            p = prio_of(name, "pfc_frames")
        if p is not None:
            prios.add(p)
    return prios


def pfc_off(netdev: Netdev, prio: int) -> bool:
    """PFC is known to be off on ``prio``: dcb says so, or mlx5 counts traffic on the priority
    (``rx_prio<p>_bytes``) without the pause counters it shows only with PFC on."""
    if netdev.dcb and netdev.dcb.pfc_enabled:
        return not netdev.dcb.pfc_enabled.get(prio, False)
    names = netdev.ethtool.values if netdev.ethtool else {}
    traffic = any(prio_of(n, "prio_traffic") == prio for n in names)
    return traffic and prio not in pfc_priorities(netdev)


def netdev_of(snap: Snapshot, subject: str) -> Netdev | None:
    """The netdev behind ``subject``: an RDMA port ``"mlx5_0/1"`` or a netdev name."""
    name: str | None = subject
    if "/" in subject:
        dev, _, port = subject.partition("/")
        p = snap.rdma[dev].ports.get(int(port)) if dev in snap.rdma else None
        name = p.netdev if p is not None else None
    return snap.netdevs.get(name) if name else None


def lossless(snap: Snapshot, subjects: Iterable[str] | None = None) -> bool:
    """PFC is on for the netdevs behind ``subjects``; with no subjects, for any netdev."""
    if subjects is None:
        return any(pfc_priorities(nd) for nd in snap.netdevs.values())
    return any(nd is not None and pfc_priorities(nd)
               for nd in (netdev_of(snap, s) for s in subjects))


def subjects(items: Iterable[Growth]) -> str:
    return ", ".join(sorted({x.subject for x in items}))
