#!/usr/bin/env python3
"""Slow training steps explained, in the lab: a gloo training run across the two ends of a
lab link (35 ms, 100 Mbit/s; rank 0 in namespace a on core 0, rank 1 in b on core 1) recording
its steps with wanprobe's StepRecorder, while wanprobe's daemon in a probes b every 0.5 s.
Events are injected in rounds, each for ``--event`` seconds followed by ``--quiet`` quiet ones,
with a quiet stretch of QUIET_STRETCH_S mid-run and at the end:

* ``loss``: 10 % loss a → b on the lab's delay line (a loss burst on one edge);
* ``queue``: a bulk TCP flow a → b (iperf3, reno) that keeps the link's shaper queue full (a
  standing queue of up to one BDP, and the link shared);
* ``reroute``: the link's RTT 35 → 180 ms (a route around a cut) and back;
* ``cpu``: two busy loops on rank 1's core in namespace b (CPU contention on one host).

Then ``wanprobe job explain --steps ... --state-dir ... --json`` on the steps and the daemon's
history. A slow step attributed ``path`` is right when it overlaps a loss, queue or reroute
window (its end extended by ``LINGER_S``: TCP recovers after the event), ``host`` when it
overlaps a cpu window. Precision: right attributions / all path and host attributions.
Recall: injected events with at least one slow step attributed right / injected events. A
``path`` attribution outside every window is a quiet-time path blame. Rank 0 also sends its
steps to the daemon's ``[job]`` socket: the daemon's own live attribution is scraped from its
/metrics at the end. Also the recorders' own share of the step time, measured in the same steps
(bench/job_worker.py). Needs root and torch's CPU wheel.

Usage: python bench/job_events.py [--rounds 5] [--event 1.0] [--quiet 1.5] [--runs 1] [--json]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from common import lacks_root, parser, span  # noqa: E402

WORKER = REPO / "bench" / "job_worker.py"
KINDS = ("loss", "queue", "reroute", "cpu")
PATH_KINDS = {"loss", "queue", "reroute"}
LINGER_S = 1.5
WARMUP_S = 8.0
QUIET_STRETCH_S = 5.0
RTT_MS, RATE_BPS = 35.0, 100e6
PARAMS, BATCH = 1_000_000, 4096        # ~4 MB exchanged and ~0.15-0.2 s of compute per step
DAEMON_TOML = """[daemon]
state_dir = "{state}"
metrics_listen = "127.0.0.1:9871"
reflector_listen = []
[probe]
interval = "500ms"
jitter = "50ms"
count = 40
packet_interval = "5ms"
timeout = "400ms"
[counters]
enabled = false
[job]
socket = "{sock}"
[throughput]
enabled = false
[[peers]]
name = "lab-b"
address = "{peer}"
site = "b"
methods = ["stamp"]
"""


def _popen(ns, argv, **kw):
    return ns.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


class Injector:
    """Starts and ends each kind of event on the lab; ``windows`` records (kind, start, end)."""

    def __init__(self, lab) -> None:
        self.lab = lab
        self.windows: list[tuple[str, float, float]] = []
        self._procs: list[subprocess.Popen] = []

    def _start(self, kind: str) -> None:
        lab = self.lab
        if kind == "loss":
            lab.update(loss_ab=0.10)
        elif kind == "reroute":
            lab.update(rtt_ms=180.0)
        elif kind == "queue":
            self._procs.append(_popen(lab.a, ["iperf3", "-c", lab.b.addr, "-t", "60",
                                              "-p", "5299"]))
        elif kind == "cpu":
            self._procs += [_popen(lab.b, ["taskset", "-c", "1", sys.executable, "-c",
                                           "while True: pass"]) for _ in range(2)]

    def _end(self, kind: str) -> None:
        if kind == "loss":
            self.lab.update(loss_ab=0.0)
        elif kind == "reroute":
            self.lab.update(rtt_ms=RTT_MS)
        for p in self._procs:
            p.kill()
            p.wait(10)
        self._procs = []

    def run(self, kind: str, seconds: float) -> None:
        start = time.time()
        self._start(kind)
        try:
            time.sleep(seconds)
        finally:
            self._end(kind)
            self.windows.append((kind, start, time.time()))

    def close(self) -> None:
        for p in self._procs:
            p.kill()
            p.wait(10)


def score(slow_steps: list[dict], windows: list[tuple[str, float, float]]) -> dict:
    """Precision, recall and quiet-time path blames (module docstring)."""
    def hits(s: dict, kinds: set[str]) -> list[int]:
        return [i for i, (k, a, b) in enumerate(windows)
                if k in kinds and s["start"] < b + LINGER_S and s["end"] > a]

    claimed = [s for s in slow_steps if s["attribution"] in ("path", "host")]
    right, found = 0, set()
    for s in claimed:
        got = hits(s, PATH_KINDS if s["attribution"] == "path" else {"cpu"})
        right += bool(got)
        found.update(got)
    quiet_path = [s["step"] for s in slow_steps if s["attribution"] == "path"
                  and not hits(s, set(KINDS))]
    missed = [windows[i][0] for i in range(len(windows)) if i not in found]
    return {"events": len(windows), "attributed": len(claimed), "right": right,
            "precision": right / len(claimed) if claimed else 0.0,
            "recall": len(found) / len(windows) if windows else 0.0,
            "missed": missed, "quiet_path_blames": quiet_path,
            "unexplained": sum(1 for s in slow_steps if s["attribution"] == "unexplained")}


SCRAPE = ("import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("
          "'http://127.0.0.1:9871/metrics', timeout=5).read().decode())")


def live_metrics(text: str) -> dict:
    """The daemon's job metrics for the lab job: steps and slow steps by attribution."""
    out: dict = {"slow": {}}
    for line in text.splitlines():
        if 'training_job="lab"' not in line or line.startswith("#"):
            continue
        value = float(line.rsplit(" ", 1)[1])
        if line.startswith("wanprobe_job_steps_total"):
            out["steps"] = value
        elif line.startswith("wanprobe_job_slow_steps_total"):
            out["slow"][line.split('attribution="')[1].split('"')[0]] = value
    return out


def quiet_steps(steps: Path, windows: list[tuple[str, float, float]]) -> int:
    """Steps (rank 0's) that overlap no event window, its end extended by LINGER_S."""
    lines = [json.loads(x) for x in steps.read_text().splitlines() if x.strip()]
    return sum(1 for x in lines if x.get("rank") == 0 and not any(
        x["start"] < b + LINGER_S and x["end"] > a for _, a, b in windows))


def run(lab, work: Path, *, rounds: int = 5, event_s: float = 2.0, quiet_s: float = 3.0,
        stretch_s: float = QUIET_STRETCH_S, port: int = 29561) -> dict:
    """On a lab that is up (plain two-namespace Lab at RTT_MS, RATE_BPS): the whole scenario."""
    state = work / "state"
    cfg = work / "wanprobe.toml"
    sock = work / "job.sock"
    cfg.write_text(DAEMON_TOML.format(state=state, peer=lab.b.addr, sock=sock))
    for ns in (lab.a, lab.b):
        ns.run(["sysctl", "-q", "-w", "net.ipv4.tcp_congestion_control=reno",
                "net.ipv4.tcp_slow_start_after_idle=0"], check=True)
    seconds = WARMUP_S + rounds * len(KINDS) * (event_s + quiet_s) + 2 * stretch_s
    env = {**{k: v for k, v in os.environ.items() if k not in ("LOCAL_WORLD_SIZE", "PMI_SIZE")},
           "GLOO_SOCKET_IFNAME": lab.a.ifname, "PYTHONPATH": str(REPO)}
    procs = [_popen(lab.b, [sys.executable, "-m", "wanprobe", "reflect", "--bind", lab.b.addr]),
             _popen(lab.b, ["iperf3", "-s", "-p", "5299"]),
             _popen(lab.a, [sys.executable, "-m", "wanprobe", "daemon", "--config", str(cfg)])]
    inj = Injector(lab)
    try:
        time.sleep(2.0)
        ranks = [_popen(ns, ["taskset", "-c", str(r), sys.executable, str(WORKER), "--rank",
                             str(r), "--world", "2", "--master", lab.a.addr, "--port", str(port),
                             "--params", str(PARAMS), "--batch", str(BATCH), "--seconds",
                             str(seconds), "--steps", str(work / f"steps-{r}.jsonl"),
                             *(["--socket", str(sock)] if r == 0 else [])], env=env)
                 for r, ns in enumerate((lab.a, lab.b))]
        time.sleep(WARMUP_S)
        for i in range(rounds):
            for kind in KINDS:
                inj.run(kind, event_s)
                time.sleep(quiet_s)
            if i == rounds // 2:
                time.sleep(stretch_s)   # a long quiet stretch mid-run, and one at the end
        outs = [p.communicate(timeout=seconds + 120) for p in ranks]
        for r, (p, (_, err)) in enumerate(zip(ranks, outs, strict=True)):
            if p.returncode != 0:
                raise RuntimeError(f"rank {r} exited {p.returncode}: {err.strip()[-300:]}")
        worker = json.loads(outs[0][0].strip().splitlines()[-1])
        time.sleep(3.0)   # the daemon attributes a slow step once its sessions are stored
        live = live_metrics(lab.a.run([sys.executable, "-c", SCRAPE], capture_output=True,
                                      text=True, timeout=30).stdout)
        procs[2].send_signal(signal.SIGTERM)
        procs[2].wait(20)
    finally:
        inj.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
    steps = work / "steps.jsonl"
    steps.write_text("".join((work / f"steps-{r}.jsonl").read_text() for r in (0, 1)))
    r = subprocess.run([sys.executable, "-m", "wanprobe", "job", "explain", "--steps",
                        str(steps), "--state-dir", str(state), "--json"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"job explain: {r.stderr.strip()}")
    doc = json.loads(r.stdout)
    return {**score(doc["slow_steps"], inj.windows), "steps": doc["steps"],
            "quiet_steps": quiet_steps(steps, inj.windows),
            "slow": doc["slow"], "by_attribution": doc["by_attribution"],
            "recorder_share": worker["recorder_share"], "dropped": worker["dropped"],
            "live": live, "explain": doc,
            "windows": inj.windows}


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, ("--rounds", 5), ("--event", 1.0), ("--quiet", 1.5), ("--runs", 1),
                  ("--json", False)).parse_args(argv)
    if lacks_root():
        return 1
    from wanprobe.lab import Lab

    results = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as d, Lab(name=f"jobev{os.getpid() % 1000}x{i}",
                                                      rtt_ms=RTT_MS, rate_bps=RATE_BPS) as lab:
            results.append(run(lab, Path(d), rounds=args.rounds, event_s=args.event,
                               quiet_s=args.quiet))
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "explain"} for r in results],
                         indent=2))
        return 0
    print(f"{len(results)} run(s), {results[0]['events']} injected events each:")
    print(f"  precision {span(r['precision'] for r in results)}, recall "
          f"{span(r['recall'] for r in results)}, quiet-time path blames "
          f"{span((len(r['quiet_path_blames']) for r in results), 'd')}")
    print(f"  slow steps {span((r['slow'] for r in results), 'd')} of "
          f"{span((r['steps'] for r in results), 'd')} ({span((r['quiet_steps'] for r in results), 'd')}"
          " in quiet time); recorder "
          f"{span((100 * r['recorder_share'] for r in results), '.3f')} % of the step time")
    for r in results:
        print(f"  missed: {', '.join(r['missed']) or 'none'}; by attribution {r['by_attribution']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
