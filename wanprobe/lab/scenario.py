"""What a scenario in a lab does at its ends (the demo story, the tune check, lab tests and
benches): run ``wanprobe`` in a namespace and read its JSON, start from untuned hosts, start the
reflector."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from wanprobe.errors import WanprobeError

# "Untuned": the loss-based default and buffers far below the path's BDP (1.6 MB at 100 Mbit/s).
UNTUNED = {"net.ipv4.tcp_congestion_control": "reno",
           "net.ipv4.tcp_rmem": "4096 65536 262144",
           "net.ipv4.tcp_wmem": "4096 16384 262144"}


def run_wanprobe_json(end, *args: str, timeout_s: float = 180) -> dict:
    """Run ``wanprobe ARGS --json`` inside one lab namespace and parse its one JSON document."""
    r = end.run([sys.executable, "-m", "wanprobe", *args, "--json"], capture_output=True,
                text=True, timeout=timeout_s)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or [f"failed (exit status {r.returncode})"])[-1]
        raise WanprobeError(f"lab: `wanprobe {' '.join(args[:2])}` in {end.name}: {last}")
    return json.loads(r.stdout)


def set_untuned(end) -> None:
    """Put the namespace ``end`` in the UNTUNED state (its own sysctls; per namespace)."""
    for key, value in UNTUNED.items():
        r = end.run(["sysctl", "-q", "-w", f"{key}={value}"], capture_output=True, text=True)
        if r.returncode != 0:
            raise WanprobeError(f"lab: cannot set {key} in {end.name}: {r.stderr.strip()}")


def start_reflector(lab) -> subprocess.Popen:
    """`wanprobe reflect` in lab namespace b, returned once it listens on TCP 862."""
    proc = lab.b.popen([sys.executable, "-m", "wanprobe", "reflect", "--bind", lab.b.addr],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        ss = lab.b.run(["ss", "-Hltn", "sport = :862"], capture_output=True, text=True)
        if ss.stdout.strip():
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise WanprobeError("lab: the reflector in the lab did not start")


def tune_both_ends(lab, state, report_path, *, verify: bool = False) -> tuple[dict, dict]:
    """Both plans made at ``lab.a`` from one report (each bound to its host's address) and
    applied at their own ends with ``tune apply --yes`` (journals in ``state``), the peer's
    first so that the local apply's ``--verify`` (with ``verify``) sees both ends tuned.
    Returns ({end: plan JSON}, {end: apply JSON})."""
    plans, applied = {}, {}
    for end, which in ((lab.b, "peer"), (lab.a, "local")):
        plan_path = f"{state}/plan-{which}.json"
        plans[end.name] = run_wanprobe_json(lab.a, "tune", "plan", "--report", str(report_path),
                                            "--host", which, "-o", plan_path)
        again = ("--verify", lab.b.addr) if verify and which == "local" else ()
        applied[end.name] = run_wanprobe_json(end, "tune", "apply", plan_path, "--yes",
                                              "--state-dir", str(state), *again)
    return plans, applied
