"""CLI command: ``wanprobe demo`` — the diagnose → tune → re-measure story on the taipei-uswest
lab (``wanprobe.demo_story``); ``--lab-only`` just measures the lab with ping and iperf3 and shows
the figures next to the configured settings.
"""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer
from rich.table import Table

from wanprobe.safe_text import SafeConsole as Console
from wanprobe.units import format_rate

PROFILE = "taipei-uswest"
MAX_DEMO_TEST_S = 60.0  # each of the two throughput tests; the reflector's default cap


def run_demo(*, profile: str = PROFILE, ping_count: int = 1000, iperf_s: float = 4.0,
             progress=lambda msg: None) -> dict:
    """Bring a lab up, measure RTT, loss and TCP rate, tear it down; return a JSON-ready dict."""
    from wanprobe.lab import Lab, measure

    with Lab(name=f"demo{os.getpid()}", profile=profile) as lab:
        s = lab.settings
        progress(f"lab {lab.name} up ({profile}); pinging {ping_count}x …")
        rtt = measure.ping(lab, 100, 0.01)
        loss = measure.ping(lab, ping_count, 0.002)
        progress(f"iperf3 for {iperf_s:g} s …")
        tcp = measure.iperf3(lab, iperf_s)
    expected_loss = 1 - (1 - s.loss_ab) * (1 - s.loss_ba)
    return {
        "profile": profile,
        "settings": s.to_json(),
        "rows": [
            {"metric": "RTT (ping median, ms)", "configured": s.rtt_ms,
             "measured": rtt.rtt_median_ms},
            {"metric": "round-trip loss (ping)", "configured": expected_loss,
             "measured": loss.loss_ratio, "probes": loss.probes},
            {"metric": "rate (iperf3 TCP, bit/s)", "configured": s.rate_bps,
             "measured": tcp.received_bits_per_second, "retransmits": tcp.retransmits},
        ],
    }


app = typer.Typer()


@app.command("demo")
def demo(
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    lab_only: Annotated[bool, typer.Option(
        "--lab-only", help="Only bring the lab up and show measured vs configured link.")] = False,
    duration: Annotated[str, typer.Option(
        "--duration", help="Length of each throughput test (before and after).")] = "5s",
) -> None:
    """Diagnose → tune → re-measure an untuned Taipei ⇄ US West path in the lab (root).

    Both ends start on reno with 256 KiB buffers; wanprobe measures, explains what limits the
    path, applies its plan inside the lab namespaces, measures again, prints before/after
    and rolls everything back.
    """
    if not lab_only:
        from wanprobe.demo_story import run_demo_story
        from wanprobe.units import parse_duration_s

        doc = run_demo_story(json_out, lab_name=f"demo{os.getpid()}",
                             duration_s=parse_duration_s(duration, default_unit="s",
                                                         allow_zero=False,
                                                         maximum_s=MAX_DEMO_TEST_S))
        if json_out:
            typer.echo(json.dumps(doc, sort_keys=True))
        return
    console = Console(highlight=False, stderr=json_out)
    result = run_demo(progress=lambda m: console.print(f"[dim]{m}[/]"))
    if json_out:
        typer.echo(json.dumps(result, sort_keys=True))
        return
    table = Table("metric", "configured", "measured",
                  title=f"emulated link: {result['profile']}",
                  caption="TCP over a long, lossy path rarely reaches the link rate in a few "
                          "seconds: that gap is what `wanprobe diagnose` explains.")
    fmt = {
        0: lambda v: f"{v:.2f} ms" if v is not None else "-",
        1: lambda v: f"{v * 100:.2f} %" if v is not None else "-",
        2: lambda v: format_rate(v) if v else "unlimited",
    }
    for i, row in enumerate(result["rows"]):
        table.add_row(row["metric"], fmt[i](row["configured"]), fmt[i](row["measured"]))
    console.print(table)
