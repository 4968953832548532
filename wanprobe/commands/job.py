"""CLI command: job explain — a training job's slow steps explained by path and host events."""

from __future__ import annotations

import json
import time
from pathlib import Path as FsPath
from typing import Annotated

import typer

from wanprobe.commands.options import http_url
from wanprobe.errors import UsageError, shown

app = typer.Typer(name="job", help="The training job's side: its steps (recorded by "
                  "wanprobe.job.recorder.StepRecorder) joined with what wanprobe measured.",
                  no_args_is_help=True)

MARGIN_S = 120.0   # sessions read around the steps: enough for a reference before the first
DAEMON_TIMEOUT_S = 30.0
MAX_ANSWER_BYTES = 64 * 2**20


@app.command("explain")
def explain(
    steps: Annotated[FsPath, typer.Option("--steps", help="The job's step log (JSON lines: "
                                          "step, start, end, comm_s, rank).")],
    state_dir: Annotated[FsPath | None, typer.Option(
        "--state-dir", help="The daemon's state directory (its history).")] = None,
    daemon: Annotated[str | None, typer.Option(
        "--daemon", help="The daemon's listener URL, e.g. http://127.0.0.1:9862.")] = None,
    peer: Annotated[list[str] | None, typer.Option(
        "--peer", help="Only these peers' paths (repeat); default every peer with history.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Find the slow steps against the job's own running baseline and attribute each to the
    path (which edge, which event, with the figures), a host (a straggler rank) or nothing
    known (unexplained)."""
    from wanprobe.job.explain import explain as run_explain
    from wanprobe.job.path_events import path_events, probe_interval_s
    from wanprobe.job.steps import parse_lines
    from wanprobe.userfiles import check_path_text, read_bytes

    if (state_dir is None) == (daemon is None):
        raise UsageError("give one of --state-dir DIR or --daemon URL")
    path = check_path_text(steps, "--steps")
    text = read_bytes(path, "--steps").decode("utf-8", errors="replace")
    log = parse_lines(text.splitlines(), f"--steps {shown(str(path))}")
    since, until = log.steps[0].start - MARGIN_S, log.steps[-1].end + MARGIN_S
    sessions, source = (_from_store(state_dir, peer, since, until) if state_dir
                        else _from_daemon(str(daemon), peer, since, until))
    notes = []
    if not sessions:
        notes.append(f"{source} has no probe session between the first and the last step: "
                     "no slow step can be put on the path")
    result = run_explain(log, path_events(sessions, probe_interval_s(sessions)))
    doc = {**result.to_json(), "source": source, "sessions": len(sessions),
           "notes": list(result.notes) + notes}
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    _render(doc)


def _from_store(state_dir: FsPath, peers: list[str] | None, since: float, until: float):
    from wanprobe.history.store import open_readonly
    from wanprobe.job.path_events import sessions_of
    from wanprobe.userfiles import check_path_text

    store = open_readonly(check_path_text(state_dir, "--state-dir") / "history.sqlite3")
    try:
        sessions = [s for p in peers or store.peers()
                    for s in sessions_of(store.probes(p, since=since), until)]
    finally:
        store.close()
    return sessions, f"history {shown(str(state_dir))}"


def _from_daemon(url: str, peers: list[str] | None, since: float, until: float):
    """The daemon's probe sessions over its listener (``/api/sessions``, daemon/routes.py)."""
    import urllib.error
    import urllib.parse
    import urllib.request

    from wanprobe.errors import ConfigError
    from wanprobe.job.path_events import Session
    from wanprobe.userfiles import parse_json

    http_url("--daemon", url)
    rows = []
    for peer in peers or [None]:
        query = {"since": repr(since), "until": repr(until), **({"peer": peer} if peer else {})}
        target = f"{url.rstrip('/')}/api/sessions?{urllib.parse.urlencode(query)}"
        try:
            with urllib.request.urlopen(target, timeout=DAEMON_TIMEOUT_S) as r:  # noqa: S310
                doc = parse_json(r.read(MAX_ANSWER_BYTES + 1), "the daemon's answer")
        except urllib.error.HTTPError as exc:
            raise ConfigError(f"--daemon {shown(url)}: HTTP {exc.code} "
                              f"{shown(exc.read(300).decode('utf-8', 'replace').strip())}") from None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--daemon {shown(url)}: cannot reach the daemon ({exc})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("sessions"), list):
            raise ConfigError(f"--daemon {shown(url)}: not a wanprobe daemon's /api/sessions")
        rows += [_session(x) for x in doc["sessions"]]
    sessions = [Session(**r) for r in rows if r is not None]
    return sessions, f"daemon {shown(url)}"


def _session(x: object) -> dict | None:
    """One session of the daemon's answer, typed; None for one that is not."""
    keys = ("ts", "peer", "sent", "lost_forward", "lost_reverse", "rtt_min_ms", "rtt_p50_ms")
    if not isinstance(x, dict) or not isinstance(x.get("peer"), str) \
            or not isinstance(x.get("ts"), int | float):
        return None
    out = {k: x.get(k) for k in keys}
    for k in ("sent", "lost_forward", "lost_reverse"):
        if not isinstance(out[k], int) or isinstance(out[k], bool):
            out[k] = None
    for k in ("rtt_min_ms", "rtt_p50_ms"):
        if not isinstance(out[k], int | float) or isinstance(out[k], bool):
            out[k] = None
    return out


def _render(doc: dict) -> None:
    from rich.table import Table

    from wanprobe.safe_text import SafeConsole as Console

    out = Console(highlight=False)
    c = doc["by_attribution"]
    out.print(f"[bold]{doc['slow']} slow step(s)[/] of {doc['steps']} (slower than "
              f"{doc['method']['slow_factor']}× the median of the {doc['method']['window_steps']} "
              f"normal steps before): path {c['path']}, host {c['host']}, unexplained "
              f"{c['unexplained']}; {doc['path_events']} path event(s) in {doc['sessions']} "
              f"probe sessions from {doc['source']}")
    t = Table(show_lines=False)
    for col in ("step", "at (UTC)", "took", "usual", "attribution", "cause"):
        t.add_column(col, no_wrap=col != "cause")
    for s in doc["slow_steps"]:
        t.add_row(str(s["step"]), time.strftime("%H:%M:%S", time.gmtime(s["start"])),
                  f"{s['duration_s']:.3f} s", f"{s['baseline_s']:.3f} s", s["attribution"],
                  s["cause"])
    out.print(t)
    for n in doc["notes"]:
        out.print(f"  [dim]{n}[/]")
