"""The host a rule judges, typed: one end of the path, built once — this host from the report's
``host`` dict (``host_config.HostConfig.to_json``), the far end from the :class:`HostFacts` it
sent (``measurements.peer_facts``). Sizes in bytes, absent is None (docs/conventions.md §3): a rule skips
what the host did not report, and a peer knows less than this host (no default_qdisc, no
fq_available, one interface).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from collectors.ethtool_ioctl import RingParams
from collectors.host_facts import FactsError, HostFacts, parse_int, parse_triple

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

    def iface(self, name: str | None) -> Iface | None:
        return next((i for i in self.ifaces if i.name == name), None) if name else None

    @classmethod
    def from_report(cls, host: Any) -> Host | None:
        """This host from the report's ``host`` dict; None when the report has none (absent,
        empty or not an object: a hand-written or damaged report)."""
        if not isinstance(host, Mapping) or not host:
            return None
        sysctls = host.get("sysctls") or {}

        def text(name: str) -> str | None:
            value = sysctls.get(name)
            return str(value) if value is not None else None

        def number(name: str) -> int | None:
            return parse_int(text(name))

        fq = host.get("fq_available")
        return cls(
            which="local", cc_current=text("net.ipv4.tcp_congestion_control"),
            cc_available=_names(host.get("available_cc")),
            cc_allowed=_names(host.get("allowed_cc")),
            tcp_rmem_bytes=parse_triple(text("net.ipv4.tcp_rmem")),
            tcp_wmem_bytes=parse_triple(text("net.ipv4.tcp_wmem")),
            default_qdisc=text("net.core.default_qdisc"),
            fq_available=fq if isinstance(fq, bool) else None,
            tcp_mtu_probing=number("net.ipv4.tcp_mtu_probing"),
            tcp_slow_start_after_idle=number("net.ipv4.tcp_slow_start_after_idle"),
            tcp_notsent_lowat_bytes=number("net.ipv4.tcp_notsent_lowat"),
            tcp_no_metrics_save=number("net.ipv4.tcp_no_metrics_save"),
            ifaces=tuple(_iface(n, i) for n, i in (host.get("ifaces") or {}).items()
                         if isinstance(i, Mapping)),
            facts=facts_or_none(host.get("facts")))

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


def facts_or_none(doc: Any) -> HostFacts | None:
    """A host-facts document from a report, None when absent or not valid."""
    try:
        return HostFacts.from_json(doc) if doc else None
    except FactsError:
        return None


def triple_text(t: Triple | None) -> str | None:
    """``tcp_rmem``/``tcp_wmem`` as the kernel prints them (whitespace-normalised)."""
    return " ".join(map(str, t)) if t else None


def _names(v: Any) -> tuple[str, ...]:
    return tuple(str(x) for x in v) if isinstance(v, list | tuple) else ()


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _finite(v: Any) -> float | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _rings(info: Mapping[str, Any]) -> RingParams | None:
    rx, tx, rx_max, tx_max = (_int(info.get(k))
                              for k in ("rx_ring", "tx_ring", "rx_ring_max", "tx_ring_max"))
    if rx is None or tx is None or rx_max is None or tx_max is None:
        return None
    return RingParams(rx, tx, rx_max, tx_max)


def _iface(name: str, info: Mapping[str, Any]) -> Iface:
    qdisc = info.get("qdisc")
    return Iface(name=str(name), mtu_bytes=_int(info.get("mtu")),
                 qdisc=str(qdisc) if qdisc else None,
                 speed_mbps=_finite(info.get("speed_mbps")), rings=_rings(info))
