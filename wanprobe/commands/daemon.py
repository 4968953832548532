"""CLI commands: ``wanprobe daemon`` (run, or check the config) and ``wanprobe history PEER``."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from wanprobe import units
from wanprobe.commands import windows_view as views
from wanprobe.daemon.config import DEFAULT_CONFIG_PATH
from wanprobe.errors import ConfigInvalid, UsageError, one_line, shown
from wanprobe.safe_text import SafeConsole as Console  # external text is data (issue 19)
from wanprobe.safe_text import clean
from wanprobe.userfiles import check_path_text

err_console = Console(stderr=True, highlight=False, soft_wrap=True)
ROW_FORMATS = ("text", "json", "html")   # the rows; --windows takes views.FORMATS
app = typer.Typer()


MAX_PROBLEM_LINES = 3
MAX_PEERS_SHOWN = 20  # `daemon --check` names this many peers, then counts the rest


def _print_problems(exc: ConfigInvalid) -> None:
    """One line per bad key, so each is greppable in the journal; past three, the third line
    names the rest by key."""
    problems = exc.problems
    if len(problems) > MAX_PROBLEM_LINES:
        rest = problems[MAX_PROBLEM_LINES - 1:]
        keys = ", ".join(p.split(":")[0] for p in rest)
        problems = problems[:MAX_PROBLEM_LINES - 1] + [f"and {len(rest)} more bad keys: {keys}"]
    for problem in problems:
        err_console.print(f"[bold red]wanprobe: error:[/] "
                          f"{escape(one_line(f'{exc.source}: {problem}'))}", markup=True)


@app.command("daemon")
def daemon(
    config: Annotated[Path, typer.Option("--config", "-c", help="TOML configuration file.")] = DEFAULT_CONFIG_PATH,
    check: Annotated[bool, typer.Option("--check", help="Validate the config (and mesh file), "
                                        "print the peers it selects, and exit.")] = False,
    check_plan: Annotated[bool, typer.Option("--check-plan", help="Exit 0 only if the "
                                             "auto-apply plan is signed off and whitelisted "
                                             "(for wanprobe-tune.service's ExecCondition).")] = False,
    web_config_file: Annotated[Path | None, typer.Option(
        "--web-config-file", help="The listener's TLS and basic auth (exporter-toolkit web "
        "config YAML, as node_exporter's --web.config.file); replaces daemon.web_config_file.")] = None,
) -> None:
    """Run the measurement daemon: reflector, mesh probing, counters, history, /metrics.

    SIGHUP reloads (a bad config is refused and the running one stays); SIGTERM stops; speaks
    sd_notify to systemd (Type=notify, watchdog)."""
    from wanprobe.daemon import main as dmain
    from wanprobe.daemon.auto_apply import check_plan as gate
    from wanprobe.daemon.runtime import check_runtime

    try:
        if check_plan:  # root's ExecCondition: never writes into the daemon's state dir
            cfg, _ = dmain.load_runtime(config)
            changes = gate(cfg.auto_apply)
            typer.echo(f"plan {cfg.auto_apply.plan}: signed off, {len(changes)} changes, "
                       f"tuners {', '.join(sorted({c['tuner'] for c in changes})) or '-'}")
            return
        if check:  # the same checks as SIGHUP's reload (runtime.check_runtime)
            cfg, peers, web = check_runtime(config, web_config_file)
            shown_peers = [f"{p.name}={p.address}" + (f" ({p.site})" if p.site else "")
                           for p in peers[:MAX_PEERS_SHOWN]]
            more = len(peers) - len(shown_peers)
            typer.echo(clean(f"{config}: ok, host {cfg.hostname} in site {cfg.site or '-'}, "
                             f"{len(peers)} peers: " + ", ".join(shown_peers)
                             + (f", and {more} more" if more > 0 else "")))
            _warn_unscrapable(cfg)
            typer.echo(f"listener {cfg.metrics_listen[0]}:{cfg.metrics_listen[1]}: "
                       + web.describe()
                       + (f" ({cfg.web_config_file})" if cfg.web_config_file else ""))
            t = cfg.throughput
            if t.enabled:
                from wanprobe.daemon.throughput_spread import describe_cost

                typer.echo(describe_cost(t.interval_s, t.lookback_s, t.max_bytes_per_test,
                                         t.budget_bytes_per_peer_per_day, t.budget_bytes_per_day,
                                         len(peers)))
            return
        dmain.run(config, web_config_file)
    except ConfigInvalid as exc:
        _print_problems(exc)
        raise typer.Exit(exc.exit_code) from None


def _warn_unscrapable(cfg) -> None:
    """One warning line each (stderr, exit stays 0) when Prometheus, scraping the mesh's address
    and port for this host (``fleet targets``), would find no /metrics there — a daemon
    listening on loopback, the default, is up and every target of it down — and when a
    listener off loopback has no web config (anyone who reaches it reads the fleet)."""
    from wanprobe.daemon.config_fields import exposure_problem, scrape_problem
    from wanprobe.mesh.topology import load_mesh

    problems = []
    if cfg.mesh_file is not None:
        me = next((h for h in load_mesh(cfg.mesh_file).hosts if h.name == cfg.hostname), None)
        problems.append(me and scrape_problem(cfg.metrics_listen, me.address, me.metrics_port))
    problems.append(exposure_problem(cfg.metrics_listen, cfg.web_config_file))
    for problem in filter(None, problems):
        err_console.print(f"wanprobe: warning: {clean(one_line(f'{cfg.source}: {problem}'))}",
                          markup=False)


@app.command("history")
def history(
    peer: Annotated[str, typer.Argument(help="Peer name as in the config or mesh file.")],
    state_dir: Annotated[Path, typer.Option("--state-dir", help="The daemon's state_dir.")] = Path("/var/lib/wanprobe"),
    since: Annotated[str, typer.Option("--since", help="How far back, e.g. 30m, 1h or 168h (7 days).")] = "24h",
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many rows (newest).")] = 1000,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    windows: Annotated[bool, typer.Option("--windows", help="Instead of the rows: the peer's "
                                          "hour-of-week profile and the best hours to move "
                                          "--bytes (as `fleet windows`).")] = False,
    size: Annotated[str | None, typer.Option("--bytes", help=views.BYTES_HELP)] = None,
    deadline: views.DeadlineOpt = None,
    lookback: views.LookbackOpt = "14d",
    fmt: Annotated[str, typer.Option("--format", help="The rows: text, json, or html (the RTT "
                                     "band with loss, path events and tuning changes in one "
                                     "self-contained file). With --windows: "
                                     + views.FORMAT_HELP)] = "text",
    tz: views.TzOpt = None,
    top: views.TopOpt = 5,
    throttle: views.ThrottleOpt = "10mbit",
    unit: views.UnitOpt = "wanprobe-sync.service",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="With --format html: "
                                                "write to this file instead of stdout.")] = None,
    tune_state_dir: Annotated[str | None, typer.Option("--tune-state-dir", help="With --format "
                              "html: the tuner's journals, for its tuning changes (default "
                              "$WANPROBE_STATE_DIR or /var/lib/wanprobe-tune).")] = None,
) -> None:
    """Show a peer's probe history from the daemon's store (newest last), or with --windows
    when to move --bytes to it."""
    if windows or size is not None:
        if output is not None:
            raise UsageError("-o goes with --format html (the rows), not with --windows")
        _history_windows(peer, state_dir, views.parse_request(
            size=_needs_windows(windows, size), deadline=deadline, lookback=lookback, top=top,
            fmt=fmt, as_json=as_json, tz=tz, throttle=throttle, unit=unit))
        return
    if deadline is not None or tz is not None:
        raise UsageError("--deadline and --tz go with --windows --bytes SIZE")
    if fmt not in ROW_FORMATS or (output is not None and fmt != "html"):
        raise UsageError(f"--format {shown(fmt)}{' with -o' if output is not None else ''}: "
                         f"the rows are {', '.join(ROW_FORMATS)} (-o with html only); rclone and "
                         "systemd go with --windows --bytes SIZE")
    since_s = units.parse_duration_s(since, default_unit="s")
    if fmt == "html":
        from tuners.journal import state_dir_from
        from wanprobe.pictures.files import emit_history
        from wanprobe.pictures.history_data import parse_window

        root = check_path_text(state_dir, "--state-dir")
        emit_history(root / "history.sqlite3", peer, window_s=parse_window(since, "--since"),
                     state_dir=state_dir_from(tune_state_dir), output=output)
        return
    _history_rows(peer, state_dir, since, since_s, limit, as_json or fmt == "json")


def _history_rows(peer: str, state_dir: Path, since: str, since_s: float, limit: int,
                  as_json: bool) -> None:
    """The peer's probe sessions, throughput tests and findings since ``since``: one JSON
    document or tables."""
    from wanprobe.history.store import open_readonly

    store = open_readonly(check_path_text(state_dir, "--state-dir") / "history.sqlite3")
    try:
        start = time.time() - since_s
        rows = store.probes(peer, since=start, limit=limit)
        tput = store.throughput(peer, since=start)
        findings = store.findings(peer, since=start)
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps({"peer": peer, "since_s": since_s,
                               "probes": [r.to_json() for r in rows], "throughput": tput,
                               "findings": findings}, indent=2))
        return
    console = Console()
    if not rows and not tput:
        console.print(f"no history for peer {peer!r} in the last {since}")
        return
    table = Table(title=f"{peer}: probe sessions", show_lines=False)
    for col in ("time (UTC)", "method", "p50 ms", "p99 ms", "loss", "fwd", "rev", "note"):
        table.add_column(col, no_wrap=col != "note",
                         justify="right" if "ms" in col or col in ("loss", "fwd", "rev") else "left")
    for r in rows:
        table.add_row(_ts(r.ts), r.method, _f(r.rtt_p50_ms), _f(r.rtt_p99_ms),
                      _counted(r.loss_ratio, None if r.loss_ratio is None or not r.sent
                               else round(r.loss_ratio * r.sent), r.sent),
                      _counted(r.loss_forward_ratio, r.loss_forward_lost, r.loss_forward_of),
                      _counted(r.loss_reverse_ratio, r.loss_reverse_lost, r.loss_reverse_of),
                      _row_note(r))
    console.print(table)
    for t in tput:
        rate = units.format_rate(t["bits_per_second"]) if t["bits_per_second"] else t["error"]
        console.print(f"throughput {_ts(t['ts'])}: {rate} (limited by {t['limited_by'] or '?'})")
    for f in findings:
        console.print(f"[bold]{f['severity']}[/] {_ts(f['ts'])} {escape(f['title'])} "
                      f"{escape(f['report_path'] or '')}")


def _needs_windows(windows: bool, size: str | None) -> str:
    if not windows:
        raise UsageError("--bytes goes with --windows")
    if size is None:
        raise UsageError("--windows needs --bytes SIZE (what to move, e.g. 500GiB)")
    return size


def _history_windows(peer: str, state_dir: Path, req: views.Request) -> None:
    from wanprobe.windows.from_store import state_dir_profile
    from wanprobe.windows.plan import answer
    from wanprobe.windows.profile import require_goodput

    now = time.time()
    profile = state_dir_profile(state_dir, peer, lookback_s=req.lookback_s, now_ts=now)
    what = f"this host -> {shown(peer)}"
    require_goodput(profile, what)
    views.emit(answer(profile, req.size_bytes, now, top=req.top, deadline_s=req.deadline_s),
               req, what)


def _ts(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.2f}%"


def _counted(ratio: float | None, lost: int | None, of: int | None) -> str:
    """A loss ratio with the counts behind it (issue 36: "0.00 %" alone hid that the direction
    was told by 9 probes); rows of a schema-1 history have no counts and show the ratio."""
    if lost is None or not of:
        return _pct(ratio)
    return f"{_pct(ratio)} ({lost}/{of})"


def _row_note(r) -> str:
    """An error, a folded bucket's size, or the lost probes no direction could be told for (a
    loss at a session's end has no later reply to say which way: probe/result.py)."""
    if r.error:
        return r.error
    notes = [f"{r.sessions} sessions / {r.resolution_s:g} s"] if r.resolution_s else []
    if r.sent and r.received is not None and r.loss_forward_lost is not None \
            and r.loss_reverse_lost is not None:
        unknown = r.sent - r.received - r.loss_forward_lost - r.loss_reverse_lost
        if unknown > 0:
            notes.append(f"{unknown} lost, direction not known")
    return ", ".join(notes)

