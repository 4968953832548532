"""CLI command: impact — what the measured path does to training step time and GPU idle cost."""

from __future__ import annotations

import json
import sys
from pathlib import Path as FsPath
from typing import Annotated

import typer
from rich.table import Table

from wanprobe.errors import UsageError
from wanprobe.models import impact as model
from wanprobe.models.bdp import window_from_buffer_bytes
from wanprobe.models.impact_inputs import Candidate
from wanprobe.models.impact_sites import Assessment, assess
from wanprobe.safe_text import SafeConsole as Console  # external text is data (issue 19)
from wanprobe.units import (
    MAX_RTT_S,
    format_bytes,
    format_rate,
    parse_bytes,
    parse_duration_s,
    parse_rate_bps,
    parse_ratio,
)

HELP = (
    "Predict all-reduce time, step time, GPU idle share and idle cost per day for a data-parallel "
    "job over a WAN path, for several strategies side by side (as-is, tuned hosts, hierarchical, "
    "fp16/int8 gradients, top-k, sync every H steps, more bandwidth).\n\n"
    "A synchronous step waits for its slowest link: the model uses the path's p99 RTT and the "
    "slowest peer's achievable rate.\n\n"
    "step = compute + comm − min(overlap·comm, compute); GPU idle share = (step − compute)/step; "
    "idle cost/day = idle share · GPUs · 24 h · cost per GPU-hour."
)


def _path_from_flags(rtt: str | None, bandwidth: str | None, loss: str | None, cc: str,
                     rmem: str) -> model.Path:
    if rtt is None or bandwidth is None:
        raise UsageError("give --report R.json, or --rtt and --bandwidth (e.g. --rtt 130ms --bandwidth 10gbit)")
    rtt_s = parse_duration_s(rtt, allow_zero=False, maximum_s=MAX_RTT_S)
    link = parse_rate_bps(bandwidth)
    p = parse_ratio(loss) if loss is not None else 0.0
    window = window_from_buffer_bytes(parse_bytes(rmem))
    return model.Path(rtt_s=rtt_s, link_bps=link, loss=p, cc=cc.lower(), window_bytes=window)


def _load_reports(paths: list[FsPath], link_bps: float | None) -> list[Candidate]:
    from wanprobe.report.document import load_json
    from wanprobe.report.impact_reader import candidate_from_report

    return [candidate_from_report(load_json(p, strict=False), str(p), link_bps) for p in paths]


def _bar_chart(console: Console, results: list[model.StrategyResult], key: str) -> None:
    values = [(r.name, getattr(r, key)) for r in results]
    top = max(v for _, v in values) or 1.0
    width = 40
    label = "step time" if key == "step_time_s" else "comm time"
    console.print(f"[bold]{label} by strategy[/]")
    for name, v in values:
        n = max(1, round(width * v / top)) if v > 0 else 0
        console.print(f"  {name:<22} {'█' * n}{' ' * (width - n)} {_fmt_s(v)}")


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.1f} ms"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _table(title: str, results: list[model.StrategyResult]) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("strategy", "collective", "bytes/sync", "WAN rate", "comm", "step", "comm share",
                "GPU idle", "idle $/day"):
        t.add_column(col, justify="left" if col in ("strategy", "collective") else "right",
                     no_wrap=True)
    for r in results:
        t.add_row(r.name, r.collective, format_bytes(r.bytes_per_sync), format_rate(r.wan_rate_bps),
                  _fmt_s(r.comm_time_s), _fmt_s(r.step_time_s), _pct(r.comm_share),
                  _pct(r.gpu_idle_share),
                  "—" if r.idle_cost_per_day is None else f"{r.idle_cost_per_day:,.0f}")
    return t


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
    rtt: Annotated[str | None, typer.Option(help="p99 round-trip time, e.g. 130ms.")] = None,
    bandwidth: Annotated[str | None, typer.Option(help="Link capacity, e.g. 10gbit.")] = None,
    loss: Annotated[str | None, typer.Option(help="Packet loss, e.g. 0.1%.")] = None,
    cc: Annotated[str, typer.Option(help="Congestion control on the hosts now (reno, cubic, bbr).")] = "cubic",
    rmem: Annotated[str, typer.Option(help="Hosts' tcp_rmem max now (window ≈ half of it).")] = "6MiB",
    dtype: Annotated[str, typer.Option(help="Gradient dtype: bf16, fp16, fp32, int8.")] = "bf16",
    gpus_per_site: Annotated[int, typer.Option("--gpus-per-site")] = 8,
    sites: Annotated[int, typer.Option("--sites")] = 2,
    compute_ms: Annotated[float | None, typer.Option("--compute-ms", help="Compute time per step.")] = None,
    overlap: Annotated[float | None, typer.Option(help="Share of comm hidden under compute, 0.0-1.0 (default 0).")] = None,
    gpu_hour_cost: Annotated[float | None, typer.Option("--gpu-hour-cost", help="Cost per GPU-hour (default 2.5).")] = None,
    collective: Annotated[str, typer.Option(help="As-is collective: ring (NCCL's flat ring), hierarchical, tree.")] = "ring",
    topk: Annotated[float, typer.Option(help="Top-k ratio kept by sparsification.")] = 0.01,
    sync_every: Annotated[int, typer.Option("--sync-every", help="H for local SGD / DiLoCo.")] = 500,
    more_bandwidth: Annotated[str | None, typer.Option("--more-bandwidth", help="Upgraded link (default 4× the link).")] = None,
    target_utilization: Annotated[str | None, typer.Option(
        "--target-utilization", help="Instead: the WAN rate each strategy needs for this GPU "
        "utilisation (compute / step), e.g. 90%; needs --compute-ms and --rtt.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    job = _job(params, dtype, sites, gpus_per_site, sync_every, compute_ms, overlap, gpu_hour_cost)
    link = parse_rate_bps(bandwidth) if bandwidth is not None else None
    options = model.Options(collective=collective, topk_ratio=topk, sync_every=sync_every,
                            more_bandwidth_bps=(parse_rate_bps(more_bandwidth)
                                                if more_bandwidth is not None else None))
    if target_utilization is not None:
        _inverse(job, options, parse_ratio(target_utilization), rtt, report, as_json)
        return
    if report:
        if rtt is not None or loss is not None:
            raise UsageError("--rtt/--loss come from the report; give either --report or --rtt/--loss")
        result = assess(job, options, candidates=_load_reports(report, link))
    else:
        result = assess(job, options, path=_path_from_flags(rtt, bandwidth, loss, cc, rmem))
    if as_json:
        doc = result.to_json()
        doc["inputs"]["reports"] = [str(p) for p in report or []]
        typer.echo(json.dumps(doc, indent=2))
        return
    _render(result)


def _job(params: float, dtype: str, sites: int, gpus_per_site: int, sync_every: int,
         compute_ms: float | None, overlap: float | None,
         gpu_hour_cost: float | None) -> model.Job:
    """The job the options describe, each figure checked against what a training job can be."""
    _within("--params", params, 1, MAX_PARAMS)
    model.dtype_bytes(dtype)
    _within("--sites", sites, 1, MAX_SITES)
    _within("--gpus-per-site", gpus_per_site, 1, MAX_GPUS_PER_SITE)
    _within("--sync-every", sync_every, 1, MAX_SYNC_EVERY)
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


def _render(result: Assessment) -> None:
    job, path, results, sites = result.job, result.path, list(result.results), result.sites
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 132)
    console.print(f"[bold]Gradient[/] {job.params:.3g} params × {job.dtype} = "
                  f"{format_bytes(model.gradient_bytes(job.params, job.dtype))} per sync; "
                  f"{job.sites} sites × {job.gpus_per_site} GPUs")
    console.print(f"[bold]Path[/] a synchronous step waits for its slowest link: p99 RTT "
                  f"{path.rtt_s * 1e3:.1f} ms, loss {100 * path.loss:.3g} %, slowest peer's "
                  f"achievable rate {format_rate(path.flow_rate(1))} per flow, link "
                  f"{format_rate(path.link_bps)}")
    if sites:
        t = Table(title="candidate sites, best first", title_justify="left")
        for col in ("rank", "site", "p99 RTT", "rate/flow", "as-is step", "GPU idle", "idle $/day"):
            t.add_column(col)
        for site in sites:
            r0 = site.results[0]
            t.add_row(str(site.rank), site.candidate.name,
                      f"{site.candidate.path.rtt_s * 1e3:.1f} ms",
                      format_rate(r0.wan_rate_bps), _fmt_s(r0.step_time_s or r0.comm_time_s),
                      _pct(r0.gpu_idle_share),
                      "—" if r0.idle_cost_per_day is None else f"{r0.idle_cost_per_day:,.0f}")
        console.print(t)
    title = "strategies" + (" (job spanning all candidate sites)" if len(sites) > 1 else "")
    console.print(_table(title, results))
    for r in results:
        if r.note:
            console.print(f"  [dim]{r.name}: {r.note}[/]")
    _bar_chart(console, results, "step_time_s" if job.compute_s is not None else "comm_time_s")
    if job.compute_s is None:
        console.print("(no --compute-ms: step time, shares and idle cost need a compute time)")


def _inverse(job: model.Job, options: model.Options, utilization: float, rtt: str | None,
             report: list[FsPath] | None, as_json: bool) -> None:
    """``--target-utilization``: the WAN rate each strategy needs (models/impact_inverse.py)."""
    from wanprobe.models.impact_inverse import max_comm_s, needs

    if report:
        if rtt is not None:
            raise UsageError("--rtt comes from the report; give either --report or --rtt")
        rtt_s = _load_reports(report[:1], None)[0].path.rtt_s
    elif rtt is None:
        raise UsageError("--target-utilization needs --rtt (p99, e.g. 130ms) or --report")
    else:
        rtt_s = parse_duration_s(rtt, allow_zero=False, maximum_s=MAX_RTT_S)
    result = needs(job, rtt_s, utilization, options)
    if as_json:
        typer.echo(json.dumps({"target_utilization": utilization, "rtt_s": rtt_s,
                               "comm_budget_per_step_s": max_comm_s(job.compute_s, job.overlap,
                                                                    utilization),
                               "needs": [n.to_json() for n in result]}, indent=2))
        return
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 132)
    console.print(f"[bold]Target[/] {utilization:.0%} GPU utilisation with {job.compute_s * 1e3:g} ms "
                  f"compute per step: communication may take "
                  f"{_fmt_s(max_comm_s(job.compute_s, job.overlap, utilization))} per step "
                  f"(overlap {job.overlap:g}); p99 RTT {rtt_s * 1e3:.1f} ms")
    t = Table(title="WAN rate needed per strategy", title_justify="left")
    for col in ("strategy", "bytes/sync", "every", "budget/sync", "floor", "WAN rate needed"):
        t.add_column(col, justify="left" if col == "strategy" else "right", no_wrap=True)
    for n in result:
        t.add_row(n.name, format_bytes(n.bytes_per_sync), f"{n.syncs_every_steps} steps",
                  _fmt_s(n.comm_budget_per_sync_s), _fmt_s(n.comm_floor_s),
                  "unreachable (floor over budget)" if n.required_bits_per_second is None
                  else format_rate(n.required_bits_per_second))
    console.print(t)
    console.print("  [dim]floor: one sync at an infinite WAN rate (RTT/2 per collective step and "
                  "the local fabric); judge a window with `wanprobe fleet windows --bytes` "
                  "against the rate needed[/]")
