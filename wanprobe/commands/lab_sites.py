"""CLI command ``wanprobe lab sites``: the multi-site lab (sites of hosts, one delay line per
pair of sites, shared by the site's hosts)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Annotated

import typer
from rich.table import Table

from wanprobe.commands import lab_settings
from wanprobe.errors import UsageError
from wanprobe.safe_text import SafeConsole as Console

console = Console(highlight=False)

TOPOLOGY_HELP = (
    "TOML file of sites and links instead of a profile: [sites.tpe] hosts = 2 per site, and per "
    "pair of sites a [[links]] table: between = [\"tpe\", \"tyo\"], rtt_ms = 35, optional "
    "jitter_ms, loss (both ways) or loss_ab/loss_ba (first site → second and back), "
    "rate = \"200Mbit\", profile = \"taipei-tokyo\" (its values unless given).")

app = typer.Typer()


def link_text(a: str, b: str, settings) -> str:
    """A link's settings with its directions named by site."""
    return lab_settings.describe(settings).replace("a→b", f"{a}→{b}").replace("b→a", f"{b}→{a}")


@app.command("sites")
def sites(
    name: Annotated[str, typer.Argument(help="Lab name; namespaces are wp-NAME-SITE (routers) "
                                        "and wp-NAME-SITEj (hosts).")],
    profile: Annotated[str | None, typer.Option(
        help="Sites profile: tpe-tyo (35 ms) or tpe-tyo-usw (tpe-tyo 35 ms, tpe-usw 130 ms, "
             "tyo-usw 100 ms); default tpe-tyo.")] = None,
    topology: Annotated[str | None, typer.Option(help=TOPOLOGY_HELP)] = None,
    hosts_per_site: Annotated[int | None, typer.Option(
        "--hosts-per-site", help="Hosts in every site, 1-8 (default: the profile's 2 or the "
                                 "file's).")] = None,
    rate: Annotated[str | None, typer.Option(
        help="Rate of every site-to-site link per direction, e.g. 100mbit (default: the "
             "profile's or the file's).")] = None,
    json_out: lab_settings.JsonOpt = False,
) -> None:
    """Bring up a multi-site lab: per site a router and its hosts on a LAN, each pair of sites
    one delay line that the site's hosts share."""
    from wanprobe.lab.sites import SitesLab, SiteSpec, load_topology, sites_profile
    from wanprobe.units import parse_rate_bps

    if profile is not None and topology is not None:
        raise UsageError("give --profile or --topology, not both")
    specs, links = load_topology(topology) if topology is not None else \
        sites_profile(profile or "tpe-tyo")
    if hosts_per_site is not None:
        specs = [SiteSpec(s.name, hosts_per_site) for s in specs]
    if rate is not None:
        bps = parse_rate_bps(rate)
        links = {pair: replace(s, rate_bps=bps) for pair, s in links.items()}
    lab = SitesLab(name, specs, links, persistent=True).up()
    if json_out:
        typer.echo(json.dumps(lab.state(), sort_keys=True))
        return
    hosts = Table("host", "site", "namespace", "address")
    for h in lab.hosts:
        hosts.add_row(h.name, h.site, h.ns, h.addr)
    wan = Table("link", "settings")
    for (a, b), s in lab.links.items():
        wan.add_row(f"{a} ⇄ {b}", link_text(a, b, s))
    console.print(f"lab [bold]{name}[/] up: {len(lab.sites)} sites, {len(lab.hosts)} hosts")
    console.print(hosts)
    console.print(wan)
    first, last = lab.hosts[0], lab.hosts[-1]
    console.print(f"try: wanprobe lab exec {name} {first.name} -- ping -c 3 {last.addr}")
