"""CLI commands: throughput (`wanprobe throughput HOST ...`)."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from wanprobe.commands.options import JsonDocument, Netns, ReflectorKeyFile, enter_netns
from wanprobe.errors import UsageError
from wanprobe.safe_text import SafeConsole as Console  # external text is data (issue 19)
from wanprobe.units import (
    format_bytes,
    format_rate,
    parse_bytes,
    parse_dscp,
    parse_duration_s,
    parse_port,
    parse_rate_bps,
)

# SO_SNDBUF/SO_RCVBUF take a C int that the kernel doubles (socket(7)); 1 GiB is also the largest
# tcp_rmem the sysctl tuner sets, so a bigger --window is a typo.
MAX_WINDOW_BYTES = 2**30


def _ms(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def render(result, console: Console) -> None:
    """Human summary of a ThroughputResult."""
    j = result.to_json()
    title = (f"{j['engine']} {j['protocol'].upper()} {j['mode']} to {j['peer']}:{j['port']}, "
             f"{j['streams_requested']} stream(s), cc {j['cc'] or '-'}")
    table = Table(title=title, show_lines=False)
    for col in ("interval s", "goodput", "retrans"):
        table.add_column(col, justify="right")
    for iv in j["intervals"]:
        rate = ("partial" if iv.get("partial") or iv["bits_per_second"] is None
                else format_rate(iv["bits_per_second"]))
        table.add_row(f"{iv['start_s']:.2f}-{iv['end_s']:.2f}", rate,
                      "-" if iv["retransmits"] is None else str(iv["retransmits"]))
    console.print(table)
    streams = Table(title="streams (sender TCP_INFO)")
    for col in ("id", "goodput", "sent", "retr", "rtt ms", "min rtt", "cwnd", "delivery"):
        streams.add_column(col, justify="right")
    for s in j["streams"]:
        t = s["tcp_info"] or {}
        dr = t.get("delivery_rate_bits_per_second")
        sid = f"{s['stream_id']}{'<' if s['direction'] == 'server_to_client' else ''}"
        streams.add_row(sid, format_rate(s["bits_per_second"]),
                        format_bytes(s["bytes_sent"]), str(s["retransmits"]), _ms(t.get("rtt_ms")),
                        _ms(t.get("min_rtt_ms")), str(t.get("cwnd_packets")),
                        "-" if dr is None else format_rate(dr))
    if j["protocol"] == "tcp":
        console.print(streams)
    omitted = (f" after the first {j['omit_s']:g} s (whole test "
               f"{format_rate(j['bits_per_second_with_ramp'])})"
               if j.get("omit_s") and j.get("bits_per_second_with_ramp") is not None else "")
    line = (f"[bold]receiver {format_rate(j['bits_per_second'])}[/]{omitted}, sender "
            f"{format_rate(j['sender_bits_per_second'])}, retransmits {j['retransmits']}")
    if j["bdp_bytes"]:
        line += (f", BDP {format_bytes(j['bdp_bytes'])} at min RTT {_ms(j['min_rtt_ms'])} ms "
                 f"(one stream needs a ~{format_bytes(j['single_stream_buffer_bytes'])} buffer)")
    console.print(line)
    if j["udp"]:
        u = j["udp"]
        console.print(f"UDP: received {format_rate(u['bits_per_second'])} of "
                      f"{format_rate(u['target_bits_per_second'])}, lost {u['lost_packets']}/"
                      f"{u['packets_sent']} ({u['lost_percent']:.3f} %), jitter {u['jitter_ms']:.3f} ms")
        if u.get("host_drop_events"):
            console.print(f"[yellow]the far end dropped {u['host_drop_events']} buffers itself "
                          f"(receive buffer {u.get('receiver_rcvbuf_bytes')} B): that loss is "
                          "the host's, not the path's, and the rate a lower bound[/]")
    if j["reverse"]:
        r = j["reverse"]
        console.print(f"reverse direction: receiver {format_rate(r['bits_per_second'])}, "
                      f"retransmits {r['retransmits']}")
    engine = _engine_line(j)
    if engine:
        console.print(engine, highlight=False)
    v = j["limited_by"]
    console.print(f"limited by: [bold]{v['verdict']}[/] - {v['summary']}")
    ev = {k: x for k, x in v["evidence"].items() if x is not None}
    console.print("  " + ", ".join(f"{k}={x}" for k, x in ev.items()), highlight=False)
    for note in j.get("notes") or ():
        console.print(f"[yellow]note: {note}[/]")
    if j["partial"]:
        console.print(f"[yellow]partial result: {j['partial_reason']}[/]")


def _engine_line(j: dict) -> str:
    """What ran and the engine's own CPU: per end, its data workers and cores, and CPU s/Gbit."""
    cpu = j.get("cpu") or {}
    parts = []
    for end in ("client", "server"):
        e = cpu.get(end)
        if isinstance(e, dict) and e.get("workers"):
            share = e.get("engine_cpu_share_ratio")
            parts.append(f"{end} {e['workers']} worker(s) on {e.get('cores')} core(s)"
                         + ("" if share is None else f", {share:.0%} of them"))
    per_gbit = cpu.get("engine_cpu_seconds_per_gigabit")
    if per_gbit is not None:
        parts.append(f"{per_gbit:.3f} CPU s/Gbit")
    version = j.get("engine_version")
    if not parts and not version:
        return ""
    return f"engine {version or j['engine']}" + (": " + "; ".join(parts) if parts else "")


app = typer.Typer()


@app.command("throughput")
def throughput(
    host: Annotated[str, typer.Argument(help="Peer running `wanprobe reflect` (or iperf3 -s).")],
    port: Annotated[str, typer.Option(help="Peer port (wanprobe 862; iperf3 engine 5201).")] = "862",
    duration: Annotated[str, typer.Option(help="Test length, e.g. 10s.")] = "10s",
    omit: Annotated[str, typer.Option(
        help="As iperf3 -O: run this much longer first and leave it (slow start) out of the "
             "rate and verdict, e.g. 2s.")] = "0s",
    streams: Annotated[int, typer.Option(help="Parallel TCP streams.")] = 1,
    reverse: Annotated[bool, typer.Option("--reverse", help="Peer sends, we receive.")] = False,
    bidir: Annotated[bool, typer.Option("--bidir", help="Both directions at once.")] = False,
    cc: Annotated[str | None, typer.Option(help="Congestion control: bbr, cubic, reno ...")] = None,
    window: Annotated[str | None, typer.Option(help="SO_SNDBUF/SO_RCVBUF on both ends, e.g. 256KiB.")] = None,
    dscp: Annotated[str, typer.Option(help="DSCP for the data, 0-63 or a name (EF, AF41).")] = "0",
    pacing_rate: Annotated[str | None, typer.Option(help="Per-stream SO_MAX_PACING_RATE, e.g. 500mbit.")] = None,
    udp: Annotated[bool, typer.Option("--udp", help="UDP at --rate instead of TCP.")] = False,
    rate: Annotated[str | None, typer.Option(help="UDP send rate, e.g. 100mbit.")] = None,
    interval: Annotated[str, typer.Option(help="Report interval, e.g. 1s.")] = "1s",
    engine: Annotated[str, typer.Option(help="wanprobe or iperf3.")] = "wanprobe",
    max_duration: Annotated[str, typer.Option(help="Refuse longer tests (cap).")] = "60s",
    max_bytes: Annotated[str, typer.Option(help="Stop after this many bytes (cap).")] = "10GiB",
    cpus: Annotated[int | None, typer.Option(
        help="Most cores this end's data path may use (default: every core it may run on).")] = None,
    as_json: JsonDocument = False,
    hmac_key_file: ReflectorKeyFile = None,
    netns: Netns = None,
) -> None:
    """Multi-stream TCP/UDP throughput test that says what limits the transfer."""
    from wanprobe.throughput.client import MAX_TEST_S
    from wanprobe.userfiles import read_hmac_key_file

    enter_netns(netns)  # first: the data workers and an iperf3 child are then born inside
    if engine not in ("wanprobe", "iperf3"):
        raise UsageError(f"unknown engine {engine!r} (use wanprobe or iperf3)")
    port_n = parse_port(port)
    if engine == "iperf3" and port == "862":
        port_n = 5201
    kwargs = dict(
        port=port_n, duration_s=parse_duration_s(duration, default_unit="s", allow_zero=False),
        streams=streams, reverse=reverse, bidir=bidir, cc=cc,
        window_bytes=parse_bytes(window, maximum=MAX_WINDOW_BYTES) if window else None,
        dscp=parse_dscp(dscp),
        pacing_rate_bps=parse_rate_bps(pacing_rate) if pacing_rate else None,
        udp=udp, udp_rate_bps=parse_rate_bps(rate) if rate else None,
        interval_s=parse_duration_s(interval, default_unit="s", allow_zero=False),
        engine=engine,
        max_duration_s=parse_duration_s(max_duration, default_unit="s", allow_zero=False,
                                        maximum_s=MAX_TEST_S),
        max_bytes=parse_bytes(max_bytes),
        hmac_key=read_hmac_key_file(hmac_key_file), cpus=cpus,
        omit_s=parse_duration_s(omit, default_unit="s", allow_zero=True, maximum_s=MAX_TEST_S))
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    result = _run(host, kwargs, err, quiet=as_json)
    if as_json:
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    else:
        render(result, Console(highlight=False))
    if result.partial:
        err.print(f"wanprobe: warning: partial result: {result.partial_reason}")
        raise typer.Exit(5)


def _run(host: str, kwargs: dict, err: Console, *, quiet: bool):
    """One test, with a progress bar on a terminal unless the output is JSON."""
    from wanprobe.diagnose.throughput_verdict import JUDGE
    from wanprobe.throughput.client import run_throughput

    if quiet or not err.is_terminal:
        return run_throughput(host, judge=JUDGE, **kwargs)
    with Progress(TextColumn("[bold]throughput[/]"), BarColumn(),
                  TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        total = kwargs["duration_s"] + kwargs["omit_s"]
        task = bar.add_task("test", total=total, rate="")

        def progress(elapsed_s: float, bps: float | None) -> None:
            bar.update(task, completed=min(elapsed_s, total),
                       rate="" if bps is None else format_rate(bps))

        return run_throughput(host, progress=progress, judge=JUDGE, **kwargs)
