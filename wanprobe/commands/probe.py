"""CLI commands: ``reflect`` (STAMP reflector + throughput server), ``probe`` and ``mtu``."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from wanprobe.commands.options import JsonObject, Netns, ReflectorKeyFile, ReplyTimeout, enter_netns
from wanprobe.errors import UsageError, shown
from wanprobe.probe.peer import no_reply, numeric_family, session_refused
from wanprobe.probe.session_table import MAX_SESSIONS, PER_SOURCE
from wanprobe.safe_text import SafeConsole as Console  # external text is data (issue 19)
from wanprobe.units import dscp_name, parse_bytes, parse_dscp, parse_duration_s, parse_port
from wanprobe.userfiles import read_hmac_key_file

if TYPE_CHECKING:
    from wanprobe.services.reflect import ReflectService

DEFAULT_PORT = "862"
PROGRESS_MIN_S = 3.0

app = typer.Typer()


def _opt(option: str, parse, *args, **kw):
    """Run a units parser and name the option in its error message."""
    try:
        return parse(*args, **kw)
    except UsageError as exc:
        raise UsageError(f"{option}: {exc}") from None


MAX_REFLECT_PPS = 10_000_000  # per source; one core reflects a few hundred thousand


@app.command("reflect")
def reflect(
    bind: Annotated[str, typer.Option("--bind", help="Address to listen on (:: for IPv6).")] = "0.0.0.0",
    port: Annotated[str, typer.Option("--port", help="UDP (STAMP) and TCP (throughput) port.")] = DEFAULT_PORT,
    max_test_duration: Annotated[str, typer.Option(
        "--max-test-duration", help="Longest throughput test a client may run, e.g. 60s.")] = "60s",
    max_test_bytes: Annotated[str, typer.Option(
        "--max-test-bytes", help="Most bytes one throughput test may move, e.g. 10GiB.")] = "10GiB",
    rate_pps: Annotated[str, typer.Option(
        "--rate-limit", help="STAMP replies per second per source address.")] = "5000",
    hmac_key_file: Annotated[str | None, typer.Option(
        "--hmac-key-file", help="Authenticated STAMP (RFC 8762 §4.4): read the shared key from "
        "this file (>= 16 characters); unauthenticated probes are then dropped and throughput "
        "clients must prove they hold the key.")] = None,
    allow: Annotated[list[str] | None, typer.Option(
        "--allow", help="Serve only sources in this network, e.g. 198.18.0.0/15 (repeatable; "
        "default: everyone). Others are dropped unparsed.")] = None,
    cos_dscp: Annotated[list[str] | None, typer.Option(
        "--cos-dscp", help="DSCP a Class-of-Service TLV may ask replies to carry, and a "
        "throughput test its streams, and any reply carry (repeatable; default: any but "
        "network control, 48-63).")] = None,
    sessions_per_source: Annotated[int, typer.Option(
        "--sessions-per-source", min=1, max=MAX_SESSIONS, help="STAMP sessions one source "
        f"address may hold (default {PER_SOURCE:,} of {MAX_SESSIONS:,}); raise it only for a "
        "reflector that stands in for many peers of one prober, as the benches do.")] = PER_SOURCE,
) -> None:
    """Run a STAMP (RFC 8762/8972) / TWAMP-Light reflector and the throughput server."""
    from wanprobe.probe.access import DEFAULT_COS_DSCP, parse_cidrs, parse_dscp_set
    from wanprobe.services.reflect import ReflectPolicy, ReflectService
    from wanprobe.throughput.client import MAX_TEST_S
    from wanprobe.throughput.limits import ServerLimits

    if numeric_family(bind) is None:
        raise UsageError(f"--bind {shown(bind)} is not an IP address (e.g. 0.0.0.0 or ::)")
    key = read_hmac_key_file(hmac_key_file)
    allow_cidrs = parse_cidrs(allow or ())
    permitted = parse_dscp_set(cos_dscp) if cos_dscp else DEFAULT_COS_DSCP
    port_n = _opt("--port", parse_port, port)
    duration_s = _opt("--max-test-duration", parse_duration_s, max_test_duration,
                      default_unit="s", allow_zero=False, maximum_s=MAX_TEST_S)
    max_bytes = _opt("--max-test-bytes", parse_bytes, max_test_bytes)
    try:
        rate = float(rate_pps) if len(rate_pps) <= 32 else math.nan
    except ValueError:
        rate = math.nan
    if not 0 < rate <= MAX_REFLECT_PPS:
        raise UsageError(f"--rate-limit {shown(rate_pps)} must be a number > 0 and at most the "
                         f"limit of {MAX_REFLECT_PPS:,} replies per second")
    policy = ReflectPolicy(allow=allow_cidrs, cos_dscp=permitted,
                           sessions_per_source=sessions_per_source, rate_pps=rate)
    limits = replace(ServerLimits(), max_duration_s=duration_s, max_bytes_per_test=max_bytes)
    asyncio.run(_serve(bind, port_n, ReflectService(key, policy, limits)))


async def _serve(bind: str, port: int, service: ReflectService) -> None:
    """Run ``service`` on (bind, port) until SIGTERM/SIGINT; then one line of what it refused."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    authenticated = service.hmac_key is not None
    allowed = service.policy.allow
    try:
        await service.start(((bind, port),))
        err = Console(stderr=True, highlight=False)
        mode = (" (authenticated mode)" if authenticated else "") + (
            f", allowing {', '.join(allowed)}" if allowed else "")
        err.print(f"wanprobe reflect: STAMP on udp {bind}:{port}{mode}, "
                  f"throughput on tcp {bind}:{port}")
        await stop.wait()
    finally:
        stats, refusals = service.stats(), service.throughput_refusals()
        await service.close()
    s = stats[0]   # started on one address: one reflector
    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"wanprobe reflect: stopped; {s.reflected} reflected, {s.short + s.oversize} short/oversize,"
        f" {s.malformed} malformed, {s.rate_limited} rate-limited, {s.session_refused} new "
        f"sessions refused (no room they could take; {s.refusals_answered} told so), "
        f"{s.reclaimed} taken from the largest source's share"
        + (f", {s.auth_failed} failed authentication, {s.replayed} replays refused"
           if authenticated else "")
        + f", {s.not_allowed} from outside --allow; throughput refusals: "
        + (", ".join(f"{k} {v}" for k, v in sorted(refusals.items())) or "none"))


@app.command("probe")
def probe(
    host: Annotated[str, typer.Argument(help="Peer to probe (name or address).")],
    port: Annotated[str, typer.Option("--port", help="STAMP or TCP port.")] = DEFAULT_PORT,
    count: Annotated[int | None, typer.Option("--count", "-c", help="Number of probes.")] = None,
    duration: Annotated[str | None, typer.Option("--duration", help="Probe for this long, e.g. 30s.")] = None,
    interval: Annotated[str, typer.Option("--interval", "-i", help="Time between probes, e.g. 100ms.")] = "1s",
    size: Annotated[str | None, typer.Option("--size", help="IP packet size in bytes.")] = None,
    dscp: Annotated[str, typer.Option("--dscp", help="DSCP: 0-63 or a name (EF, AF31).")] = "0",
    method: Annotated[str, typer.Option("--method", help="stamp, icmp or tcp.")] = "stamp",
    timeout: ReplyTimeout = "2s",
    as_json: JsonObject = False,
    hmac_key_file: ReflectorKeyFile = None,
    netns: Netns = None,
    flows: Annotated[int, typer.Option("--flows", help="Spread the probes over this many source "
                                       "ports (ECMP flows; STAMP only), results per path.")] = 1,
    above_limit: Annotated[str, typer.Option(
        "--above-limit", help="A rate above the limit a wanprobe reflector advertises: pace "
        "(to 80% of it), refuse, or send (its drops are counted apart from path loss).")] = "pace",
) -> None:
    """Measure RTT, loss per direction, jitter, reordering and DSCP treatment to HOST."""
    from wanprobe.probe.api import METHODS
    from wanprobe.probe.rate_guard import annotate, check_policy, checked_rate

    enter_netns(netns)  # first: every socket, thread and resolver lookup is then inside
    if method not in METHODS:
        raise UsageError(f"unknown --method {method!r} (use stamp, icmp or tcp)")
    key = read_hmac_key_file(hmac_key_file)
    if key is not None and method != "stamp":
        raise UsageError("--hmac-key-file needs --method stamp")
    kw = _probe_kwargs(port=port, count=count, duration=duration, interval=interval, size=size,
                       dscp=dscp, timeout=timeout, key=key)
    policy = check_policy(above_limit)
    if flows != 1:
        from wanprobe.commands.paths import probe_over_flows
        return probe_over_flows(host, flows, method, kw, as_json, policy)
    plan = None
    if method == "stamp":
        plan = checked_rate(host, kw, policy, 1 / kw["interval_s"],
                            say=Console(stderr=True, highlight=False, soft_wrap=True).print)
        kw["interval_s"] = plan.interval_s
    result = _run(host, method, kw, quiet=as_json)
    doc = annotate(result.to_json(), plan, 1 / kw["interval_s"]) if method == "stamp" \
        else result.to_json()
    if as_json:
        sys.stdout.write(json.dumps(doc) + "\n")
    else:
        _print_probe(result)
        if doc.get("reflector") and doc["reflector"].get("note"):
            Console(highlight=False).print(doc["reflector"]["note"])
    if result.loss.reflector_session_refused:   # the reflector said no: exit 8, not loss
        raise session_refused(host, kw["port"], result.loss.reflector_session_refused,
                              result.loss.sent)
    if result.loss.sent and not result.loss.received:  # as ping(8): exit 1 when nothing answered
        raise no_reply(host, method, kw)


def _probe_kwargs(*, port: str, count: int | None, duration: str | None, interval: str,
                  size: str | None, dscp: str, timeout: str, key: bytes | None) -> dict:
    """The probe API's keyword arguments from the command line's (errors name the option)."""
    from wanprobe.probe.limits import MAX_DATAGRAM_BYTES

    kw = dict(
        port=_opt("--port", parse_port, port), count=count,
        duration_s=(_opt("--duration", parse_duration_s, duration, default_unit="s",
                         allow_zero=False) if duration else None),
        interval_s=_opt("--interval", parse_duration_s, interval, default_unit="s",
                        allow_zero=False),
        size=(_opt("--size", parse_bytes, size, maximum=MAX_DATAGRAM_BYTES)
              if size is not None else None),
        dscp=_opt("--dscp", parse_dscp, dscp),
        timeout_s=_opt("--timeout", parse_duration_s, timeout, default_unit="s", allow_zero=False),
    )
    if key is not None:
        kw["hmac_key"] = key
    if count is not None and count < 1:
        raise UsageError(f"--count must be >= 1 (got {count})")
    if count is not None and duration:
        raise UsageError("give either --count or --duration, not both")
    return kw


def _run(host: str, method: str, kw: dict, *, quiet: bool):
    """One probe run, with a progress bar on a terminal when it takes a while."""
    from wanprobe.probe.api import probe as run

    expected_s = (kw["duration_s"] if kw["duration_s"] else (kw["count"] or 10) * kw["interval_s"])
    err = Console(stderr=True, highlight=False)
    if quiet or expected_s < PROGRESS_MIN_S or not err.is_terminal:
        return asyncio.run(run(host, method, **kw))
    with Progress(TextColumn(f"probing {host} ({method})"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[rx]} replies"), TimeRemainingColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("probe", total=None, rx=0)

        def progress(sent: int, received: int, total: int) -> None:
            bar.update(task, completed=sent, total=total, rx=received)

        return asyncio.run(run(host, method, on_progress=progress, **kw))


def _fmt(x, unit: str = "", digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}{unit}"


def _print_probe(r) -> None:
    from wanprobe.probe.owd import text_rows as owd_rows

    out = Console(highlight=False)
    t = Table(title=f"{r.method} probe to {r.peer}" + (f" port {r.port}" if r.port else ""),
              show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    j = r.to_json()
    for k in ("min", "p50", "p90", "p99", "max", "mean", "stdev"):
        t.add_row(f"rtt {k}", _fmt(j["rtt_ms"][k], " ms"))
    loss = r.loss
    lo, hi = loss.ci95
    t.add_row("sent / received", f"{loss.sent} / {loss.received}")
    t.add_row("loss", f"{loss.ratio:.3%}  (95% CI {lo:.3%}-{hi:.3%})")
    t.add_row("loss forward", "-" if loss.forward_ratio is None else f"{loss.forward_ratio:.3%}")
    t.add_row("loss reverse", "-" if loss.reverse_ratio is None else f"{loss.reverse_ratio:.3%}")
    t.add_row("jitter (IPDV)", _fmt(r.jitter_ms, " ms"))
    for label, value in owd_rows(r.owd):   # one-way delay per direction and its clock bound
        t.add_row(label, value)
    t.add_row("reordered / duplicates", f"{r.reordered} / {r.duplicates}")
    d = r.dscp

    def name(v):
        return "-" if v is None else f"{dscp_name(v)} ({v})"

    t.add_row("dscp sent / at reflector / returned",
              f"{name(d.sent)} / {name(d.at_reflector)} / {name(d.returned)}")
    t.add_row("dscp bleached", d.bleached or "unknown")
    t.add_row("started", r.started_at)
    out.print(t)


@app.command("mtu")
def mtu(
    host: Annotated[str, typer.Argument(help="Peer running a STAMP reflector.")],
    port: Annotated[str, typer.Option("--port", help="STAMP port.")] = DEFAULT_PORT,
    timeout: Annotated[str | None, typer.Option(
        "--timeout", help="Wait per try (default: 3x the measured RTT + 50 ms).")] = None,
    tries: Annotated[int, typer.Option("--tries", min=1, max=100,
                                       help="Tries per size before it counts as lost.")] = 3,
    as_json: JsonObject = False,
    hmac_key_file: ReflectorKeyFile = None,
    netns: Netns = None,
) -> None:
    """Find the path MTU to HOST by DF-bit search (works through ICMP black holes)."""
    from wanprobe.probe.limits import MAX_TIMEOUT_S
    from wanprobe.probe.mtu import probe_path_mtu

    enter_netns(netns)  # first: the local MTU and the route are the namespace's
    port_n = _opt("--port", parse_port, port)
    timeout_s = (_opt("--timeout", parse_duration_s, timeout, default_unit="s", allow_zero=False,
                      maximum_s=MAX_TIMEOUT_S) if timeout else None)
    if tries < 1:
        raise UsageError("--tries must be >= 1")
    key = read_hmac_key_file(hmac_key_file)
    result = asyncio.run(probe_path_mtu(host, port=port_n, timeout_s=timeout_s, tries=tries,
                                        hmac_key=key))
    if as_json:
        sys.stdout.write(json.dumps(result.to_json()) + "\n")
        return
    Console(highlight=False).print(
        f"path MTU to {host}: [bold]{result.path_mtu}[/] bytes (local MTU {result.local_mtu}; "
        f"{result.found_by}; {len(result.steps)} sizes tried)")
