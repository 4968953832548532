"""NCCL across datacenters: the job's sites, its measured ECMP flows, and the settings NVIDIA
names for jobs that span sites.

Sources: NVIDIA, "NCCL Deep Dive: Cross Data Center Communication and Network Topology
Awareness" (technical blog, July 2025, NCCL 2.27) — ``NCCL_ALLNET_ENABLE=1`` lets NCCL use
several networks (IB/RoCE inside a datacenter, another one between them); a fabric id per NIC
in ``NCCL_IB_HCA=dev:port:fabricID`` with ``fabricID = DC_ID × MAX_RAILS + RAIL_ID`` tells it
which NICs share a datacenter, so rings cross between datacenters only 2·(nDC−1) times; and
``NCCL_SCATTER_XDC=1`` spreads those crossings over the nodes' rails instead of funnelling them
through one NIC. The feature came with NVIDIA/nccl#1659; NVIDIA/nccl#1850 notes that the
variables are not in every public source tree, so each reason says to check ``NCCL_DEBUG=INFO``.

Sockets: "NCCL bandwidth will be the minimum speed of the sockets multiplied by the number of
sockets" (NVIDIA/nccl-tests#83; NVIDIA/nccl#438: a transfer is split equally over the sockets).
Each socket is one 5-tuple, so the ECMP hash pins it to one path: the socket count is sized
from the slowest measured flow of ``wanprobe paths --json``, not from the average.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

XDC_NCCL = (2, 27)  # the release NVIDIA's cross-datacenter settings arrived in
_CHECK = "check that your NCCL build reads it (NCCL_DEBUG=INFO lists the variables it uses)"


@dataclass(frozen=True)
class Flow:
    """One measured ECMP flow (a ``flows[]`` entry of ``wanprobe paths --json``): its source
    port, the path it hashed onto, its tail RTT and its loss (None where nothing came back)."""

    src_port: int
    path: int | None
    rtt_p99_ms: float | None
    loss_ratio: float | None


@dataclass(frozen=True)
class JobSites:
    """The datacenters a job spans, in the mesh's order (the same on every host, so every
    host computes the same DC_ID for a site), and the one this host is in."""

    sites: tuple[str, ...]
    local: str

    @property
    def spans(self) -> bool:
        return len(self.sites) > 1

    @property
    def dc_id(self) -> int:
        return self.sites.index(self.local)


def _num(v: Any) -> float | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def flows_from_paths(doc: Any) -> tuple[Flow, ...]:
    """The flows of a ``wanprobe paths --json`` document (``probe/paths.py``
    ``FlowResult.to_json``: ``src_port``, ``path``, ``rtt_ms.p99``, ``loss.ratio``)."""
    flows = doc.get("flows") if isinstance(doc, Mapping) else None
    out = []
    for f in flows if isinstance(flows, list) else []:
        if not isinstance(f, Mapping) or not isinstance(f.get("src_port"), int):
            continue
        rtt_ms, loss_doc = f.get("rtt_ms"), f.get("loss")
        rtt = rtt_ms if isinstance(rtt_ms, Mapping) else {}
        loss = loss_doc if isinstance(loss_doc, Mapping) else {}
        path = f.get("path")
        out.append(Flow(f["src_port"], path if isinstance(path, int) else None,
                        _num(rtt.get("p99")), _num(loss.get("ratio"))))
    return tuple(out)


def distinct_paths(flows: Sequence[Flow]) -> int:
    """How many ECMP paths the flows landed on (``paths``' grouping by hop list)."""
    return len({f.path for f in flows if f.path is not None})


def fabric_hcas(ports: Sequence[tuple[str, int]], job: JobSites, max_rails: int) -> str:
    """``NCCL_IB_HCA`` with a fabric id per NIC: DC_ID × MAX_RAILS + RAIL_ID, the rail being
    the NIC's place among this host's active ports (the same order on identical hosts)."""
    return "=" + ",".join(f"{dev}:{port}:{job.dc_id * max_rails + rail}"
                          for rail, (dev, port) in enumerate(ports))


def xdc_settings(ports: Sequence[tuple[str, int, float | None]], job: JobSites,
                 nccl_version: tuple[int, int]) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(NAME, value, reason) for a job that spans sites, and notes for what was not set.
    ``ports``: this host's active RDMA ports (device, port, rate Gbit/s)."""
    if not job.spans:
        return [], []
    names = ", ".join(job.sites)
    if nccl_version < XDC_NCCL:
        return [], [f"the job spans {len(job.sites)} sites ({names}): NCCL ≥ "
                    f"{XDC_NCCL[0]}.{XDC_NCCL[1]} has cross-datacenter settings (fabric ids in "
                    "NCCL_IB_HCA, NCCL_ALLNET_ENABLE, NCCL_SCATTER_XDC); pass --nccl-version "
                    "of a newer release to get them"]
    if not ports:
        return [], [f"the job spans sites ({names}) over sockets only (no active RDMA port "
                    "here): the fabric-id settings apply to IB/RoCE NICs"]
    rails = len(ports)
    out = [("NCCL_IB_HCA", fabric_hcas([(d, p) for d, p, _ in ports], job, rails),
            f"fabric id per NIC = DC_ID × MAX_RAILS + RAIL_ID: this host is in {job.local} "
            f"(DC_ID {job.dc_id} of {names}, the mesh's order), {rails} rail(s); a rail's NICs in "
            "one datacenter share an id, so NCCL knows which NICs are in which datacenter and "
            "rings cross between them only 2·(nDC−1) times (NCCL ≥ 2.27)"),
           ("NCCL_ALLNET_ENABLE", "1",
            f"the job spans {names}: lets NCCL use the RDMA fabric inside each datacenter and "
            f"another network between them (disables CollNet; NCCL ≥ 2.27; {_CHECK})")]
    rates = [r for _, _, r in ports if r]
    load = (f": without it one NIC carries the crossing's {sum(rates):g} Gbit/s, with it "
            f"{max(rates):g} Gbit/s per NIC" if len(rates) == rails and rails > 1 else "")
    out.append(("NCCL_SCATTER_XDC", "1",
                f"spread the cross-datacenter ring crossings over the nodes' rails{load} "
                f"(NCCL ≥ 2.27; {_CHECK})"))
    return out, []


def qps_for_paths(flows: Sequence[Flow]) -> tuple[int, str] | None:
    """QPs per connection to cover the measured ECMP paths: each QP is its own 5-tuple for
    the switch hash (NCCL-PERF: more QPs "can improve path diversity"), so a connection with
    at least as many QPs as paths spreads over all of them; a power of two, ≤ 128 (NCCL's
    limit)."""
    n = distinct_paths(flows)
    if n < 2:
        return None
    qps = min(128, 2 ** math.ceil(math.log2(n)))
    return qps, f"{len(flows)} measured flows hashed onto {n} distinct ECMP paths"


def job_from_mesh(mesh: Any, local_site: str, peers: Sequence[str]) -> tuple[JobSites | None,
                                                                             list[str]]:
    """The sites of a job whose far ends are ``peers`` (names or addresses in the mesh) seen
    from this host, at ``local_site``. None with a note when a site cannot be known."""
    from wanprobe.errors import UsageError

    if local_site not in mesh.sites:
        raise UsageError(f"--site: {local_site!r} is not a site of the mesh "
                         f"({', '.join(mesh.sites)})")
    by_key = {k: h.site for h in mesh.hosts for k in (h.name, h.address)}
    unknown = [p for p in peers if p not in by_key]
    if unknown:
        return None, [f"{', '.join(unknown[:3])} not in the mesh: the sites the job spans are "
                      "unknown, no cross-datacenter settings"]
    spanned = {local_site, *(by_key[p] for p in peers)}
    return JobSites(tuple(s for s in mesh.sites if s in spanned), local_site), []
