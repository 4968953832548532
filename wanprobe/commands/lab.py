"""CLI commands: ``wanprobe lab up|down|ls|exec|update`` — the emulated WAN lab (``lab sites``:
lab_sites.py; ``lab multipath|reroute|path``: lab_multipath.py)."""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer
from rich.table import Table

from wanprobe.commands import lab_multipath, lab_sites
from wanprobe.commands.lab_settings import (
    DelayAb,
    DelayBa,
    JsonOpt,
    NewJitter,
    NewLoss,
    NewRtt,
    QueueAb,
    QueueBa,
    describe,
    settings_kwargs,
)
from wanprobe.errors import LabError, UsageError
from wanprobe.safe_text import SafeConsole as Console

console = Console(highlight=False)

NameArg = Annotated[str, typer.Argument(help="Lab name; namespaces are wp-NAME-a and wp-NAME-b.")]


app = typer.Typer(
    name="lab",
    help="Emulated WAN link: namespaces a and b joined by a delay line (delay, jitter, "
         "loss, rate, MTU, DSCP bleaching, reordering). Needs root.",
    no_args_is_help=True,
)

@app.command("up")
def up(
    name: NameArg,
    profile: Annotated[str | None, typer.Option(help="Route profile: metro, taipei-tokyo, taipei-singapore, taipei-uswest, subsea-degraded.")] = None,
    rtt: Annotated[str | None, typer.Option(help="Round-trip delay, e.g. 60ms (half each way).")] = None,
    delay_ab: DelayAb = None,
    delay_ba: DelayBa = None,
    jitter: Annotated[str | None, typer.Option(help="Delay jitter per direction (std dev), e.g. 1ms.")] = None,
    loss: Annotated[str | None, typer.Option(help="Loss in each direction, e.g. 0.5%.")] = None,
    loss_ab: Annotated[str | None, typer.Option("--loss-ab", help="Loss a→b only.")] = None,
    loss_ba: Annotated[str | None, typer.Option("--loss-ba", help="Loss b→a only.")] = None,
    rate: Annotated[str | None, typer.Option(help="Rate per direction, e.g. 100mbit.")] = None,
    mtu: Annotated[int, typer.Option(help="Interface MTU in both namespaces.")] = 1500,
    black_hole_mtu: Annotated[int | None, typer.Option("--black-hole-mtu", help="Silently drop packets larger than this (no ICMP).")] = None,
    bleach_dscp: Annotated[bool, typer.Option("--bleach-dscp", help="Zero DSCP on the path, keep ECN.")] = False,
    reorder: Annotated[str | None, typer.Option(help="Probability a packet overtakes the previous 1 ms of traffic.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Bring a lab up (replacing a stale one of the same name)."""
    from wanprobe.lab import Lab, registry

    if (registry.read(name) or {}).get("kind") == "sites":  # Lab.status() would call it stale
        raise LabError(f"lab {name!r} is a sites lab; run `wanprobe lab down {name}` first")
    kwargs = settings_kwargs(rtt=rtt, jitter=jitter, loss=loss, loss_ab=loss_ab,
                             loss_ba=loss_ba, rate=rate, black_hole_mtu=black_hole_mtu,
                             bleach_dscp=bleach_dscp or None, reorder=reorder,
                             delay_ab=delay_ab, delay_ba=delay_ba)
    lab = Lab(name, profile=profile, mtu=mtu, persistent=True, **kwargs)
    lab.up()
    if json_out:
        typer.echo(json.dumps(lab._state(), sort_keys=True))
        return
    console.print(f"lab [bold]{lab.name}[/] up: {lab.a.name} ({lab.a.addr}) ⇄ "
                  f"{lab.b.name} ({lab.b.addr}) over {lab.a.ifname}; {describe(lab.settings)}")
    console.print(f"run inside: wanprobe lab exec {lab.name} a -- ping {lab.b.addr}")

@app.command("down")
def down(name: NameArg) -> None:
    """Tear a lab down: processes inside, forwarder, namespaces, devices. Idempotent."""
    from wanprobe.lab import Lab
    from wanprobe.lab.lab import require_root

    require_root()
    from wanprobe.lab import registry
    kind = (registry.read(name) or {}).get("kind")
    if kind in ("multipath", "sites"):
        from wanprobe.lab.multipath import MultipathLab
        from wanprobe.lab.sites import SitesLab
        (MultipathLab if kind == "multipath" else SitesLab).attach(name).down()
        console.print(f"lab {name} removed")
        return
    lab = Lab(name, rtt_ms=0)
    was = lab.status()
    lab.down()
    console.print(f"lab {name} {'removed' if was != 'down' else 'was not up'}")

@app.command("ls")
def ls(json_out: JsonOpt = False) -> None:
    """List labs (up, or stale leftovers that `lab up`/`lab down` will clean)."""
    from wanprobe.lab import list_labs
    from wanprobe.lab.settings import LinkSettings

    labs = list_labs()
    for lab in labs:
        if lab.get("kind") == "sites":  # sites.py: one delay line per pair of sites
            from wanprobe.lab.sites import lab_status
            lab["status"] = lab_status(lab)
    if json_out:
        typer.echo(json.dumps(labs, sort_keys=True))
        return
    if not labs:
        console.print("no labs")
        return
    table = Table("name", "status", "profile", "namespaces", "settings")
    for lab in labs:
        s = lab.get("settings")
        table.add_row(lab["name"], lab["status"], lab.get("profile") or "",
                      " ".join(lab["routers"].values()) + " (routers)" if "routers" in lab else
                      f"{lab.get('ns_a', '?')} {lab.get('ns_b', '?')}",
                      describe(LinkSettings.from_json(s)) if s else
                      f"{len(lab['paths'])} paths, active {lab['active']}" if "paths" in lab else
                      f"{len(lab['sites'])} sites, {len(lab['hosts'])} hosts" if "sites" in lab else "")
    console.print(table)

@app.command("exec", context_settings={"allow_extra_args": True,
                                            "ignore_unknown_options": True})
def exec_(
    name: NameArg,
    side: Annotated[str, typer.Argument(help="a or b (a sites lab: a host such as tpe1)")],
    command: Annotated[list[str], typer.Argument(help="Command to run inside (after --).")],
) -> None:
    """Run a command inside namespace a or b of a lab, e.g. `lab exec x a -- ping 198.18.0.2`."""
    from wanprobe.lab import Lab, registry

    kind = (registry.read(name) or {}).get("kind")
    if kind == "sites":
        from wanprobe.lab.sites import SitesLab
        argv = SitesLab.attach(name).host(side).argv(command)
    elif side not in ("a", "b"):
        raise UsageError(f"side must be a or b, got {side!r}")
    else:
        if kind == "multipath":
            from wanprobe.lab.multipath import MultipathLab
            lab = MultipathLab.attach(name)
        else:
            lab = Lab.attach(name)
        argv = (lab.a if side == "a" else lab.b).argv(command)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        raise LabError(f"cannot run {command[0]!r}: {exc.strerror}") from None

@app.command("update")
def update(
    name: NameArg,
    rtt: NewRtt = None,
    delay_ab: DelayAb = None,
    delay_ba: DelayBa = None,
    jitter: NewJitter = None,
    loss: NewLoss = None,
    loss_ab: Annotated[str | None, typer.Option("--loss-ab")] = None,
    loss_ba: Annotated[str | None, typer.Option("--loss-ba")] = None,
    rate: Annotated[str | None, typer.Option(help="New rate per direction.")] = None,
    reorder: Annotated[str | None, typer.Option()] = None,
    bleach_dscp: Annotated[bool | None, typer.Option("--bleach-dscp/--no-bleach-dscp")] = None,
    queue_ab: QueueAb = None,
    queue_ba: QueueBa = None,
    json_out: JsonOpt = False,
) -> None:
    """Change a running lab's impairments live."""
    from wanprobe.lab import Lab

    kwargs = settings_kwargs(rtt=rtt, jitter=jitter, loss=loss, loss_ab=loss_ab,
                             loss_ba=loss_ba, rate=rate, reorder=reorder,
                             bleach_dscp=bleach_dscp, delay_ab=delay_ab, delay_ba=delay_ba,
                             queue_ab=queue_ab, queue_ba=queue_ba)
    if not kwargs:
        raise UsageError("nothing to change: give e.g. --loss 1% or --rtt 80ms")
    lab = Lab.attach(name)
    new = lab.update(**kwargs)
    if json_out:
        typer.echo(json.dumps(new.to_json(), sort_keys=True))
    else:
        console.print(f"lab {name}: {describe(new)}")


app.add_typer(lab_multipath.app)  # lab multipath | reroute | path (issue 16)
app.add_typer(lab_sites.app)  # lab sites: sites of hosts sharing one delay line per site pair
