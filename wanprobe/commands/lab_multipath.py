"""CLI commands ``wanprobe lab multipath|reroute|path``: the multi-path lab (issue 16)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from wanprobe.commands import lab_settings  # link options shared with `lab up|update`
from wanprobe.errors import UsageError
from wanprobe.safe_text import SafeConsole as Console

console = Console(highlight=False)
NameArg = Annotated[str, typer.Argument(help="Lab name; namespaces are wp-NAME-a, -r1, -r2, -b.")]


def _indices(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--via takes path numbers such as 2 or 0,1; got {text!r}") from None


def _describe(state: dict) -> str:
    from wanprobe.lab.settings import LinkSettings

    lines = []
    for i, p in enumerate(state["paths"]):
        mark = "active" if i in state["active"] else "standby"
        lines.append(f"  path {i} ({mark}): {lab_settings.describe(LinkSettings.from_json(p))}")
    return "\n".join(lines)


app = typer.Typer()


@app.command("multipath")
def multipath(
    name: NameArg,
    paths: Annotated[int, typer.Option("--paths", min=1, max=16, help="ECMP paths between the routers (1-16).")] = 2,
    rtt: Annotated[str, typer.Option(help="Round-trip delay of each ECMP path.")] = "40ms",
    standby_rtt: Annotated[str | None, typer.Option(
        "--standby-rtt", help="Add a longer standby path (not in the ECMP set), e.g. 95ms; "
        "`lab reroute` moves traffic onto it.")] = None,
    json_out: lab_settings.JsonOpt = False,
) -> None:
    """Bring up a multi-path lab: a → r1 ⇉ K delay lines (ECMP, L4 hash) ⇉ r2 → b."""
    from wanprobe.lab.multipath import MultipathLab
    from wanprobe.lab.settings import LinkSettings

    ecmp = LinkSettings(rtt_ms=lab_settings.settings_kwargs(rtt=rtt)["rtt_ms"])
    settings = [ecmp] * paths
    if standby_rtt is not None:
        standby = lab_settings.settings_kwargs(rtt=standby_rtt)["rtt_ms"]
        settings.append(LinkSettings(rtt_ms=standby))
    lab = MultipathLab(name, settings, ecmp=range(paths), persistent=True).up()
    state = lab.state()
    if json_out:
        typer.echo(json.dumps(state, sort_keys=True))
        return
    console.print(f"lab [bold]{name}[/] up: {lab.a.name} ({lab.a.addr}) → {paths} ECMP "
                  f"path(s) → {lab.b.name} ({lab.b.addr})\n{_describe(state)}")
    console.print(f"try: wanprobe lab exec {name} a -- wanprobe paths {lab.b.addr} --flows 8 "
                  f"(with `wanprobe reflect` running in b)")

@app.command("reroute")
def reroute(
    name: NameArg,
    via: Annotated[str | None, typer.Option(
        "--via", help="Path number(s) to carry all traffic, e.g. 2 or 0,1 (default: the "
        "paths not active now, i.e. the standby path).")] = None,
    json_out: lab_settings.JsonOpt = False,
) -> None:
    """Move a multi-path lab's traffic onto other paths live (a cable cut, rehearsed)."""
    from wanprobe.lab.multipath import MultipathLab

    lab = MultipathLab.attach(name)
    target = _indices(via) if via is not None else \
        [i for i in range(len(lab.paths)) if i not in lab.ecmp]
    if not target:
        raise UsageError("every path is active already: give --via")
    lab.reroute(target)
    if json_out:
        typer.echo(json.dumps(lab.state(), sort_keys=True))
    else:
        console.print(f"lab {name}: traffic now over path(s) {', '.join(map(str, lab.ecmp))}")

@app.command("path")
def path(
    name: NameArg,
    index: Annotated[int, typer.Argument(help="Path number.")],
    rtt: lab_settings.NewRtt = None,
    jitter: lab_settings.NewJitter = None,
    loss: lab_settings.NewLoss = None,
    loss_ab: Annotated[str | None, typer.Option("--loss-ab", help="Loss r1→r2 (a→b).")] = None,
    loss_ba: Annotated[str | None, typer.Option("--loss-ba", help="Loss r2→r1 (b→a).")] = None,
    queue: Annotated[str | None, typer.Option(help="Mean queueing delay at this hop, e.g. 15ms.")] = None,
    delay_ab: lab_settings.DelayAb = None,
    delay_ba: lab_settings.DelayBa = None,
    queue_ab: lab_settings.QueueAb = None,
    queue_ba: lab_settings.QueueBa = None,
    json_out: lab_settings.JsonOpt = False,
) -> None:
    """Change one path's impairments live."""
    from wanprobe.lab.multipath import MultipathLab

    kwargs = lab_settings.settings_kwargs(rtt=rtt, jitter=jitter, loss=loss, loss_ab=loss_ab,
                                          loss_ba=loss_ba, delay_ab=delay_ab, delay_ba=delay_ba,
                                          queue_ab=queue_ab, queue_ba=queue_ba)
    if queue is not None:
        kwargs["queue_ms"] = lab_settings.settings_kwargs(rtt=queue)["rtt_ms"]
    if not kwargs:
        raise UsageError("nothing to change: give e.g. --loss 1% or --queue 15ms")
    new = MultipathLab.attach(name).update_path(index, **kwargs)
    if json_out:
        typer.echo(json.dumps(new.to_json(), sort_keys=True))
    else:
        console.print(f"lab {name} path {index}: {lab_settings.describe(new)}"
                      + (f", queue {new.queue_ms:g} ms" if new.queue_ms else ""))
