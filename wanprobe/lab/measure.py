"""Measure a running lab with independent tools (iputils ping, iperf3) — used by
``wanprobe demo`` and the capacity bench to show measured figures next to the settings."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass

from wanprobe.errors import LabError

_RTT = re.compile(r"time=([\d.]+) ms")
_COUNTS = re.compile(r"(\d+) packets transmitted, (\d+) received")


def parse_ping_rtts_ms(output: str) -> list[float]:
    """Per-reply RTTs from iputils ping output."""
    return [float(x) for x in _RTT.findall(output)]


def parse_ping_counts(output: str) -> tuple[int, int]:
    """(transmitted, received) from the iputils ping summary line."""
    m = _COUNTS.search(output)
    if not m:
        raise LabError("ping printed no summary line")
    return int(m.group(1)), int(m.group(2))


def median(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


@dataclass(frozen=True)
class PingResult:
    probes: int
    replies: int
    rtt_median_ms: float | None
    rtt_min_ms: float | None

    @property
    def loss_ratio(self) -> float:
        return 1 - self.replies / self.probes if self.probes else 0.0

    def to_json(self) -> dict:
        return {**asdict(self), "loss_ratio": self.loss_ratio}


@dataclass(frozen=True)
class IperfResult:
    seconds: float
    received_bits_per_second: float
    retransmits: int | None

    def to_json(self) -> dict:
        return asdict(self)


def ping(lab, count: int, interval_s: float, *, size: int = 56, wait_s: float = 2.0) -> PingResult:
    """iputils ping from namespace a to b."""
    argv = ["ping", "-n", "-q" if count > 200 else "-D", "-c", str(count), "-i", f"{interval_s:g}",
            "-s", str(size), "-W", f"{wait_s:g}", lab.b.addr]
    r = lab.a.run(argv, capture_output=True, text=True, timeout=count * interval_s + 30)
    sent, received = parse_ping_counts(r.stdout)
    rtts = parse_ping_rtts_ms(r.stdout)
    if not rtts and received:
        m = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)/", r.stdout)  # -q: only min/avg/max
        rtts = [float(m.group(2))] if m else []
    return PingResult(sent, received, median(rtts), min(rtts) if rtts else None)


def iperf3(lab, seconds: float, *extra: str) -> IperfResult:
    """iperf3 TCP from namespace a to a server in b; receiver-side rate."""
    if shutil.which("iperf3") is None:
        raise LabError("iperf3 is not installed (apt-get install iperf3)")
    server = lab.b.popen(["iperf3", "-s", "-1", "-B", lab.b.addr],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(lab.b, 5201)
        r = lab.a.run(["iperf3", "-c", lab.b.addr, "-t", f"{seconds:g}", "-J", *extra],
                      capture_output=True, text=True, timeout=seconds + 30)
        try:
            doc = json.loads(r.stdout)
        except ValueError:
            raise LabError(f"iperf3 failed: {' '.join(r.stderr.split())[:200]}") from None
        if "error" in doc:
            raise LabError(f"iperf3 failed: {doc['error']}")
        end = doc["end"]
        return IperfResult(seconds, end["sum_received"]["bits_per_second"],
                           end["sum_sent"].get("retransmits"))
    finally:
        server.kill()
        server.wait()


def _wait_listening(ep, port: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = ep.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True)
        if r.stdout.strip():
            return
        time.sleep(0.05)
    raise LabError(f"iperf3 server in {ep.name} did not start listening")
