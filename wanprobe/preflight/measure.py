"""Measure every host of a job from the launching host, all in parallel, within one deadline.

Per host: resolve the name — through the mesh file when one is given (the address the fleet
probes it at; the daemons' own peer names and sites), else DNS; a STAMP session to its reflector (RFC 8762; the shared sender of
probe/sender.py, one socket for all hosts); where no reflector answers, an ICMP echo session
instead (RFC 792; needs CAP_NET_RAW); where one answers, a DF-bit path MTU search against it
(probe/mtu.py) and its host facts over the control channel (throughput/host_facts_op.py,
authenticated when a key is given). Whatever a host does — silent, slow, trickling bytes — the
run ends at the deadline: blocking work (name resolution, the facts request) runs in daemon
threads that are abandoned, not joined, when time is up, and every probe task still running is
cancelled. What finished is kept; a host that did not is reported as such.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from collectors.host_facts import HostFacts
from wanprobe.errors import WanprobeError
from wanprobe.preflight.hostlist import HostEntry
from wanprobe.probe.result import MtuResult, ProbeResult

# Probes per second over all hosts: above it each host's interval stretches. One Python
# receive loop on the launching host takes the replies of all of them; at 6,400/s on the loaded
# 2-core VM it dropped replies in its own socket buffer (bench/preflight_scale.py), which would
# read as path loss.
MAX_PPS = 2_000
MIN_COUNT = 20          # fewer probes than this say nothing about loss
MAX_THREADS = 32        # blocking helpers (DNS, facts) at once
FACTS_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ProbePlan:
    """How each host is probed."""

    count: int = 200
    interval_s: float = 0.01
    timeout_s: float = 1.0
    hmac_key: bytes | None = None
    facts: bool = True
    mtu: bool = True


@dataclass
class HostMeasure:
    """What was learned about one host; filled in as each step finishes (None: not measured,
    the ``*_error`` says why)."""

    entry: HostEntry
    address: str | None = None
    error: str | None = None        # the name did not resolve, the run timed out, ...
    resolved: str | None = None     # how the address was found: address, mesh or dns
    mesh_name: str | None = None    # its name in the mesh (the daemons' peer name), site there
    site: str | None = None
    local: bool = False
    stamp: ProbeResult | None = None
    stamp_error: str | None = None
    icmp: ProbeResult | None = None
    icmp_error: str | None = None
    mtu: MtuResult | None = None
    mtu_error: str | None = None
    facts: HostFacts | None = None
    facts_error: str | None = None
    finished: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        """What the local daemon may call it: its mesh name, then the name given."""
        return tuple(dict.fromkeys(n for n in (self.mesh_name, self.entry.host) if n))

    @property
    def probe(self) -> ProbeResult | None:
        """The session the verdict rests on: STAMP where the reflector answered, else ICMP."""
        if self.stamp is not None and self.stamp.loss.received:
            return self.stamp
        return self.icmp if self.icmp is not None else self.stamp


class _Threads:
    """Blocking calls in daemon threads (at most MAX_THREADS at once), awaited as futures: a
    call that never returns costs a parked thread, never the deadline or the exit."""

    def __init__(self) -> None:
        self._slots = threading.BoundedSemaphore(MAX_THREADS)

    async def run(self, fn: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()

        def work() -> None:
            with self._slots:
                try:
                    result, error = fn(), None
                except BaseException as exc:  # handed to the awaiting task, never lost
                    result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, fut, result, error)
            except RuntimeError:
                pass  # the run ended (deadline) and its loop is closed: nobody waits for this

        threading.Thread(target=work, daemon=True, name="wanprobe-preflight").start()
        return await fut


def _settle(fut: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


def _resolve(host: str) -> str:
    from wanprobe.probe.peer import check_peer, numeric_family

    text = check_peer(host)
    if numeric_family(text) is not None:
        return text
    try:
        infos = socket.getaddrinfo(text, None, type=socket.SOCK_DGRAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise WanprobeError(f"does not resolve ({getattr(exc, 'strerror', None) or exc})") from None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    return infos[0][4][0]


def _why(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, WanprobeError | OSError) else type(exc).__name__


async def _probe(m: HostMeasure, plan: ProbePlan, interval_s: float) -> None:
    """STAMP first; ICMP only when the reflector sent nothing back."""
    from wanprobe.probe.api import probe

    assert m.address is not None
    kw = dict(count=plan.count, interval_s=interval_s, timeout_s=plan.timeout_s)
    try:
        m.stamp = await probe(m.address, "stamp", port=m.entry.port, hmac_key=plan.hmac_key, **kw)
    except (WanprobeError, OSError) as exc:
        m.stamp_error = _why(exc)
    if m.stamp is not None and m.stamp.loss.received:
        return
    try:
        m.icmp = await probe(m.address, "icmp", **kw)
    except (WanprobeError, OSError) as exc:
        m.icmp_error = _why(exc) + (" (ICMP needs root or CAP_NET_RAW)"
                                    if isinstance(exc, PermissionError) else "")


async def _path_mtu(m: HostMeasure, plan: ProbePlan) -> None:
    from wanprobe.probe.mtu import probe_path_mtu

    try:
        m.mtu = await probe_path_mtu(m.address, port=m.entry.port, tries=3,
                                     hmac_key=plan.hmac_key)
    except (WanprobeError, OSError) as exc:
        m.mtu_error = _why(exc)


class MeshNames:
    """A mesh file's hosts by name and by address: a job host found here takes the mesh's
    address without DNS (the one the fleet probes and scrapes: ``fleet targets``), and its
    mesh name and site. A name matches case-insensitively, without a trailing dot, and by its
    first label where the mesh lists short names and the job FQDNs (as mesh/topology.find_self)."""

    def __init__(self, hosts: Iterable[Any] = ()) -> None:
        self.by_name = {h.name.lower().rstrip("."): h for h in hosts}
        self.by_address = {h.address: h for h in self.by_name.values()}

    def name(self, host: str) -> Any:
        key = host.lower().rstrip(".")
        return self.by_name.get(key) or self.by_name.get(key.split(".")[0])

    def address(self, address: str | None) -> Any:
        try:
            return self.by_address.get(str(ipaddress.ip_address(address or "")))
        except ValueError:
            return None


async def _address(m: HostMeasure, threads: _Threads, names: MeshNames) -> bool:
    """Fill ``m.address`` (the mesh's, the literal, or DNS) and its mesh name and site; False
    (with ``m.error``) when the name does not resolve."""
    from wanprobe.probe.peer import numeric_family

    found = names.name(m.entry.host)
    if found is not None and numeric_family(m.entry.host) is None:
        m.address, m.resolved = found.address, "mesh"
    else:
        try:
            m.address = await threads.run(lambda: _resolve(m.entry.host))
        except (WanprobeError, OSError) as exc:
            m.error = f"{m.entry.host} {_why(exc)}"
            return False
        m.resolved = "address" if numeric_family(m.entry.host) is not None else "dns"
        found = names.address(m.address)
    if found is not None:
        m.mesh_name, m.site = found.name, found.site
    return True


async def _one(m: HostMeasure, plan: ProbePlan, interval_s: float, threads: _Threads,
               local: frozenset[str], deadline: float, names: MeshNames) -> None:
    if not await _address(m, threads, names):
        m.finished = True
        return
    facts = None
    if m.address in local:  # the launching host itself is in the job: read, do not probe
        m.local = True
        from collectors.host_facts import read_host_facts
        facts = asyncio.ensure_future(threads.run(lambda: read_host_facts(None)))
    elif plan.facts:
        from wanprobe.throughput.host_facts_op import fetch
        wait_s = max(0.1, min(FACTS_TIMEOUT_S, deadline - time.monotonic()))
        facts = asyncio.ensure_future(threads.run(
            lambda: fetch(m.address, m.entry.port, hmac_key=plan.hmac_key, timeout_s=wait_s)))
    if not m.local:
        await _probe(m, plan, interval_s)
        if plan.mtu and m.stamp is not None and m.stamp.loss.received:
            await _path_mtu(m, plan)
    if facts is not None:
        try:
            m.facts = await facts
        except (WanprobeError, OSError, ValueError) as exc:
            m.facts_error = _why(exc)
    m.finished = True


def fit(plan: ProbePlan, hosts: int, budget_s: float) -> tuple[ProbePlan, float]:
    """The plan and per-host interval that keep all hosts under MAX_PPS and a host's sessions
    (STAMP, then ICMP for a silent one, then the MTU search) inside ``budget_s``: a third of it
    per session; fewer probes per host when a long list needs it, never below MIN_COUNT."""
    interval_s = max(plan.interval_s, hosts / MAX_PPS)
    fits = int(budget_s / 3 / interval_s)
    return replace(plan, count=max(min(plan.count, fits), min(plan.count, MIN_COUNT))), interval_s


async def measure(entries: list[HostEntry], plan: ProbePlan, deadline: float,
                  local: frozenset[str] = frozenset(), grace_s: float = 0.5,
                  names: MeshNames | None = None) -> list[HostMeasure]:
    """Every host measured at once; returns at ``deadline`` (time.monotonic()) at the latest.
    ``local``: this host's addresses (a job host that is this host is read, not probed);
    ``names``: the mesh's hosts, resolved before DNS is asked."""
    out = [HostMeasure(e) for e in entries]
    plan, interval_s = fit(plan, len(entries), deadline - time.monotonic())
    threads = _Threads()
    tasks = [asyncio.ensure_future(_one(m, plan, interval_s, threads, local, deadline,
                                        names or MeshNames()))
             for m in out]
    _done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=grace_s)
    for m in out:
        if not m.finished and m.facts is None and plan.facts and m.address and not m.local:
            m.facts_error = m.facts_error or "no answer before the deadline"
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            raise t.exception()  # a bug, not a host's behaviour: let it surface
    return out
