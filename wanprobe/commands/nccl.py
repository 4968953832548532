"""CLI: ``wanprobe nccl-env`` — NCCL variables for this host and path, each with its reason."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from wanprobe.commands.options import JsonDocument
from wanprobe.errors import ConfigError, UsageError
from wanprobe.safe_text import clean_lines

app = typer.Typer()


@app.command("nccl-env")
def nccl_env(
    report: Annotated[str | None, typer.Option("--report", "-r", help="Report JSON from `wanprobe diagnose` (RTT, loss, link, DSCP).")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="env | nccl.conf | shell | systemd | k8s")] = "env",
    sys_root: Annotated[str, typer.Option("--sys-root", help="sysfs root to read RDMA ports from.")] = "/sys",
    proc_root: Annotated[str, typer.Option("--proc-root", help="procfs root for tcp_rmem/tcp_wmem/cc when the report has none.")] = "/proc",
    iface: Annotated[str | None, typer.Option("--iface", help="Interface toward the peer (overrides the report).")] = None,
    rtt: Annotated[str | None, typer.Option("--rtt", help="Path RTT, e.g. 130ms (overrides the report).")] = None,
    link_rate: Annotated[str | None, typer.Option("--link-rate", help="Link rate, e.g. 10gbit (overrides the report).")] = None,
    nccl_version: Annotated[str, typer.Option("--nccl-version", help="NCCL release the job uses (GID index logic changed in 2.21).")] = "2.21",
    transport: Annotated[str, typer.Option("--transport", help="auto | ib | socket")] = "auto",
    ecmp: Annotated[bool, typer.Option("--ecmp", help="The fabric hashes flows over ECMP paths.")] = False,
    mesh: Annotated[str | None, typer.Option("--mesh", help="The fleet's mesh file: which site this host and the report's peer are in (cross-datacenter settings when they differ).")] = None,
    site: Annotated[str | None, typer.Option("--site", help="This host's site (default: found in --mesh by name or address).")] = None,
    paths: Annotated[str | None, typer.Option("--paths", help="`wanprobe paths --json` toward the peer: sockets are sized from its slowest ECMP flow.")] = None,
    as_json: JsonDocument = False,
) -> None:
    """Compute NCCL_SOCKET_IFNAME, NCCL_IB_HCA/TC/TIMEOUT/QPS/GID_INDEX and socket counts."""
    from tuners.nccl_env import FORMATS, compute, parse_nccl_version, render
    from wanprobe.userfiles import existing_dir

    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")
    if transport not in ("auto", "ib", "socket"):
        raise UsageError(f"unknown transport {transport!r} (auto, ib or socket)")
    sys_path = existing_dir(sys_root, "--sys-root")
    proc_path = existing_dir(proc_root, "--proc-root")
    doc, facts = _facts(report, proc_path, iface, rtt, link_rate, ecmp)
    notes: list[str] = []
    facts = _with_sites_and_flows(facts, doc, mesh, site, paths, notes)
    variables = compute(facts, sys_path, nccl_version=parse_nccl_version(nccl_version), transport=transport,
                        notes=notes)
    if as_json:
        typer.echo(json.dumps({"format": fmt, "variables": [v.to_json() for v in variables],
                               "notes": notes, "text": render(variables, fmt, notes=notes)},
                              indent=2))
        return
    typer.echo(clean_lines(render(variables, fmt, notes=notes)), nl=False)  # report text is data


def _facts(report: str | None, proc_path, iface: str | None, rtt: str | None,
           link_rate: str | None, ecmp: bool):
    """The report (or None) and the path facts: the report's, the live sysctls where it has none,
    then the command-line overrides."""
    from dataclasses import replace

    from tuners.from_report import load_report
    from tuners.nccl_env import facts_from_report, with_live_sysctls
    from wanprobe.units import MAX_RTT_S, parse_duration_ms, parse_ifname, parse_rate_bps

    if iface:
        iface = parse_ifname(iface)
    rtt_ms = parse_duration_ms(rtt, maximum_s=MAX_RTT_S) if rtt else None
    doc = load_report(report) if report else None
    facts = facts_from_report(doc)
    if facts.tcp_rmem_max is None or facts.cc is None:
        facts = with_live_sysctls(facts, proc_path)
    if iface:
        facts = replace(facts, iface=iface)
    if rtt_ms is not None:
        facts = replace(facts, rtt_ms=rtt_ms)
    if link_rate:
        facts = replace(facts, link_bps=parse_rate_bps(link_rate))
    if ecmp:
        facts = replace(facts, ecmp=True)
    return doc, facts


def _with_sites_and_flows(facts, report: dict | None, mesh: str | None, site: str | None,
                          paths: str | None, notes: list[str]):
    """The job's sites (--mesh, the report's peer) and the ECMP flows (--paths) in the facts."""
    from dataclasses import replace
    from socket import gethostname

    from tuners.nccl_xdc import flows_from_paths, job_from_mesh
    from wanprobe.mesh.topology import find_self, load_mesh, local_addresses
    from wanprobe.userfiles import read_json

    if paths is not None:
        flows = flows_from_paths(read_json(paths, "--paths"))
        if not flows:
            raise UsageError(f"--paths {paths}: no flows (want `wanprobe paths --json` output)")
        facts = replace(facts, flows=flows)
    if mesh is None:
        if site is not None:
            raise UsageError("--site needs --mesh (the sites and their order)")
        return facts
    peer = ((report or {}).get("peer") or {}).get("address")
    if not isinstance(peer, str) or not peer:
        raise UsageError("--mesh needs --report (its peer is the far end of the job)")
    loaded = load_mesh(mesh)
    if site is None:   # found in the mesh by name or address, as the daemon finds itself
        try:
            site = find_self(loaded, hostname=gethostname(), local_addresses=local_addresses()).site
        except ConfigError:
            raise UsageError(f"this host ({gethostname()}) is not in the mesh by name or "
                             "address: pass --site") from None
    job, more = job_from_mesh(loaded, site, [peer])
    notes += more
    return replace(facts, job=job)

