"""CLI command ``paths``: per-flow hop lists, RTT and loss over ECMP paths (issue 16)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from wanprobe.errors import UsageError
from wanprobe.units import parse_duration_s, parse_port


def _parsed(option: str, parse, *args, **kw):
    try:
        return parse(*args, **kw)
    except UsageError as exc:
        raise UsageError(f"{option}: {exc}") from None


def register(app: typer.Typer) -> None:
    app.command("paths")(paths)


def paths(
    peer: Annotated[str, typer.Argument(help="Peer running a STAMP reflector (IPv4).")],
    flows: Annotated[int, typer.Option("--flows", "-n", help="Flows (distinct source ports).")] = 16,
    count: Annotated[int, typer.Option("--count", "-c", help="STAMP probes per flow.")] = 100,
    interval: Annotated[str, typer.Option("--interval", "-i", help="Time between one flow's probes.")] = "100ms",
    port: Annotated[str, typer.Option("--port", help="Reflector UDP port.")] = "862",
    max_ttl: Annotated[int, typer.Option("--max-ttl", help="Farthest hop traced.")] = 16,
    timeout: Annotated[str, typer.Option("--timeout", help="A reply later than this is lost.")] = "2s",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Trace and probe N flows (Paris-style, constant source ports): which ECMP paths exist,
    each path's RTT and loss per direction, and whether the paths differ significantly."""
    from wanprobe.probe.paths import measure_paths

    result = asyncio.run(measure_paths(
        peer, flows=flows, count=count, port=_parsed("--port", parse_port, port),
        interval_s=_parsed("--interval", parse_duration_s, interval, default_unit="s",
                           allow_zero=False),
        timeout_s=_parsed("--timeout", parse_duration_s, timeout, default_unit="s",
                          allow_zero=False),
        max_ttl=max_ttl))
    doc = result.to_json()
    doc["findings"] = _findings(doc)
    if as_json:
        sys.stdout.write(json.dumps(doc) + "\n")
        return
    _print(doc)


def _findings(doc: dict) -> list[dict]:
    """The diagnose rule on this document: ``path.ecmp_imbalance`` when the paths differ."""
    from wanprobe.diagnose.inputs import DiagnoseConfig
    from wanprobe.diagnose.rules_ecmp import ecmp_imbalance

    finding = ecmp_imbalance({"paths": doc}, None, DiagnoseConfig())
    return [finding.to_json()] if finding else []


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
    for f in doc["findings"]:
        console.print(f"[bold]{f['id']}[/]: {f['title']}\n  → {f['recommendation']}")
