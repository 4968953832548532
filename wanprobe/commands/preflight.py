"""CLI: ``wanprobe preflight --hosts FILE`` — go / no-go for a job's hosts, with NCCL settings."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from wanprobe.commands.options import JsonDocument
from wanprobe.errors import UsageError
from wanprobe.safe_text import SafeConsole, clean_lines

app = typer.Typer()

MAX_HOSTS_LIMIT = 4096
MAX_BOUND_S = 600.0
DEFAULT_HISTORY = "/var/lib/wanprobe/history.sqlite3"


def _parsed(option: str, fn, text: str, **kw):
    try:
        return fn(text, **kw)
    except UsageError as exc:
        raise UsageError(f"{option}: {exc}") from None


@app.command("preflight")
def preflight(
    hosts: Annotated[str, typer.Option("--hosts", help="The job's hosts: one host or host:port "
                                       "per line, Slurm ranges (gpu[01-64]) and hostfile lines "
                                       "(host slots=8) accepted; - reads stdin.")],
    timeout: Annotated[str, typer.Option("--timeout", help="Bound on the whole run, whatever "
                                         "the hosts do.")] = "30s",
    count: Annotated[int, typer.Option("--count", help="Probes per host.")] = 200,
    interval: Annotated[str, typer.Option("--interval", help="Time between one host's probes "
                                          "(stretched so all hosts together stay under 10,000/s).")] = "10ms",
    reply_timeout: Annotated[str, typer.Option("--reply-timeout", help="A reply later than this "
                                               "is lost.")] = "1s",
    loss_slo: Annotated[str | None, typer.Option("--loss-slo", help="Round-trip loss above this "
                                                 "is no-go (default: the fleet rules' SLO, 1%).")] = None,
    rtt_slo: Annotated[str | None, typer.Option("--rtt-slo", help="Median RTT above this is "
                                                "no-go (default: not judged).")] = None,
    rate: Annotated[str | None, typer.Option("--rate", help="What the job needs per host, e.g. "
                                             "25gbit: buffers are judged against it where the "
                                             "path carries more.")] = None,
    link_rate: Annotated[str | None, typer.Option(
        "--link-rate", help="What the paths carry, e.g. 10gbit, for hosts without a measured "
        "figure (the local daemon's throughput tests the path limited); never the NIC speed.")] = None,
    hmac_key_file: Annotated[str | None, typer.Option(
        "--hmac-key-file", help="The reflectors' shared key: authenticated STAMP and host facts.")] = None,
    history: Annotated[str, typer.Option("--history", help="The local daemon's history "
                                         "(reroutes in the last hour), if one runs.")] = DEFAULT_HISTORY,
    mesh: Annotated[str | None, typer.Option("--mesh", help="Mesh file: host names resolve to "
                                             "their mesh addresses (before DNS), and their sites "
                                             "give cross-datacenter NCCL settings.")] = None,
    nccl_version: Annotated[str, typer.Option("--nccl-version", help="NCCL release the job uses.")] = "2.21",
    max_hosts: Annotated[int, typer.Option("--max-hosts", help=f"Refuse longer lists (at most "
                                           f"{MAX_HOSTS_LIMIT}).")] = 1024,
    as_json: JsonDocument = False,
) -> None:
    """Probe every host of a job in parallel and say go / no-go per host with the reasons;
    exit 0 only when all are go."""
    started = time.monotonic()
    from wanprobe.preflight.run import preflight as run
    from wanprobe.userfiles import read_text

    opts = _options(timeout=timeout, count=count, interval=interval, reply_timeout=reply_timeout,
                    loss_slo=loss_slo, rtt_slo=rtt_slo, rate=rate, link_rate=link_rate,
                    hmac_key_file=hmac_key_file, history=history, mesh=mesh,
                    nccl_version=nccl_version, max_hosts=max_hosts)
    text = sys.stdin.read(16 * 2**20) if hosts == "-" else read_text(hosts, "host list", 16 * 2**20)
    doc = run(text, opts, started)
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
    else:
        _print(doc)
    if not doc["go"]:
        raise typer.Exit(1)


def _options(*, timeout: str, count: int, interval: str, reply_timeout: str,
             loss_slo: str | None, rtt_slo: str | None, rate: str | None,
             link_rate: str | None, hmac_key_file: str | None, history: str,
             mesh: str | None, nccl_version: str, max_hosts: int):
    """The run's options from the command line's, each checked (errors name the option)."""
    from tuners.nccl_env import parse_nccl_version
    from wanprobe.fleet.rules import RuleSettings
    from wanprobe.preflight.judge import Thresholds
    from wanprobe.preflight.measure import ProbePlan
    from wanprobe.preflight.run import PreflightOptions
    from wanprobe.probe import limits
    from wanprobe.units import parse_duration_ms, parse_duration_s, parse_rate_bps, parse_ratio
    from wanprobe.userfiles import check_path_text, read_hmac_key_file

    bound_s = _parsed("--timeout", parse_duration_s, timeout, default_unit="s",
                      allow_zero=False, maximum_s=MAX_BOUND_S)
    interval_s = _parsed("--interval", parse_duration_s, interval, default_unit="s",
                         allow_zero=False, maximum_s=1.0)
    reply_s = _parsed("--reply-timeout", parse_duration_s, reply_timeout, default_unit="s",
                      allow_zero=False, maximum_s=limits.MAX_TIMEOUT_S)
    if not 1 <= count <= 10_000:
        raise UsageError(f"--count must be 1-10000, got {count}")
    if not 1 <= max_hosts <= MAX_HOSTS_LIMIT:
        raise UsageError(f"--max-hosts must be 1-{MAX_HOSTS_LIMIT}, got {max_hosts}")
    rules = RuleSettings()
    th = Thresholds(
        loss_slo_ratio=rules.loss_slo_ratio if loss_slo is None else
        _parsed("--loss-slo", parse_ratio, loss_slo),
        rtt_slo_ms=None if rtt_slo is None else _parsed("--rtt-slo", parse_duration_ms, rtt_slo,
                                                        allow_zero=False),
        rate_bps=None if rate is None else _parsed("--rate", parse_rate_bps, rate),
        floor_step_ratio=rules.floor_step_ratio, floor_step_min_ms=rules.floor_step_min_s * 1e3,
        link_rate_bps=None if link_rate is None else _parsed("--link-rate", parse_rate_bps,
                                                             link_rate))
    return PreflightOptions(
        plan=ProbePlan(count=count, interval_s=interval_s, timeout_s=reply_s,
                       hmac_key=read_hmac_key_file(hmac_key_file)),
        thresholds=th, bound_s=bound_s, max_hosts=max_hosts,
        history=check_path_text(history, "--history"), history_window_s=rules.floor_baseline_s,
        capacity_window_s=rules.throughput_baseline_s,
        mesh=Path(mesh) if mesh else None, nccl_version=parse_nccl_version(nccl_version))


# Off a terminal the table is as wide as its longest row: rich would otherwise fold every line
# at 80 columns (or $COLUMNS) into a file or a pipe.
UNWRAPPED_WIDTH = 10_000


def _print(doc: dict) -> None:
    """The table, the notes and the NCCL settings for people. Nothing is wrapped when stdout is
    not a terminal, and the NCCL lines are written as they are, never through rich: a folded
    ``# reason`` line in a file a shell sources runs its second half as a command. Text from
    hosts and files is data (``Text``, not markup; SafeConsole escapes control characters)."""
    tty = sys.stdout.isatty()
    console = SafeConsole(highlight=False, soft_wrap=True, width=None if tty else UNWRAPPED_WIDTH)
    table = Table("host", "go", "rtt p50 ms", "loss", "reasons",
                  title=f"preflight: {'GO' if doc['go'] else 'NO-GO'} "
                        f"({doc['elapsed_s']:.1f} s of {doc['bound_s']:g} s)")
    for h in doc["hosts"]:
        rtt = (h.get("rtt_ms") or {}).get("p50")
        loss = h.get("loss_ratio")
        table.add_row(Text(h["host"]), Text("go", style="green") if h["go"] else
                      Text("no-go", style="bold red"),
                      "-" if rtt is None else f"{rtt:.2f}",
                      "-" if loss is None else f"{loss * 100:.2f}%",
                      Text("\n".join(f"{r['code']}: {r['text']}" for r in h["reasons"])))
    console.print(table)
    for note in doc["notes"] + doc["nccl_env"]["notes"]:
        console.print(Text(f"note: {note}"))
    typer.echo(clean_lines(doc["nccl_env"]["text"]), nl=False)
