"""The host a rule judges, typed: one end of the path, built once — this host from the report's
``host`` dict (``host_config.HostConfig.to_json``, read by the report codec:
``wanprobe/report/codec.py``, ``host_of``), the far end from the :class:`HostFacts` it sent
(``measurements.peer_facts``, :meth:`Host.from_facts`). Sizes in bytes, absent is None
(docs/conventions.md §3): a rule skips what the host did not report, and a peer knows less than
this host (no default_qdisc, no fq_available, one interface).
"""

from __future__ import annotations

from dataclasses import dataclass

from collectors.ethtool_ioctl import RingParams
from collectors.host_facts import HostFacts

Triple = tuple[int, int, int]


@dataclass(frozen=True)
class Iface:
    """One interface: ``/sys/class/net/<name>`` values, its root qdisc and its rings (ethtool -g;
    None where the driver has none)."""

    name: str
    mtu_bytes: int | None = None
    qdisc: str | None = None
    speed_mbps: float | None = None
    rings: RingParams | None = None


@dataclass(frozen=True)
class Host:
    """What the rules read of one host. ``which`` is ``local`` or ``peer``; the sysctl flags
    are as the kernel prints them (ip-sysctl.rst): tcp_mtu_probing 0/1/2, the others 0/1."""

    which: str = "local"
    cc_current: str | None = None
    cc_available: tuple[str, ...] = ()
    cc_allowed: tuple[str, ...] = ()
    tcp_rmem_bytes: Triple | None = None
    tcp_wmem_bytes: Triple | None = None
    default_qdisc: str | None = None
    fq_available: bool | None = None
    tcp_mtu_probing: int | None = None
    tcp_slow_start_after_idle: int | None = None
    tcp_notsent_lowat_bytes: int | None = None
    tcp_no_metrics_save: int | None = None
    ifaces: tuple[Iface, ...] = ()
    facts: HostFacts | None = None  # the host-facts document of this end (report schema 1.1)
    address: str | None = None  # the address the measuring host used (report 1.1: host.address)

    def iface(self, name: str | None) -> Iface | None:
        return next((i for i in self.ifaces if i.name == name), None) if name else None

    @classmethod
    def from_facts(cls, facts: HostFacts | None, which: str = "peer") -> Host | None:
        """The far end from the facts it sent; None when it sent none."""
        if facts is None:
            return None
        ifaces = (Iface(facts.iface, mtu_bytes=facts.iface_mtu_bytes, qdisc=facts.iface_qdisc),) \
            if facts.iface else ()
        return cls(which=which, cc_current=facts.cc_current, cc_available=facts.cc_available,
                   cc_allowed=facts.cc_allowed, tcp_rmem_bytes=facts.tcp_rmem_bytes,
                   tcp_wmem_bytes=facts.tcp_wmem_bytes, ifaces=ifaces, facts=facts)


def buffer_field(name: str) -> str:
    """The field of a :class:`Host` or :class:`HostFacts` holding ``name`` (``tcp_rmem`` or
    ``tcp_wmem``, with or without ``net.ipv4.``)."""
    return "tcp_rmem_bytes" if name.endswith("rmem") else "tcp_wmem_bytes"


def triple_text(t: Triple | None) -> str | None:
    """``tcp_rmem``/``tcp_wmem`` as the kernel prints them (whitespace-normalised)."""
    return " ".join(map(str, t)) if t else None
