"""What ``wanprobe impact`` prints: the strategies (the as-is baseline and the best few
combinations), the candidate sites, the WAN rate each combination needs, and the plan per hour
of the week. JSON documents are built by the models; this module only draws."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from wanprobe.models import impact as model
from wanprobe.models import strategy
from wanprobe.models.impact_inverse import Need
from wanprobe.models.impact_sites import Assessment
from wanprobe.models.plan_hours import HourPlan
from wanprobe.safe_text import SafeConsole as Console  # external text is data (issue 19)
from wanprobe.units import format_bytes, format_rate


def console() -> Console:
    return Console(highlight=False, width=None if sys.stdout.isatty() else 132)


def fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.1f} ms"


def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _cost(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def strategy_table(title: str, results: Sequence[model.StrategyResult]) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("strategy", "WAN rate", "bytes/sync", "one sync", "comm/step", "hidden/step",
                "step", "GPU idle", "idle $/day"):
        t.add_column(col, justify="left" if col == "strategy" else "right",
                     no_wrap=col != "strategy")
    for r in results:
        t.add_row(r.name, format_rate(r.wan_rate_bps), format_bytes(r.bytes_per_sync),
                  fmt_s(r.sync_time_s), fmt_s(r.comm_time_s), fmt_s(r.hidden_comm_s),
                  fmt_s(r.step_time_s), pct(r.gpu_idle_share), _cost(r.idle_cost_per_day))
    return t


def bar_chart(out: Console, results: Sequence[model.StrategyResult], key: str) -> None:
    values = [(r.name, getattr(r, key)) for r in results]
    top = max(v for _, v in values) or 1.0
    width = 40
    out.print(f"[bold]{'step time' if key == 'step_time_s' else 'comm time'} by strategy[/]")
    for name, v in values:
        n = max(1, round(width * v / top)) if v > 0 else 0
        out.print(f"  {'█' * n}{' ' * (width - n)} {fmt_s(v):>9}  {name}")


def render(result: Assessment, top: int) -> None:
    job, path, sites = result.job, result.path, result.sites
    out = console()
    out.print(f"[bold]Gradient[/] {job.params:.3g} params × {job.dtype} = "
              f"{format_bytes(model.gradient_bytes(job.params, job.dtype))} per sync; "
              f"{job.sites} sites × {job.gpus_per_site} GPUs")
    out.print(f"[bold]Path[/] a synchronous step waits for its slowest link: p99 RTT "
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
                      format_rate(r0.wan_rate_bps), fmt_s(r0.step_time_s or r0.comm_time_s),
                      pct(r0.gpu_idle_share), _cost(r0.idle_cost_per_day))
        out.print(t)
    results = list(result.results)
    title = (f"strategies: as-is and the best {top} of {len(results) - 1} combinations"
             + (" (job spanning all candidate sites)" if len(sites) > 1 else ""))
    rows = strategy.shown(results, top)
    out.print(strategy_table(title, rows))
    if result.more_bandwidth is not None:
        m = result.more_bandwidth
        out.print(f"  more bandwidth: {m.name}: step {fmt_s(m.step_time_s or m.comm_time_s)}, "
                  f"GPU idle {pct(m.gpu_idle_share)}")
    out.print(f"  [dim]components: tuning (as-is / tuned hosts), topology (flat ring / "
              f"hierarchical), dtype, top-k, sync every H steps, streamed; --json lists all "
              f"{len(results)}. {strategy.CAVEAT}[/]")
    bar_chart(out, rows, "step_time_s" if job.compute_s is not None else "comm_time_s")
    if job.compute_s is None:
        out.print("(no --compute-ms: step time, shares and idle cost need a compute time)")


def render_needs(job: model.Job, doc: dict[str, Any], needs: Sequence[Need], top: int) -> None:
    out = console()
    out.print(f"[bold]Target[/] {doc['target_utilization']:.0%} GPU utilisation with "
              f"{job.compute_s * 1e3 if job.compute_s else 0:g} ms compute per step: "
              f"communication may take {fmt_s(doc['comm_budget_per_step_s'])} per step "
              f"(overlap {job.overlap:g}); p99 RTT {doc['rtt_s'] * 1e3:.1f} ms")
    t = Table(title=f"WAN rate needed: as-is and the {top} least demanding of "
                    f"{len(needs) - 1} combinations", title_justify="left")
    for col in ("strategy", "bytes/sync", "every", "budget/sync", "floor", "WAN rate needed"):
        t.add_column(col, justify="left" if col == "strategy" else "right",
                     no_wrap=col != "strategy")
    for n in [needs[0], *needs[1:top + 1]]:
        t.add_row(n.name, format_bytes(n.bytes_per_sync), f"{n.syncs_every_steps} steps",
                  fmt_s(n.comm_budget_per_sync_s), fmt_s(n.comm_floor_s),
                  "unreachable (floor over budget)" if n.required_bits_per_second is None
                  else format_rate(n.required_bits_per_second))
    out.print(t)
    out.print("  [dim]floor: one sync at an infinite WAN rate (RTT/2 per collective step and "
              "the local fabric); judge a window with `wanprobe fleet windows --bytes` "
              "against the rate needed[/]")


def render_hours(plans: Sequence[HourPlan], summary: dict[str, Any], source: dict[str, Any],
                 utilization: float) -> None:
    out = console()
    most = summary["most_hours"]
    out.print(f"[bold]Plan by hour of the week[/] (UTC; capacity from {source.get('kind')}: "
              f"goodput p10 / p50 of the scheduled throughput tests; each hour planned on its "
              f"p10). {summary['hours_planned']} hours measured; best in {most['hours']} of "
              f"them: {most['name']}")
    t = Table(title="hours with a throughput test", title_justify="left")
    for col in ("hour", "tests", "p10 / p50", "best plan (at p10)", "step", "GPU idle",
                "idle $/day", "at p50", f"needs for {utilization:.0%}"):
        t.add_column(col, justify="left" if col.startswith(("hour", "best")) else "right",
                     no_wrap=not col.startswith("best"))
    for p in plans:
        h = p.hour
        t.add_row(h.label, str(h.samples), f"{format_rate(h.p10_bits_per_second or 0)} / "
                  f"{format_rate(h.p50_bits_per_second or 0)}", p.best.name,
                  fmt_s(p.best.step_time_s), pct(p.best.gpu_idle_share),
                  _cost(p.best.idle_cost_per_day), fmt_s(p.at_p50.step_time_s),
                  "unreachable" if p.bandwidth_needed_bps is None
                  else format_rate(p.bandwidth_needed_bps))
    out.print(t)
    w = summary["worst_hour"]
    out.print(f"  worst hour {w['label']}: {w['name']}, step {fmt_s(w['step_time_s'])}, GPU idle "
              f"{pct(w['gpu_idle_share'])} at {format_rate(w['p10_bits_per_second'] or 0)}")
    out.print(f"  [dim]{strategy.CAVEAT}[/]")
