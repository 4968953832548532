"""CLI command: ``wanprobe diagnose PEER`` — measure the path and this host, explain what is
wrong with evidence, and write the versioned report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from wanprobe.errors import ProbeError, UsageError, WanprobeError
from wanprobe.safe_text import SafeConsole as Console  # external text is data (issue 19)
from wanprobe.units import parse_dscp, parse_port, parse_rate_bps, parse_ratio
from wanprobe.userfiles import check_output_path


def run_in_netns(netns: str, argv: list[str]) -> dict:
    """Run ``wanprobe diagnose ... --json`` inside ``netns`` (``ip netns exec`` also remounts
    /sys for it) and return its report document."""
    if not netns or "/" in netns:
        raise UsageError(f"bad namespace name {netns!r}")
    if not Path("/run/netns", netns).exists():
        raise UsageError(f"no network namespace {netns!r} (see `ip netns list`)")
    cmd = ["ip", "netns", "exec", netns, sys.executable, "-m", "wanprobe", "diagnose", *argv,
           "--json"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WanprobeError(f"diagnose in namespace {netns!r} failed: {exc}") from None
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["failed"])[-1]
        raise WanprobeError(f"diagnose in namespace {netns!r}: {last}",
                            exit_code=res.returncode)
    try:
        return json.loads(res.stdout)
    except json.JSONDecodeError:
        raise WanprobeError(f"diagnose in namespace {netns!r} printed no JSON report") from None


app = typer.Typer()


@app.command("diagnose")
def diagnose(
    peer: Annotated[str, typer.Argument(help="Peer running `wanprobe reflect`.")],
    quick: Annotated[bool, typer.Option("--quick", help="4 s of probes (4,000 at 1,000/s: resolves the 0.1 % loss SLO), the path's capacity, TCP tests of 2 s after a ramp-up sized from the path (default).")] = False,
    full: Annotated[bool, typer.Option("--full", help="10 s of probes (10,000), the capacity, TCP tests of 8 s after the ramp-up and the 1/2/4/8 stream scan.")] = False,
    netns: Annotated[str | None, typer.Option("--netns", help="Run inside this network namespace.")] = None,
    port: Annotated[str, typer.Option(help="Peer's STAMP/throughput port.")] = "862",
    link_rate: Annotated[str | None, typer.Option("--link-rate", help="Rate the path should carry, e.g. 10gbit (sizes buffers).")] = None,
    dscp: Annotated[str, typer.Option(help="DSCP to test for bleaching (training class).")] = "AF31",
    no_throughput: Annotated[bool, typer.Option("--no-throughput", help="Skip the throughput test.")] = False,
    flows: Annotated[int, typer.Option("--flows", min=1, max=4096, help="TCP flows each host carries at once (NCCL sockets × peers): splits its tcp_mem budget.")] = 16,
    loss_slo: Annotated[str, typer.Option("--loss-slo", help="The loss the path may have, e.g. 0.1% (default): loss above it is a finding per direction, and a run that cannot tell says so.")] = "0.1%",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON document.")] = False,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the report JSON to this file (- for stdout; /dev/null or a FIFO is written in place, any other device refused).")] = None,
    hmac_key_file: Annotated[str | None, typer.Option(
        "--hmac-key-file", help="The reflector's shared key (file, >= 16 characters): "
        "authenticated STAMP and throughput tests.")] = None,
) -> None:
    """Probe the path, run a capped throughput test, read counters and host config, and say
    what limits the link, with evidence, recommendations and tuner knobs."""
    from wanprobe.probe.access import check_sent_dscp
    from wanprobe.report.document import Report, save
    from wanprobe.report.render_rich import render_rich
    from wanprobe.services.diagnose import DiagnoseOptions
    from wanprobe.services.diagnose import diagnose as run_diagnose
    from wanprobe.userfiles import read_hmac_key_file

    if quick and full:
        raise UsageError("--quick and --full exclude each other")
    if output is not None:
        check_output_path(output, "--output")
    opts = DiagnoseOptions(
        peer=peer, port=parse_port(port), mode="full" if full else "quick",
        link_rate_bps=parse_rate_bps(link_rate) if link_rate else None,
        dscp=check_sent_dscp(parse_dscp(dscp)), throughput=not no_throughput, concurrent_flows=flows,
        hmac_key=read_hmac_key_file(hmac_key_file), loss_slo=_slo(loss_slo))
    err = Console(stderr=True, highlight=False)
    if netns is not None:
        argv = [peer, "--full" if full else "--quick", "--port", str(opts.port),
                "--dscp", str(opts.dscp), "--flows", str(flows), "--loss-slo", loss_slo]
        if link_rate:
            argv += ["--link-rate", link_rate]
        if no_throughput:
            argv.append("--no-throughput")
        if hmac_key_file:
            argv += ["--hmac-key-file", hmac_key_file]
        report = Report.from_json(run_in_netns(netns, argv))
    elif as_json or not err.is_terminal:
        report = run_diagnose(opts)
    else:
        with err.status("diagnosing") as status:
            report = run_diagnose(opts, progress=lambda m: status.update(m))
    if output is not None:
        save(report, output)
    if str(output) == "-":  # the report JSON is stdout
        pass
    elif as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        render_rich(report, Console(highlight=False))
        if output is not None:
            err.print(f"report written to {output}")
    _exit_unmeasured(report)


def _slo(text: str) -> float:
    """--loss-slo as a ratio in (0, 0.5]; a bad one is one line naming the option."""
    try:
        value = parse_ratio(text)
    except UsageError as exc:
        raise UsageError(f"--loss-slo: {exc}") from None
    if not 0 < value <= 0.5:
        raise UsageError(f"--loss-slo {text!r} must be above 0 and at most 50%")
    return value


def _exit_unmeasured(report) -> None:
    """A peer that never answered is exit 5 (README: peer unreachable), after the report that
    says so was written: nothing of the path was measured."""
    errors = report.measured.errors
    if report.measured.path is None and errors.get("path"):
        raise ProbeError(f"the path was not measured: {errors['path']}")
