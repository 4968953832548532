"""CLI command ``paths``: per-flow hop lists, RTT and loss over ECMP paths (issue 16); the
measuring and the judging are services/paths.py's, this parses the options and renders."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.table import Table

from wanprobe.commands.options import JsonObject, Netns, ReflectorKeyFile, ReplyTimeout, enter_netns
from wanprobe.errors import UsageError, shown
from wanprobe.probe.paths import MAX_FLOWS
from wanprobe.safe_text import SafeConsole as Console  # external text is data (issue 19)
from wanprobe.units import parse_duration_s, parse_port


def _parsed(option: str, parse, *args, **kw):
    try:
        return parse(*args, **kw)
    except UsageError as exc:
        raise UsageError(f"{option}: {exc}") from None


app = typer.Typer()


@app.command("paths")
def paths(
    peer: Annotated[str, typer.Argument(help="Peer running a STAMP reflector (IPv4).")],
    flows: Annotated[int, typer.Option("--flows", "-n", help="Flows (distinct source ports).")] = 16,
    count: Annotated[int, typer.Option("--count", "-c", help="STAMP probes per flow.")] = 100,
    interval: Annotated[str, typer.Option("--interval", "-i", help="Time between one flow's probes.")] = "100ms",
    port: Annotated[str, typer.Option("--port", help="Reflector UDP port.")] = "862",
    max_ttl: Annotated[int, typer.Option("--max-ttl", help="Farthest hop traced.")] = 16,
    timeout: ReplyTimeout = "2s",
    src_ports: Annotated[str | None, typer.Option(
        "--src-ports", help="Source ports instead of ephemeral ones: a range 40000-40015 or a "
        "list 40000,40007 (overrides --flows).")] = None,
    as_json: JsonObject = False,
    hmac_key_file: ReflectorKeyFile = None,
    netns: Netns = None,
    above_limit: Annotated[str, typer.Option(
        "--above-limit", help="flows / interval above the limit a wanprobe reflector "
        "advertises: pace (to 80% of it), refuse, or send (its drops are counted apart from "
        "path loss).")] = "pace",
) -> None:
    """Trace and probe N flows (Paris-style, constant source ports): which ECMP paths exist,
    each path's RTT and loss per direction, and whether the paths differ significantly."""
    from wanprobe.probe import limits
    from wanprobe.probe.paths import check_args
    from wanprobe.probe.probe_options import check_common, probe_count
    from wanprobe.probe.rate_guard import check_policy
    from wanprobe.services.paths import run_paths
    from wanprobe.userfiles import read_hmac_key_file

    enter_netns(netns)  # first: every socket, thread and resolver lookup is then inside
    key = read_hmac_key_file(hmac_key_file)
    port_n = _parsed("--port", parse_port, port)
    interval_s = _parsed("--interval", parse_duration_s, interval, default_unit="s",
                         allow_zero=False, maximum_s=limits.MAX_PROBE_S)
    timeout_s = _parsed("--timeout", parse_duration_s, timeout, default_unit="s",
                        allow_zero=False, maximum_s=limits.MAX_TIMEOUT_S)
    check_args(flows, count, interval_s, max_ttl)
    check_common(port_n, 0, timeout_s)  # refused up front, before any socket (issue 14)
    probe_count(count, None, interval_s)
    limits.check_total(count * flows, interval_s / flows)
    ports = _ports(src_ports) if src_ports is not None else None
    run = run_paths(peer, flows=flows, count=count, port=port_n, interval_s=interval_s,
                    timeout_s=timeout_s, max_ttl=max_ttl, src_ports=ports, hmac_key=key,
                    policy=check_policy(above_limit),
                    say=Console(stderr=True, highlight=False, soft_wrap=True).print)
    if as_json:
        sys.stdout.write(json.dumps(run.doc) + "\n")
    else:
        _print(run.doc)
    _exit_if_silent(peer, {"port": port_n, "timeout_s": timeout_s, "hmac_key": key},
                    run.received, run.refused, run.sent)


def _exit_if_silent(peer: str, kw: dict, received: int, refused: int = 0, sent: int = 0) -> None:
    """Exit 8 when the reflector refused a session to any probe (probe.peer.session_refused);
    else exit 1 as ``probe`` does when not one probe of any flow was answered, saying why (a key
    the reflector wants, or one it does not share: probe.peer.no_reply); any reply at all
    makes it loss, and the output above stands."""
    if refused:
        from wanprobe.probe.peer import session_refused

        raise session_refused(peer, kw["port"], refused, sent)
    if not received:
        from wanprobe.probe.peer import no_reply

        raise no_reply(peer, "stamp", kw)


def probe_over_flows(host: str, flows: int, method: str, kw: dict, as_json: bool,
                     policy: str = "pace") -> None:
    """``probe --flows K``: the probe's packets over K traced source ports (services/paths.py),
    the rate checked against the reflector's limit first (rate_guard.py, ``policy``)."""
    from wanprobe.probe.paths import MAX_FLOWS
    from wanprobe.services.paths import probe_over_flows as run_flows

    if method != "stamp":
        raise UsageError("--flows needs --method stamp")
    if not 1 <= flows <= MAX_FLOWS:
        raise UsageError(f"--flows must be 1-{MAX_FLOWS}, got {flows}")
    if kw.get("size") is not None or kw.get("dscp"):
        raise UsageError("--flows does not take --size or --dscp yet")
    doc = run_flows(host, flows, kw, policy,
                    say=Console(stderr=True, highlight=False, soft_wrap=True).print)
    if as_json:
        sys.stdout.write(json.dumps(doc) + "\n")
        return _exit_if_silent(host, kw, doc["loss"]["received"], *_refused_of(doc))
    console = Console(highlight=False)
    rtt, loss = doc["rtt_ms"], doc["loss"]
    console.print(f"{host}: {loss['sent']} probes over {flows} flows, rtt p50 "
                  f"{rtt['p50']} ms p99 {rtt['p99']} ms, loss {_pct(loss['ratio'])} (fwd "
                  f"{_pct(loss['forward_ratio'])}, rev {_pct(loss['reverse_ratio'])})")
    if doc["reflector"]["note"]:
        console.print(doc["reflector"]["note"])
    if "paths" in doc:
        _print({"peer": host, "flows": doc["flows"], "summary": doc["paths"]})
    _exit_if_silent(host, kw, doc["loss"]["received"], *_refused_of(doc))


def _refused_of(doc: dict) -> tuple[int, int]:
    """(probes refused a session by the reflector, probes sent) of a probe document."""
    return doc["loss"].get("reflector_session_refused") or 0, doc["loss"]["sent"]


def _ports(text: str) -> list[int]:
    """``40000-40015`` or ``40000,40007,...`` as a list of ports (1-65535, at most 256)."""
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-", 1))
            ports = list(range(lo, hi + 1)) if 0 <= hi - lo < MAX_FLOWS else []
        else:
            ports = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--src-ports: use a range like 40000-40015 or a list, got {shown(text)}") from None
    if not 1 <= len(ports) <= MAX_FLOWS or not all(1 <= p <= 65535 for p in ports):
        raise UsageError(f"--src-ports: 1-{MAX_FLOWS} ports within 1-65535, got {shown(text)}")
    return ports


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:.2f}%"


def _print(doc: dict) -> None:
    console = Console(highlight=False)
    s = doc["summary"]
    table = Table("path", "flows", "hops", "rtt p50 ms", "rtt p99 ms", "loss", "fwd", "rev",
                  title=f"{doc['peer']}: {s['distinct_paths']} path(s) over {len(doc['flows'])} flows")
    for p in s["paths"]:
        rtt = p["rtt_ms"] or {}
        table.add_row(str(p["path"]), str(p["flows"]), " ".join(h or "*" for h in p["hops"]),
                      f"{rtt.get('p50', 0):.3f}" if rtt else "-",
                      f"{rtt.get('p99', 0):.3f}" if rtt else "-",
                      _pct(p["loss_ratio"]), _pct(p["forward_ratio"]), _pct(p["reverse_ratio"]))
    console.print(table)
    verdict = "differ significantly" if s["differ"] else "do not differ significantly"
    console.print(f"paths {verdict} (alpha {s['alpha']}: loss chi-square p = "
                  f"{s['loss_test']['p_value']:.3g}, RTT Kruskal-Wallis p = "
                  f"{s['rtt_test']['p_value']:.3g}); worst path {s['worst_path']}")
    if (doc.get("reflector") or {}).get("note"):
        console.print(doc["reflector"]["note"])
    for f in doc["findings"]:
        console.print(f"[bold]{f['id']}[/]: {f['title']}\n  → {f['recommendation']}")
