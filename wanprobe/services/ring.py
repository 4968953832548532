"""``wanprobe ring``: test a ring of hosts the way a training job's all-reduce uses it (issue 39).

From any host that reaches them all, each running ``wanprobe reflect`` with the same key and an
``--allow`` list naming the others (throughput/ring_op.py says why both are required):
1. every host times its TCP handshake to every other (``ring_rtt``): the RTT matrix that
   clusters the hosts into sites (ring/plan.sites_by_rtt), and the check that every host
   answers, holds the key and allows the others — before any traffic is sent;
2. every edge of the ring in the given order at once (``ring_edge`` to each host, its
   neighbour the target): each host sends and receives at the same time, as in a ring
   all-reduce, so edges that share a WAN link share it here too;
3. each edge that crosses between sites alone: what the edge carries when nothing else runs;
4. the order ring/plan.best_order proposes (each site's hosts adjacent), measured the same way.
ring/plan.assemble then names the ring's rate, the shared bottlenecks and the NCCL settings.

Any edge failing (a refusal, a lost host), Ctrl-C or ``RingOptions.cancel`` set (the daemon
stopping, daemon/ring_schedule.py) closes every control connection, and each host stops its test
within ~0.1 s of seeing it close (``run_throughput(cancel=)``).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from wanprobe.errors import ProbeError, UsageError, shown
from wanprobe.models.collectives import MAX_SOCKETS
from wanprobe.probe.peer import check_peer
from wanprobe.ring.model import EdgeRun, RingResult
from wanprobe.ring.plan import assemble, best_order
from wanprobe.ring.sites import ring_edges, site_index, sites_by_rtt
from wanprobe.throughput.result import ThroughputResult
from wanprobe.throughput.ring_op import EDGE_OP, RTT_OP, EdgeRequest, RingCall

Progress = Callable[[str], None]
# what `wanprobe ring` and the daemon's [ring] accept: hosts, one run's length, streams per edge
MAX_RING_HOSTS = 64
MAX_EDGE_S = 600.0
MAX_STREAMS = MAX_SOCKETS  # NCCL's sockets per peer
RTT_SAMPLES = 3
REPLY_MARGIN_S = 30.0  # beyond the test's own length: the far end's handshake and the end report


@dataclass(frozen=True)
class RingOptions:
    hosts: tuple[str, ...]
    port: int = 862
    hmac_key: bytes | None = None
    duration_s: float = 5.0
    omit_s: float = 1.0
    streams: int = 4
    site_rtt_ms: float = 5.0
    measure_best: bool = True
    # set from another thread (the daemon stopping): the ring stops as on Ctrl-C, ProbeError
    cancel: threading.Event | None = field(default=None, compare=False, repr=False)


def resolve(hosts: Sequence[str]) -> dict[str, str]:
    """Each host as given -> its address; one line for fewer than two hosts, a host that does
    not resolve, or one listed twice (also under two names of one address)."""
    if len(hosts) < 2:
        raise UsageError(f"a ring needs at least two hosts, got {len(hosts)}")
    out: dict[str, str] = {}
    for host in hosts:
        if host in out:
            raise UsageError(f"host {shown(host)} is listed twice")
        try:
            addr = str(ipaddress.ip_address(host))
        except ValueError:
            check_peer(host)  # a name, not "65536" (glibc would read it as 0.1.0.0)
            try:
                addr = str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
            except (socket.gaierror, UnicodeError) as exc:
                raise UsageError(f"cannot resolve host {shown(host)}: "
                                 f"{getattr(exc, 'strerror', None) or exc}") from None
        twin = next((h for h, a in out.items() if a == addr), None)
        if twin is not None:
            raise UsageError(f"host {shown(host)} is {shown(twin)} again ({addr}): listed twice")
        out[host] = addr
    return out


def _at_once(opts: RingOptions, jobs: Sequence[tuple[str, str, dict[str, Any], float]]
             ) -> list[dict[str, Any]]:
    """Each job (address, op, body, reply within s) on its own thread, all at once; their
    replies in order. The first failure, an interrupt or ``opts.cancel`` closes them all."""
    cancel = opts.cancel
    _check_cancel(cancel)
    replies: list[dict[str, Any] | None] = [None] * len(jobs)
    errors: list[BaseException] = []
    failed = threading.Event()
    calls = [RingCall(addr, opts.port, opts.hmac_key) for addr, *_ in jobs]

    def one(i: int) -> None:
        _, op, body, within = jobs[i]
        try:
            replies[i] = calls[i].request(op, body, within)
        except Exception as exc:  # noqa: BLE001 - the first error stops every edge
            if not failed.is_set():
                errors.append(exc)
            failed.set()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(jobs))]
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads):
            if failed.wait(0.1) or (cancel is not None and cancel.is_set()):
                break
    finally:  # an error, Ctrl-C (KeyboardInterrupt in this thread) or the end: close all
        for c in calls:
            c.close()
        for t in threads:
            t.join(2.0)
    _check_cancel(cancel)
    if errors:
        raise errors[0]
    return [r or {} for r in replies]


def _check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise ProbeError("ring test cancelled")


def rtt_matrix(opts: RingOptions, addrs: dict[str, str]) -> dict[tuple[str, str], float | None]:
    """(host, other) -> the handshake RTT ``host`` measured to ``other`` (ms, None: no answer)."""
    hosts = list(addrs)
    jobs = [(addrs[h], RTT_OP, {"targets": [addrs[o] for o in hosts if o != h],
                                "samples": RTT_SAMPLES}, 30.0) for h in hosts]
    replies = _at_once(opts, jobs)
    out: dict[tuple[str, str], float | None] = {}
    for h, reply in zip(hosts, replies, strict=True):
        got = reply.get("rtt_ms")
        rtts: dict[str, Any] = got if isinstance(got, dict) else {}
        for o in hosts:
            if o != h:
                v = rtts.get(addrs[o])
                out[(h, o)] = float(v) if isinstance(v, int | float) else None
    return out


HOST_BOUND = ("host_cpu",)  # throughput verdicts that say a host, not the path, set the rate


def edge_run(src: str, dst: str, reply: dict[str, Any], notes: list[str] | None = None
             ) -> EdgeRun:
    """One edge's figures from the far end's result (``EdgeRun.from_throughput``: the rates
    after the ramp-up, each stream's for NCCL's view); the far end's error as a ProbeError. An
    edge a host's CPU limited is named in ``notes``: its figure bounds the host, not the path
    (the tool is never the limit of its own measurement unsaid)."""
    doc = reply.get("result")
    if not isinstance(doc, dict) or "error" in doc:
        why = doc.get("error") if isinstance(doc, dict) else "no result"
        raise ProbeError(f"edge {src} -> {dst}: {str(why)[:200]}")
    try:
        result = ThroughputResult.from_json(doc)
    except Exception as exc:  # noqa: BLE001 - a far end's document is data
        raise ProbeError(f"edge {src} -> {dst}: malformed result ({exc})") from None
    if notes is not None and result.limited_by.verdict in HOST_BOUND:
        notes.append(f"{src} -> {dst}: limited by a host's CPU ({result.limited_by.summary}); "
                     "its rate is a lower bound of the path, set by the measuring hosts")
    return EdgeRun.from_throughput(src, dst, result)


def run_edges(opts: RingOptions, addrs: dict[str, str], edges: Sequence[tuple[str, str]],
              notes: list[str] | None = None) -> list[EdgeRun]:
    """The ``edges`` at once, each sent by its source host to its destination."""
    jobs = []
    for src, dst in edges:
        req = EdgeRequest(to=addrs[dst], port=opts.port, duration_s=opts.duration_s,
                          streams=opts.streams, omit_s=opts.omit_s)
        jobs.append((addrs[src], EDGE_OP, {"edge": req.to_json()},
                     opts.duration_s + opts.omit_s + REPLY_MARGIN_S))
    replies = _at_once(opts, jobs)
    return [edge_run(s, d, r, notes) for (s, d), r in zip(edges, replies, strict=True)]


def run_ring(opts: RingOptions, say: Progress | None = None) -> RingResult:
    """The whole ring test (module docstring); hosts are named as the operator gave them."""
    tell = say or (lambda _m: None)
    addrs = resolve(opts.hosts)
    order = list(opts.hosts)
    tell(f"timing handshakes between {len(order)} hosts")
    rtt = rtt_matrix(opts, addrs)
    sites = sites_by_rtt(order, rtt, site_rtt_ms=opts.site_rtt_ms)
    site_of = site_index(order, sites)
    tell(f"every edge of {' -> '.join(order)} at once")
    notes: list[str] = []
    together = run_edges(opts, addrs, ring_edges(order), notes)
    alone = {}
    for src, dst in ring_edges(order):
        if site_of[src] != site_of[dst]:
            tell(f"{src} -> {dst} alone")
            alone[(src, dst)] = run_edges(opts, addrs, [(src, dst)], notes)[0]
    best = best_order(order, sites, rate_bps={k: r.bits_per_second for k, r in alone.items()},
                      rtt_ms=rtt)
    best_runs = None
    if opts.measure_best and set(ring_edges(best)) != set(ring_edges(order)):
        tell(f"the proposed order {' -> '.join(best)} at once")
        best_runs = run_edges(opts, addrs, ring_edges(best), notes)
    result = assemble(order, together, alone, sites, rtt, (best, best_runs))
    return replace(result, notes=(*result.notes, *dict.fromkeys(notes)))
