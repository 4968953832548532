"""CLI command: ``wanprobe ring HOST HOST ...`` — a ring of hosts tested as a job's all-reduce
runs it (services/ring.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from wanprobe.commands.options import JsonDocument, ReflectorKeyFile
from wanprobe.errors import UsageError
from wanprobe.ring.model import RingResult
from wanprobe.safe_text import SafeConsole as Console  # external text is data (issue 19)
from wanprobe.units import format_rate, parse_duration_s, parse_port

app = typer.Typer()


def _rate(v: float | None) -> str:
    return "-" if v is None else format_rate(v)


def render(r: RingResult, console: Console) -> None:
    """The ring's figures: per edge together, alone, NCCL's view; the ring; the proposal."""
    table = Table(title=f"ring {' -> '.join(r.order)} (crosses between sites {r.crossings}x)")
    for col in ("edge", "WAN", "together", "alone", "slowest stream x n", "spread"):
        table.add_column(col, justify="right")
    for e in r.edges:
        table.add_row(f"{e.src} -> {e.dst}", "yes" if e.wan else "", _rate(e.bits_per_second),
                      _rate(e.alone_bits_per_second),
                      f"{_rate(e.min_stream_bits_per_second)} x {e.streams}",
                      "-" if e.stream_spread is None else f"{e.stream_spread:.0%}")
    console.print(table)
    console.print(f"[bold]ring rate {_rate(r.ring_bits_per_second)}[/] (its slowest edge = a ring "
                  f"all-reduce's bus bandwidth; NCCL's view, slowest stream x streams: "
                  f"{_rate(r.ring_nccl_bits_per_second)})")
    for group in r.shared_bottlenecks:
        edges = ", ".join(f"{a} -> {b}" for a, b in group)
        console.print(f"[yellow]shared bottleneck: {edges} (each well below its rate alone)[/]")
    if list(r.best_order) != list(r.order):
        console.print(f"proposed order {' -> '.join(r.best_order)} (crosses {r.best_crossings}x): "
                      f"[bold]{_rate(r.best_ring_bits_per_second)}[/] measured")
    else:
        console.print("the given order already crosses between sites as few times as possible")
    if r.node_ranks:
        console.print("launch ranks in this order: " + ", ".join(
            f"{h}={n}" for h, n in sorted(r.node_ranks.items(), key=lambda kv: kv[1])))
    for name, value in r.nccl.items():
        why = r.nccl_why.get(name)
        console.print(f"  {name}={value}" + (f"  # {why}" if why else ""), highlight=False)
    for note in r.notes:
        console.print(f"[yellow]note: {note}[/]")


@app.command("ring")
def ring(
    hosts: Annotated[list[str], typer.Argument(
        help="The ring's hosts in order, each running `wanprobe reflect --hmac-key-file K "
             "--allow <the others>`.")],
    hmac_key_file: ReflectorKeyFile = None,
    port: Annotated[str, typer.Option(help="The reflectors' port.")] = "862",
    duration: Annotated[str, typer.Option(help="Each run's length after the ramp-up.")] = "5s",
    omit: Annotated[str, typer.Option(help="Ramp-up left out of each rate (iperf3 -O).")] = "1s",
    streams: Annotated[int, typer.Option(help="TCP streams per edge (NCCL's sockets).")] = 4,
    site_rtt: Annotated[str, typer.Option(
        help="Hosts closer than this RTT are one site.")] = "5ms",
    best: Annotated[bool, typer.Option("--best/--no-best", help="Measure the proposed order "
                                       "too.")] = True,
    as_json: JsonDocument = False,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the JSON here "
                                                "(- for stdout).")] = None,
) -> None:
    """Test a ring of hosts as a training job's all-reduce runs it: every edge at once, each
    WAN edge alone, the shared bottlenecks, and the order (and NCCL settings) that carry more."""
    from wanprobe.services.ring import (
        MAX_EDGE_S,
        MAX_RING_HOSTS,
        MAX_STREAMS,
        RingOptions,
        run_ring,
    )
    from wanprobe.userfiles import check_output_path, read_hmac_key_file

    if len(hosts) > MAX_RING_HOSTS:
        raise UsageError(f"a ring of at most {MAX_RING_HOSTS} hosts, got {len(hosts)}")
    if not 1 <= streams <= MAX_STREAMS:
        raise UsageError(f"--streams must be 1-{MAX_STREAMS} (NCCL's socket limit), "
                         f"got {streams}")
    if output is not None:
        check_output_path(output, "--output")
    opts = RingOptions(
        hosts=tuple(hosts), port=parse_port(port),
        duration_s=parse_duration_s(duration, default_unit="s", allow_zero=False,
                                    maximum_s=MAX_EDGE_S),
        omit_s=parse_duration_s(omit, default_unit="s", allow_zero=True, maximum_s=10.0),
        streams=streams,
        site_rtt_ms=parse_duration_s(site_rtt, default_unit="ms", allow_zero=False,
                                     maximum_s=10.0) * 1e3,
        measure_best=best)
    key = read_hmac_key_file(hmac_key_file)
    if key is None:
        raise UsageError("ring needs --hmac-key-file: a reflector sends to another host only "
                         "for an authenticated request")
    opts = replace(opts, hmac_key=key)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    result = run_ring(opts, None if as_json else (lambda m: err.print(f"ring: {m}")))
    text = json.dumps(result.to_json(), indent=2) + "\n"
    if output is not None:
        from wanprobe.atomic_file import write_output

        write_output(output, text)
    if as_json:
        typer.echo(text, nl=False)
    elif str(output) != "-":
        render(result, Console(highlight=False))
