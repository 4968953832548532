"""CLI command: impact — what the measured path does to training step time and GPU idle cost."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Annotated

import typer

from wanprobe.commands.impact_sources import HourSource, RingInput
from wanprobe.errors import UsageError
from wanprobe.models import impact as model
from wanprobe.models import strategy
from wanprobe.models.bdp import window_from_buffer_bytes
from wanprobe.models.impact_inputs import Candidate
from wanprobe.models.impact_sites import assess
from wanprobe.units import MAX_RTT_S, parse_bytes, parse_duration_s, parse_rate_bps, parse_ratio

HELP = (
    "Plan a data-parallel job over measured WAN paths: every combination of host tuning (as-is, "
    "tuned), topology (flat ring, hierarchical), gradient bytes (fp32, bf16, int8, fp4), top-k "
    "compression, sync period (every step, every H steps: local SGD / DiLoCo) and streaming "
    "(fragments overlapped with compute), with its communication, step time, GPU idle share and "
    "idle cost per day; the table shows the as-is baseline and the best few.\n\n"
    "Inputs: --report (diagnose reports), --ring (a ring test), or --rtt/--bandwidth; with "
    "--prometheus/--from-site/--to-site or --state-dir/--peer, the best plan for each hour of the "
    "week on that hour's measured capacity. --target-utilization: the WAN rate each combination "
    "needs instead.\n\n"
    "step = compute + comm − min(overlap·comm, compute) every step; compute + sync/H every H "
    "steps; max(compute, sync/H) streamed. GPU idle share = (step − compute)/step; idle cost/day "
    "= idle share · GPUs · 24 h · cost per GPU-hour. The effect of H, compression or staleness "
    "on convergence is not measured here."
)


def _path_from_flags(rtt: str | None, link_bps: float | None, loss: str | None, cc: str,
                     rmem: str) -> model.Path:
    if rtt is None or link_bps is None:
        raise UsageError("give --report R.json, --ring R.json, or --rtt and --bandwidth (e.g. "
                         "--rtt 130ms --bandwidth 10gbit)")
    rtt_s = parse_duration_s(rtt, allow_zero=False, maximum_s=MAX_RTT_S)
    p = parse_ratio(loss) if loss is not None else 0.0
    window = window_from_buffer_bytes(parse_bytes(rmem))
    return model.Path(rtt_s=rtt_s, link_bps=link_bps, loss=p, cc=cc.lower(), window_bytes=window)


def _load_reports(paths: list[FsPath], link_bps: float | None) -> list[Candidate]:
    from wanprobe.report.document import load_json
    from wanprobe.report.impact_reader import candidate_from_report

    return [candidate_from_report(load_json(p, strict=False), str(p), link_bps) for p in paths]


app = typer.Typer()


# What a training job can be: beyond these a figure is a typo, not a job (issue 19: 1e11 GPUs
# per site was modelled). 10^15 parameters is ~1,000x today's largest models; the largest
# clusters hold ~10^5 GPUs; a step of a day, local SGD syncing every 10^7 steps.
MAX_PARAMS, MAX_SITES, MAX_GPUS_PER_SITE = 1e15, 1_000, 1_000_000
MAX_SYNC_EVERY, MAX_COMPUTE_MS = 10_000_000, 86_400_000.0


def _within(option: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:  # NaN fails too
        raise UsageError(f"{option} {value:g} is outside {lo:g}-{hi:g}")


@app.command("impact", help=HELP)
def impact(
    params: Annotated[float, typer.Option("--params", help="Model parameters, e.g. 70e9.")],
    report: Annotated[list[FsPath] | None, typer.Option(
        "--report", help="diagnose report JSON; repeat once per candidate site.")] = None,
    ring: Annotated[FsPath | None, typer.Option(
        "--ring", help="A ring test's JSON (wanprobe ring --json, or a report holding one): "
        "its RTT, its rate with every edge busy, its slowest flow; its sites.")] = None,
    rtt: Annotated[str | None, typer.Option(help="p99 round-trip time, e.g. 130ms.")] = None,
    bandwidth: Annotated[str | None, typer.Option(help="Link capacity, e.g. 10gbit.")] = None,
    loss: Annotated[str | None, typer.Option(help="Packet loss, e.g. 0.1%.")] = None,
    cc: Annotated[str, typer.Option(help="Congestion control on the hosts now (reno, cubic, bbr).")] = "cubic",
    rmem: Annotated[str, typer.Option(help="Hosts' tcp_rmem max now (window ≈ half of it).")] = "6MiB",
    dtype: Annotated[str, typer.Option(help="Gradient dtype: fp32, bf16, fp16, int8, fp4.")] = "bf16",
    gpus_per_site: Annotated[int, typer.Option("--gpus-per-site")] = 8,
    sites: Annotated[int | None, typer.Option("--sites", help="Sites (default 2, or the ring's).")] = None,
    compute_ms: Annotated[float | None, typer.Option("--compute-ms", help="Compute time per step.")] = None,
    overlap: Annotated[float | None, typer.Option(help="Share of an every-step sync hidden under compute (DDP buckets), 0.0-1.0 (default 0).")] = None,
    gpu_hour_cost: Annotated[float | None, typer.Option("--gpu-hour-cost", help="Cost per GPU-hour (default 2.5).")] = None,
    collective: Annotated[str, typer.Option(help="As-is collective: ring (NCCL's flat ring), hierarchical, tree.")] = "ring",
    topk: Annotated[float, typer.Option(help="Top-k ratio kept by sparsification, in (0, 1].")] = 0.01,
    sync_every: Annotated[list[int] | None, typer.Option(
        "--sync-every", help="H for local SGD / DiLoCo (repeat for several; default 500).")] = None,
    more_bandwidth: Annotated[str | None, typer.Option("--more-bandwidth", help="Upgraded link (default 4× the link).")] = None,
    target_utilization: Annotated[str | None, typer.Option(
        "--target-utilization", help="Instead: the WAN rate each combination needs for this GPU "
        "utilisation (compute / step), e.g. 90%; needs --compute-ms. With an hourly source: "
        "the utilisation the hour's plan is sized for (default 90%).")] = None,
    top: Annotated[int, typer.Option("--top", help="Combinations shown besides as-is (1-50).")] = 6,
    prometheus: Annotated[str | None, typer.Option(
        "--prometheus", help="Prometheus URL: plan each hour of the week on the fleet's capacity.")] = None,
    from_site: Annotated[str | None, typer.Option("--from-site", help="With --prometheus.")] = None,
    to_site: Annotated[str | None, typer.Option("--to-site", help="With --prometheus.")] = None,
    state_dir: Annotated[FsPath | None, typer.Option(
        "--state-dir", help="The daemon's state directory: plan each hour on its history.")] = None,
    peer: Annotated[str | None, typer.Option("--peer", help="With --state-dir.")] = None,
    lookback: Annotated[str, typer.Option("--lookback", help="History behind the hours (1h-90d).")] = "14d",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    periods = list(sync_every or [500])
    ring_in = _ring(ring, report)
    job = _job(params, dtype, _sites(sites, ring_in), gpus_per_site, periods, compute_ms, overlap,
               gpu_hour_cost)
    _within("--top", top, 1, 50)
    options = model.Options(collective=collective, topk_ratio=topk, sync_every=periods[0],
                            more_sync_every=tuple(periods[1:]),
                            more_bandwidth_bps=(parse_rate_bps(more_bandwidth)
                                                if more_bandwidth is not None else None))
    hours = HourSource(prometheus, from_site, to_site, state_dir, peer, _lookback(lookback))
    util = parse_ratio(target_utilization) if target_utilization is not None else None
    if util is not None and not hours.given:
        _inverse(job, options, util, rtt, report, ring_in, as_json, top)
        return
    flags = _PathFlags(report, ring_in, rtt, parse_rate_bps(bandwidth) if bandwidth is not None
                       else None, loss, cc, rmem)
    if hours.given:
        _hourly(job, options, flags, hours, 0.9 if util is None else util, as_json)
        return
    base, candidates = flags.base()
    result = assess(job, options, path=base, candidates=candidates)
    if as_json:
        doc = result.to_json()
        doc["inputs"].update(reports=[str(p) for p in report or []],
                             ring=ring_in.described if ring_in else None)
        typer.echo(json.dumps(doc, indent=2))
        return
    from wanprobe.commands.impact_view import render

    render(result, top)


def _ring(ring: FsPath | None, report: list[FsPath] | None) -> RingInput | None:
    if ring is None:
        return None
    if report:
        raise UsageError("give either --report or --ring, not both")
    from wanprobe.commands.impact_sources import ring_input

    return ring_input(ring)


def _sites(sites: int | None, ring_in: RingInput | None) -> int:
    if ring_in is None:
        return 2 if sites is None else sites
    if sites is not None and sites != ring_in.sites:
        raise UsageError(f"--sites {sites} but the ring test found {ring_in.sites} sites")
    return ring_in.sites


def _lookback(text: str) -> float:
    from wanprobe.commands.impact_sources import MAX_LOOKBACK_S

    try:
        return parse_duration_s(text, allow_zero=False, maximum_s=MAX_LOOKBACK_S)
    except UsageError as e:
        raise UsageError(f"--lookback: {e}") from None


@dataclass(frozen=True)
class _PathFlags:
    """Where the path comes from: reports, a ring test, or the flags by hand."""

    report: list[FsPath] | None
    ring_in: RingInput | None
    rtt: str | None
    link: float | None
    loss: str | None
    cc: str
    rmem: str

    def base(self, hourly: bool = False,
             default_rtt_s: float | None = None) -> tuple[model.Path | None, list[Candidate]]:
        """The path as measured (a ring test, flags) or the candidates of the reports. For
        hourly plans the link is each hour's capacity, and without ``--rtt`` the hours' median
        RTT (``default_rtt_s``) stands in."""
        if (self.report or self.ring_in) and (self.rtt is not None or self.loss is not None):
            raise UsageError("--rtt/--loss come from the report or the ring; give them or "
                             "--rtt/--loss")
        if self.report:
            return None, _load_reports(self.report, self.link)
        if self.ring_in is not None:
            return self.ring_in.path, []
        rtt = self.rtt
        if rtt is None and default_rtt_s is not None:
            rtt = f"{default_rtt_s * 1e3:.6f}ms"
        link = 1e9 if hourly and self.link is None else self.link  # each hour's replaces it
        return _path_from_flags(rtt, link, self.loss, self.cc, self.rmem), []


def _hourly(job: model.Job, options: model.Options, flags: _PathFlags, hours_src: HourSource,
            utilization: float, as_json: bool) -> None:
    """The best plan for each hour of the week on that hour's measured capacity."""
    import statistics

    from wanprobe.commands.impact_sources import hour_capacities
    from wanprobe.commands.impact_view import render_hours
    from wanprobe.models.impact_sites import joint
    from wanprobe.models.plan_hours import plan_hours, summary

    hours, source = hour_capacities(hours_src)
    seen = [h.rtt_p50_s for h in hours if h.rtt_p50_s]
    path, candidates = flags.base(hourly=True,
                                  default_rtt_s=statistics.median(seen) if seen else None)
    if candidates:
        path, options = joint(options, candidates)
    assert path is not None
    plans = plan_hours(job, options, path, hours, utilization)
    if as_json:
        typer.echo(json.dumps({"source": source, "target_utilization": utilization,
                               "caveat": strategy.CAVEAT, "summary": summary(plans),
                               "hours": [p.to_json() for p in plans]}, indent=2))
        return
    render_hours(plans, summary(plans), source, utilization)


def _job(params: float, dtype: str, sites: int, gpus_per_site: int, sync_every: list[int],
         compute_ms: float | None, overlap: float | None,
         gpu_hour_cost: float | None) -> model.Job:
    """The job the options describe, each figure checked against what a training job can be."""
    _within("--params", params, 1, MAX_PARAMS)
    model.dtype_bytes(dtype)
    _within("--sites", sites, 1, MAX_SITES)
    _within("--gpus-per-site", gpus_per_site, 1, MAX_GPUS_PER_SITE)
    for h in sync_every:
        _within("--sync-every", h, 1, MAX_SYNC_EVERY)
    if compute_ms is not None:
        _within("--compute-ms", compute_ms, 1e-3, MAX_COMPUTE_MS)
    if compute_ms is None and (overlap is not None or gpu_hour_cost is not None):
        raise UsageError("--overlap and --gpu-hour-cost need --compute-ms (a GPU idle share needs a compute time)")
    if compute_ms is not None and not compute_ms > 0:
        raise UsageError(f"--compute-ms must be > 0, got {compute_ms:g}")
    job = model.Job(params=params, dtype=dtype.lower(), sites=sites, gpus_per_site=gpus_per_site,
                    compute_s=None if compute_ms is None else compute_ms / 1e3,
                    overlap=0.0 if overlap is None else overlap,
                    gpu_hour_cost=2.5 if gpu_hour_cost is None else gpu_hour_cost)
    model.step_time_s(1.0, 0.0, job.overlap)  # validates overlap
    if job.gpu_hour_cost < 0:
        raise UsageError("--gpu-hour-cost must be ≥ 0")
    return job




def _inverse(job: model.Job, options: model.Options, utilization: float, rtt: str | None,
             report: list[FsPath] | None, ring_in: RingInput | None, as_json: bool,
             top: int) -> None:
    """``--target-utilization``: the WAN rate each combination needs (models/impact_inverse.py)."""
    from wanprobe.commands.impact_view import render_needs
    from wanprobe.models.impact_inverse import max_comm_s, needs

    if (report or ring_in) and rtt is not None:
        raise UsageError("--rtt comes from the report or the ring; give either them or --rtt")
    if report:
        rtt_s = _load_reports(report[:1], None)[0].path.rtt_s
    elif ring_in is not None:
        rtt_s = ring_in.path.rtt_s
    elif rtt is None:
        raise UsageError("--target-utilization needs --rtt (p99, e.g. 130ms), --report or --ring")
    else:
        rtt_s = parse_duration_s(rtt, allow_zero=False, maximum_s=MAX_RTT_S)
    result = needs(job, rtt_s, utilization, options)
    doc = {"target_utilization": utilization, "rtt_s": rtt_s, "caveat": strategy.CAVEAT,
           "comm_budget_per_step_s": max_comm_s(job.compute_s or 0.0, job.overlap, utilization)
           if job.compute_s else None, "needs": [n.to_json() for n in result]}
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    render_needs(job, doc, result, top)
