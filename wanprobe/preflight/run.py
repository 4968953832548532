"""``wanprobe preflight``: one go / no-go for a job's hosts, and the NCCL settings for them.

The document: ``{"go", "hosts": [{"host", "go", "reasons": [{"code", "text"}], ...}],
"nccl_env": {"variables", "by_site", "notes", "text"}, "elapsed_s", "bound_s", "notes"}``.
``go`` is true only when every host is go. The run is bounded by ``bound_s`` from the moment
the command started, whatever the hosts do (measure.py); judging and the NCCL computation take
milliseconds after that and are not bounded separately. With a mesh file, job hosts named there
take the mesh's address (no DNS) and site. Each host's ``rate`` is what its buffers were judged
against (judge.host_rates: its path's measured or ``--link-rate`` figure, at most the job's
``--rate``); NCCL's sockets and buffer are sized for the fastest of them, never for the NIC.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from wanprobe.mesh.topology import Mesh, load_mesh
from wanprobe.preflight.hostlist import parse_host_list
from wanprobe.preflight.judge import Rate, Thresholds, host_rates, verdicts
from wanprobe.preflight.measure import HostMeasure, MeshNames, ProbePlan, measure

# Time kept back from the bound for cancelled probes to unwind and for judging: a tenth of
# it, at most 1.5 s (measure.py gives the unwinding half of that).
RESERVE_S = 1.5


@dataclass(frozen=True)
class PreflightOptions:
    plan: ProbePlan
    thresholds: Thresholds
    bound_s: float = 30.0
    max_hosts: int = 1024
    history: Path | None = None          # the local daemon's history.sqlite3, if one runs
    history_window_s: float = 3600.0     # reroutes and RTT floors
    capacity_window_s: float = 7 * 86400.0  # network-limited throughput tests (path capacity)
    mesh: Path | None = None             # sites of the hosts (cross-datacenter NCCL settings)
    nccl_version: tuple[int, int] = (2, 21)
    sys_root: Path = Path("/sys")


def _host_json(m: HostMeasure, reasons: list, rate: Rate | None) -> dict[str, Any]:
    p = m.probe
    out: dict[str, Any] = {"host": m.entry.host, "go": not reasons,
                           "reasons": [r.to_json() for r in reasons],
                           "address": m.address, "resolved": m.resolved, "port": m.entry.port,
                           "mesh_name": m.mesh_name, "site": m.site, "local": m.local,
                           "rate": rate.to_json() if rate else None}
    if p is not None:
        out |= {"method": p.method, "sent": p.loss.sent, "received": p.loss.received,
                "loss_ratio": round(p.loss.ratio, 6),
                "rtt_ms": {k: round(getattr(p.rtt, k), 3) for k in ("min", "p50", "p99")}
                if p.rtt else None}
    out["path_mtu_bytes"] = m.mtu.path_mtu if m.mtu else None
    out["facts"] = m.facts.to_json() if m.facts else None
    out["errors"] = {k: v for k, v in (("stamp", m.stamp_error), ("icmp", m.icmp_error),
                                        ("mtu", m.mtu_error), ("facts", m.facts_error)) if v}
    return out


def _history(opts: PreflightOptions, notes: list[str]):
    from wanprobe.preflight.history import read_history

    if opts.history is None or not opts.history.exists():
        notes.append("no daemon history here: reroutes in the last hour not checked")
        return None
    try:
        now = time.time()
        return read_history(opts.history, now - opts.history_window_s,
                            now - opts.capacity_window_s)
    except (OSError, ValueError, sqlite3.Error) as exc:
        notes.append(f"daemon history {opts.history} unreadable ({exc}): reroutes not checked")
        return None


def _egress(ms: list[HostMeasure]) -> str | None:
    """The interface toward the job (``ip route get`` to a host that answered), for
    NCCL_SOCKET_IFNAME. Its speed is not asked: a NIC's speed is not its path's."""
    from collectors.route import route_get

    far = next((m.address for m in ms if m.address and not m.local and m.probe), None)
    route = route_get(far) if far else None
    return route.iface if route is not None else None


def _rate_notes(ms: list[HostMeasure], rates: list[Rate | None], notes: list[str]) -> None:
    unjudged = [m.entry.host for m, r in zip(ms, rates, strict=True) if r is None and m.facts]
    if unjudged:
        notes.append(f"buffers and congestion control not judged for {len(unjudged)} of "
                     f"{len(ms)} hosts ({', '.join(unjudged[:5])}{', ...' if len(unjudged) > 5 else ''}): "
                     "the local daemon's history has no throughput test the path limited and "
                     "neither --link-rate (what the paths carry) nor --rate (what the job needs) "
                     "was given; a NIC's speed is not its path's")


def _nccl(ms: list[HostMeasure], opts: PreflightOptions, mesh: Mesh | None,
          rate_bps: float | None, iface: str | None) -> dict[str, Any]:
    """One NCCL computation over the job: the longest path, the worst loss, the smallest
    buffers, the common cc and MTU; per site where the settings differ (fabric ids)."""
    from tuners.nccl_env import PathFacts, compute, render

    ok = [m for m in ms if m.probe and m.probe.loss.received and not m.local]
    facts = [m.facts for m in ms if m.facts]
    rmem = [f.tcp_rmem_bytes[2] for f in facts if f.tcp_rmem_bytes]
    wmem = [f.tcp_wmem_bytes[2] for f in facts if f.tcp_wmem_bytes]
    ccs = Counter(f.cc_current for f in facts if f.cc_current).most_common(1)
    mtus = Counter(f.iface_mtu_bytes for f in facts if f.iface_mtu_bytes).most_common(1)
    base = PathFacts(iface=iface, link_bps=rate_bps,
                     rtt_ms=max((m.probe.rtt.p99 for m in ok if m.probe.rtt), default=None),
                     loss=max((m.probe.loss.ratio for m in ok), default=None),
                     tcp_rmem_max=min(rmem, default=None), tcp_wmem_max=min(wmem, default=None),
                     cc=ccs[0][0] if ccs else None, mtu=mtus[0][0] if mtus else None)
    notes: list[str] = []
    jobs = _job_sites(ms, mesh, notes)
    runs = {site: compute(replace(base, job=job), opts.sys_root, nccl_version=opts.nccl_version,
                          notes=notes if site == next(iter(jobs)) else None)
            for site, job in jobs.items()}
    sets = [{(v.name, v.value) for v in vs} for vs in runs.values()]
    common = set.intersection(*sets)
    first = next(iter(runs.values()))
    variables = [v for v in first if (v.name, v.value) in common]
    by_site = {site: [v.to_json() for v in vs if (v.name, v.value) not in common]
               for site, vs in runs.items() if len(runs) > 1}
    return {"variables": [v.to_json() for v in variables], "by_site": by_site, "notes": notes,
            "text": render(variables, "env", header="generated by wanprobe preflight")}


def _job_sites(ms: list[HostMeasure], mesh: Mesh | None, notes: list[str]) -> dict:
    """{site: JobSites as seen from it} for every site the job spans; {None: None} without a
    mesh or when a host is not in it."""
    from tuners.nccl_xdc import JobSites

    if mesh is None:
        return {None: None}
    names = MeshNames(mesh.hosts)  # as measure() found them: by the mesh's name or address
    found = [m.site or getattr(names.name(m.entry.host) or names.address(m.address), "site",
                               None) for m in ms]
    sites = set(found)
    if None in sites:
        notes.append("some hosts are not in the mesh: the sites the job spans are unknown")
        return {None: None}
    ordered = tuple(s for s in mesh.sites if s in sites)
    return {s: JobSites(ordered, s) for s in ordered}


def _local_addresses() -> frozenset[str]:
    from wanprobe.mesh.topology import local_addresses

    try:
        return frozenset(a.split("%")[0] for a in local_addresses())
    except OSError:
        return frozenset()


def preflight(text: str, opts: PreflightOptions, started: float) -> dict[str, Any]:
    """Parse the host list, measure every host until the bound, judge, compute NCCL settings.
    ``started``: time.monotonic() when the command began (the bound counts from there)."""
    entries = parse_host_list(text, max_hosts=opts.max_hosts)
    mesh = load_mesh(opts.mesh) if opts.mesh else None  # a bad mesh is refused before probing
    reserve_s = min(RESERVE_S, opts.bound_s / 10)
    deadline = started + opts.bound_s - reserve_s
    ms = asyncio.run(measure(entries, opts.plan, deadline, _local_addresses(),
                             grace_s=reserve_s / 2,
                             names=MeshNames(mesh.hosts if mesh else ())))
    notes: list[str] = []
    history = _history(opts, notes)
    rates = host_rates(ms, opts.thresholds, history)
    _rate_notes(ms, rates, notes)
    results = verdicts(ms, opts.thresholds, history, opts.bound_s, rates)
    fastest = max((r.bits_per_second for r in rates if r), default=None)
    doc = {"go": all(not r for _, r in results),
           "hosts": [_host_json(m, r, rate) for (m, r), rate in zip(results, rates, strict=True)],
           "nccl_env": _nccl(ms, opts, mesh, fastest, _egress(ms))}
    return doc | {"elapsed_s": round(time.monotonic() - started, 3), "bound_s": opts.bound_s,
                  "notes": notes}
