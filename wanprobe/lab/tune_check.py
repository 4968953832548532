"""Tuned vs oracle on one lab link (issue 13): how close wanprobe's plans get to the best a host
can do, measured with the same tool in the same run.

- oracle: iperf3 with bbr (``-C bbr``) and generous buffers — tcp_rmem/tcp_wmem max 64 MiB at
  both ends (512 MiB for a line-rate point, ``oracle_buffer``), so autotuning may grow that far
  (net.core.rmem_max, which caps ``iperf3 -w``, cannot be raised from a lab namespace);
- tuned: both ends untuned (reno, 256 KiB, as the demo), then ``wanprobe diagnose`` →
  ``tune plan --host local|peer`` → ``tune apply`` at each end, then the same iperf3 run without
  ``-C`` (the host's tuned default cc).

Both sides leave out ``omit_s`` of ramp-up (iperf3 ``-O``) and take the best of two runs.
Everything happens inside the lab's namespaces; the tuning is rolled back before the lab goes
down, and ``rollback_exact`` says whether every sysctl the plans touched is back at its untuned
value at both ends.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tuners.sysctl import SPECS
from wanprobe.lab import measure, netns

ORACLE_BUFFER = "4096 131072 67108864"
LINE_RATE_ORACLE_BUFFER = "4096 131072 536870912"  # 512 MiB: no host limit at 2-5 Gbit/s

@dataclass(frozen=True)
class TunePoint:
    rtt_ms: float
    loss: float
    rate_bps: float
    oracle_bits_per_second: float
    tuned_bits_per_second: float
    before_bits_per_second: float
    tcp_rmem_max_bytes: int | None     # applied on the receiver (the peer)
    measured_bdp_bytes: float | None   # report capacity × STAMP min RTT
    tuned_cc: str | None = None        # the sender's default cc after tuning
    rollback_exact: bool | None = None  # every key the plans touched restored at both ends
    plan_manual: tuple[str, ...] = ()  # what the plans leave to the operator (NCCL sockets ...)

    @property
    def tuned_to_oracle(self) -> float:
        return self.tuned_bits_per_second / self.oracle_bits_per_second

    @property
    def buffer_to_bdp(self) -> float | None:
        if not self.tcp_rmem_max_bytes or not self.measured_bdp_bytes:
            return None
        return self.tcp_rmem_max_bytes / self.measured_bdp_bytes

    def to_json(self) -> dict:
        return {**asdict(self), "tuned_to_oracle": self.tuned_to_oracle,
                "buffer_to_bdp": self.buffer_to_bdp}


def _iperf(lab, seconds: float, omit_s: float, *extra: str, reps: int = 2) -> float:
    """Best of ``reps`` iperf3 runs: on a shared machine a CPU hiccup in the lab's userspace
    delay line only ever lowers a run, so the best run is the link's figure for each side."""
    return max(measure.iperf3(lab, seconds + omit_s, "-O", f"{omit_s:g}", *extra
                              ).received_bits_per_second for _ in range(reps))


def _sysctl(node, key: str, value: str) -> None:
    node.run(["sysctl", "-q", "-w", f"{key}={value}"], check=True, capture_output=True)


def _tune_both(lab, state: Path) -> tuple[dict, dict]:
    """diagnose in a, plans for both hosts, applied at each end; the report and the plans."""
    from wanprobe.lab.scenario import run_wanprobe_json, tune_both_ends

    report = run_wanprobe_json(lab.a, "diagnose", lab.b.addr, "--quick")
    path = state / "report.json"
    path.write_text(json.dumps(report))
    plans, _applied = tune_both_ends(lab, state, path)
    return report, plans


def _sysctls(end, keys: set[str]) -> dict[str, str]:
    out = {}
    for key in sorted(keys):
        r = end.run(["sysctl", "-n", key], capture_output=True, text=True)
        out[key] = " ".join(r.stdout.split()) if r.returncode == 0 else "?"
    return out


def run_point(lab_name: str, *, rtt_ms: float, loss: float, rate_bps: float = 100e6,
              seconds: float = 4.0, omit_s: float = 2.0,
              oracle_buffer: str = ORACLE_BUFFER) -> TunePoint:
    """Oracle, then tuned, on one lab link (see module doc)."""
    from wanprobe.lab import Lab
    from wanprobe.lab.scenario import run_wanprobe_json, set_untuned, start_reflector
    from wanprobe.report.document import Report

    state = Path(tempfile.mkdtemp(prefix="wanprobe-tunecheck-"))
    try:
        with Lab(name=lab_name, rtt_ms=rtt_ms, loss=loss, rate_bps=rate_bps) as lab:
            for end in (lab.a, lab.b):
                _sysctl(end, "net.ipv4.tcp_rmem", oracle_buffer)
                _sysctl(end, "net.ipv4.tcp_wmem", oracle_buffer)
            oracle = _iperf(lab, seconds, omit_s, "-C", "bbr")
            for end in (lab.a, lab.b):
                set_untuned(end)
            before = _iperf(lab, seconds, omit_s, reps=1)
            untuned = {end.name: _sysctls(end, set(SPECS)) for end in (lab.a, lab.b)}
            reflector = start_reflector(lab)
            try:
                report, plans = _tune_both(lab, state)
            finally:
                netns.stop(reflector)
            tuned = _iperf(lab, seconds, omit_s)
            cc = lab.a.run(["sysctl", "-n", "net.ipv4.tcp_congestion_control"],
                           capture_output=True, text=True).stdout.strip() or None
            rmem = lab.b.run(["sysctl", "-n", "net.ipv4.tcp_rmem"], capture_output=True,
                             text=True).stdout.split()
            for end in (lab.b, lab.a):
                run_wanprobe_json(end, "tune", "rollback", "--state-dir", str(state))
            exact = all(_sysctls(end, set(SPECS)) == untuned[end.name] for end in (lab.a, lab.b))
    finally:
        shutil.rmtree(state, ignore_errors=True)
    path = Report.from_json(report).measured.path
    cap = path.capacity.bits_per_second if path and path.capacity else None
    rtt = path.rtt_min_ms if path else None
    manual = tuple(f"{x['key']}={x['value']}" for p in plans.values()
                   for x in p.get("manual", []))
    return TunePoint(rtt_ms, loss, rate_bps, oracle, tuned, before,
                     int(rmem[2]) if len(rmem) == 3 else None,
                     cap * rtt / 8e3 if cap and rtt else None, cc, exact, manual)


def lab_name(tag: str) -> str:
    return f"tc{os.getpid() % 100000}{tag}"[:12]
