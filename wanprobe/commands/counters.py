"""``wanprobe counters``: RoCE/PFC/ECN/NIC/TCP counters grouped by device, with rates and
health findings. The logic lives in ``collectors/``; this module parses options and renders."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from wanprobe.errors import UsageError
from wanprobe.safe_text import SafeConsole as Console  # external text is data (issue 19)
from wanprobe.units import format_bytes, parse_duration_s
from wanprobe.userfiles import existing_dir

TCP_KEYS = ("InSegs", "OutSegs", "RetransSegs", "TCPTimeouts", "TCPLostRetransmit",
            "TCPSynRetrans", "TCPBacklogDrop", "ListenDrops", "ListenOverflows", "TCPOFOQueue")
SEV_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
MAX_ROWS = 40
MAX_INTERVAL_S = 3600.0  # a rate over more than an hour hides every burst it should show


def _fmt_value(value: int, unit: str | None) -> str:
    if unit == "4-byte words":
        return f"{value} ({format_bytes(value * 4)})"
    if unit == "bytes":
        return format_bytes(value)
    if unit == "us":
        return f"{value / 1e6:.3f} s"
    return str(value)


def _fmt_rate(r) -> str:
    if r is None:
        return ""
    if r.status == "reset":
        return "[magenta]reset[/]"
    return f"{r.per_s:,.1f}/s" + (" (wrapped)" if r.status == "wrapped" else "")


def _counter_table(title: str, key: tuple, cs, rates) -> Table | None:
    if cs is None:
        return None
    rows = []
    for name, value in cs.values.items():
        r = rates.get(key, name) if rates is not None else None
        if value or (r is not None and (r.delta or r.status == "reset")):
            rows.append((name, value, r))
    if not rows:
        return None
    rows.sort(key=lambda x: (-(x[2].per_s or 0) if x[2] else 0, x[0]))
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    t.add_column("counter")
    t.add_column("value", justify="right")
    t.add_column("rate", justify="right")
    for name, value, r in rows[:MAX_ROWS]:
        t.add_row(name, _fmt_value(value, cs.units.get(name)), _fmt_rate(r))
    if len(rows) > MAX_ROWS:
        t.add_row(f"… {len(rows) - MAX_ROWS} more non-zero (see --json)", "", "")
    return t


def _rdma_parts(snapshot, rates) -> list:
    parts: list = []
    for dname, dev in sorted(snapshot.rdma.items()):
        for pnum, port in sorted(dev.ports.items()):
            parts.append(Text(
                f"\nRDMA {dname} port {pnum}: {port.state or '?'} {port.rate_gbps or '?'} Gb/s "
                f"{port.link_layer or ''} netdev={port.netdev or '-'} "
                f"roce_v2_gid_index={port.roce_v2_gid_index} active_mtu={port.active_mtu_bytes}",
                style="bold"))
            base = ("rdma", dname, "ports", str(pnum))
            for kind in ("counters", "hw_counters"):
                t = _counter_table(kind, base + (kind,), getattr(port, kind), rates)
                if t is not None:
                    parts.append(t)
    return parts


def _netdev_parts(snapshot, rates) -> list:
    parts: list = []
    for name, nd in sorted(snapshot.netdevs.items()):
        line = (f"\nnetdev {name}: {nd.operstate or '?'} mtu={nd.mtu} "
                f"speed={nd.speed_mbps or '-'}Mb/s driver={nd.driver or '-'}")
        if nd.rings:
            line += f" rings rx={nd.rings.rx_pending}/{nd.rings.rx_max_pending} " \
                    f"tx={nd.rings.tx_pending}/{nd.rings.tx_max_pending}"
        if nd.ecn:
            on = [f"{r}:{','.join(str(p) for p, v in sorted(nd.ecn.enabled.get(r, {}).items()) if v)}"
                  for r in ("roce_np", "roce_rp")]
            line += " ecn " + " ".join(on)
        parts.append(Text(line, style="bold"))
        for kind in ("stats", "ethtool"):
            t = _counter_table(kind, ("netdevs", name, kind), getattr(nd, kind), rates)
            if t is not None:
                parts.append(t)
        if snapshot.qdisc.get(name):
            parts.append(Text("qdisc " + ", ".join(f"{q['kind']} {q['handle']} parent {q['parent']}"
                                                  for q in snapshot.qdisc[name])))
    return parts


def _tcp_table(snapshot, rates) -> Table:
    t = Table(title="\nTCP", title_justify="left", show_edge=False, pad_edge=False)
    t.add_column("counter")
    t.add_column("value", justify="right")
    t.add_column("rate", justify="right")
    for k in TCP_KEYS:
        if k in snapshot.tcp.values:
            t.add_row(k, str(snapshot.tcp.values[k]),
                      _fmt_rate(rates.get(("tcp",), k) if rates is not None else None))
    return t


def _findings_table(findings, rates) -> Table:
    ft = Table(title="\nfindings", title_justify="left", show_edge=False, pad_edge=False)
    ft.add_column("severity")
    ft.add_column("id")
    ft.add_column("title")
    ft.add_column("evidence")
    for f in findings:
        ev = f.evidence
        if ev.get("delta") is not None:
            detail = f"{ev.get('counter')} Δ{ev.get('delta')} ({ev.get('rate_per_s')}/s)"
        else:
            detail = f"{ev.get('counter')}={ev.get('value')}"
        ft.add_row(Text(f.severity, style=SEV_STYLE.get(f.severity, "")), f.id, f.title, detail)
    if not findings:
        ft.add_row("", "", "none" + ("" if rates is not None else
                                     " (single sample: use --interval for rate rules)"), "")
    return ft


def render(snapshot, rates=None, findings=()) -> Group:
    """A rich renderable: one section per RDMA port and netdev, TCP, findings, errors."""
    head = f"sys-root {snapshot.sys_root}  proc-root {snapshot.proc_root}"
    if rates is not None:
        head += f"  window {rates.interval_s:.2f} s"
    parts: list = [Text(head, style="dim")]
    parts += _rdma_parts(snapshot, rates)
    parts += _netdev_parts(snapshot, rates)
    if snapshot.tcp is not None:
        parts.append(_tcp_table(snapshot, rates))
    parts.append(_findings_table(findings, rates))
    if snapshot.errors:
        parts.append(Text(f"\n{len(snapshot.errors)} unreadable values, e.g. "
                          + "; ".join(f"{e.path}: {e.reason}" for e in snapshot.errors[:3]),
                          style="red"))
    return Group(*parts)


def run(sys_root: Path, proc_root: Path, ethtool_root: Path | None, interval_s: float | None):
    """Take one sample (or two, ``interval_s`` apart) → ``(snapshot, rates, findings)``."""
    from collectors.snapshot import Collector
    from wanprobe.services.counters import judge

    with Collector(sys_root, proc_root, ethtool_root) as c:
        first = c.sample()
        if not interval_s:
            return judge(first)
        time.sleep(interval_s)
        second = c.sample()
    return judge(first, second)


app = typer.Typer()


@app.command("counters")
def counters(
    sys_root: Annotated[str | None, typer.Option("--sys-root", help="sysfs root (default /sys)")] = None,
    proc_root: Annotated[str | None, typer.Option("--proc-root", help="procfs root (default /proc)")] = None,
    ethtool_root: Annotated[str | None, typer.Option(
        "--ethtool-root", help="captured `ethtool -S` texts: DIR/<if>/statistics")] = None,
    interval: Annotated[str | None, typer.Option(
        "--interval", help="take two samples this far apart (e.g. 2s, 500ms) for rates")] = None,
    watch: Annotated[bool, typer.Option("--watch", help="refresh in place every interval")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """RoCE, PFC, ECN, NIC and TCP counters by device, with rates and health findings."""
    sys_path = existing_dir(sys_root or "/sys", "--sys-root")
    proc_path = existing_dir(proc_root or "/proc", "--proc-root")
    eth_path = existing_dir(ethtool_root, "--ethtool-root") if ethtool_root else None
    interval_s = (parse_duration_s(interval, default_unit="s", allow_zero=False,
                                   maximum_s=MAX_INTERVAL_S) if interval else None)
    if watch and as_json:
        raise UsageError("--watch refreshes a screen; use --interval with --json instead")
    if watch:
        _watch(sys_path, proc_path, eth_path, interval_s or 2.0)
        return
    snap, r, findings = run(sys_path, proc_path, eth_path, interval_s)
    if as_json:
        from wanprobe.services.counters import document

        typer.echo(json.dumps(document(snap, r, findings), indent=2, sort_keys=False))
    else:
        Console().print(render(snap, r, findings))


def _watch(sys_root: Path, proc_root: Path, ethtool_root: Path | None, interval_s: float) -> None:
    from rich.live import Live

    from collectors.snapshot import Collector
    from wanprobe.services.counters import judge

    with Collector(sys_root, proc_root, ethtool_root) as c:
        prev = c.sample()
        with Live(render(*judge(prev)), auto_refresh=False,
                  screen=False, transient=False) as live:
            try:
                while True:
                    time.sleep(interval_s)
                    cur = c.sample()
                    live.update(render(*judge(prev, cur)), refresh=True)
                    prev = cur
            except KeyboardInterrupt:
                pass
