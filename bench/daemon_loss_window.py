"""Issue 36: a three-peer daemon's windowed loss against the loss set on the lab, and its loss
regression not flapping on binomial noise.

One multipath lab (wanprobe/lab/multipath.py) with three paths at 0, 0.5 and 3 % forward loss;
three reflectors in b, each on an address pinned to one path (MultipathLab.pin); one daemon in a
probing all three in sessions of 10 probes. Every ``--sample`` seconds after the first short
window, /metrics (scraped inside a) gives each peer's windowed loss per direction
(``wanprobe_loss_window_ratio``, ``_probes``): does its 95 % interval hold the rate the lab
loses? At the end: the whole run's counts (``wanprobe_probe_packets_{sent,lost}_total``) with a
99.9 % interval, and how often each peer's loss regression fired and cleared (the daemon's
``wanprobe_regressions_total`` and its "regression cleared" log lines).

    python bench/daemon_loss_window.py --minutes 30          # the issue's soak
    python bench/daemon_loss_window.py --minutes 3 --short 60 --json   # tests/test_loss_window_lab.py

Root; nothing outside the lab's namespaces is touched; every process and namespace is removed,
also on failure.
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

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import lacks_root, parser, span

from wanprobe.lab.multipath import ADDR_A, MultipathLab
from wanprobe.lab.settings import LinkSettings
from wanprobe.probe.stats import wilson_interval

LOSSES = {"clean": 0.0, "half-pct": 0.005, "three-pct": 0.03}   # peer name -> forward loss
Z999 = 3.29    # two-sided 99.9 %: the whole-run check (three peers × two directions)
PORT = 9873


def _toml(state: Path, short_s: int, interval_s: float, loss_window: int,
          peers: list[tuple[str, str]]) -> str:
    lines = ["[daemon]", f'state_dir = "{state}"', f'metrics_listen = "127.0.0.1:{PORT}"',
             f'reflector_listen = ["{ADDR_A}:862"]', 'log_format = "logfmt"',
             "[probe]", f'interval = "{interval_s:g}s"', 'jitter = "100ms"', "count = 10",
             'packet_interval = "20ms"', 'timeout = "500ms"',
             "[counters]", 'interval = "10s"',
             "[baseline]", f'loss_short = "{short_s}s"', f"loss_window = {loss_window}"]
    for name, addr in peers:
        lines += ["[[peers]]", f'name = "{name}"', f'address = "{addr}"', 'site = "lab"',
                  'methods = ["stamp"]']
    return "\n".join(lines) + "\n"


def _scrape(lab: MultipathLab) -> str:
    code = ("import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("
            f"'http://127.0.0.1:{PORT}/metrics', timeout=5).read().decode())")
    r = lab.a.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    return r.stdout


def _series(text: str, name: str) -> dict[tuple, float]:
    """{(peer, direction or metric, bound): value} of one family (the labels this bench reads;
    None where a series has no such label)."""
    out = {}
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        labels = dict(kv.split("=", 1) for kv in line[len(name) + 1:line.rindex("}")].split(",")
                      if "=" in kv)
        labels = {k: v.strip('"') for k, v in labels.items()}
        key = (labels.get("peer"), labels.get("direction", labels.get("metric")),
               labels.get("bound"))
        out[key] = float(line.rsplit(" ", 1)[1])
    return out


def _sample(text: str, peers: dict[str, float]) -> dict[str, dict]:
    ratio = _series(text, "wanprobe_loss_window_ratio")
    probes = _series(text, "wanprobe_loss_window_probes")
    out = {}
    for peer, rate in peers.items():
        for d, want in (("forward", rate), ("reverse", 0.0)):
            lo, hi = ratio.get((peer, d, "ci95_low")), ratio.get((peer, d, "ci95_high"))
            out[f"{peer}/{d}"] = {"estimate": ratio.get((peer, d, "estimate")), "ci95": [lo, hi],
                                  "probes": probes.get((peer, d, None)), "set": want,
                                  "holds": lo is not None and lo <= want <= hi}
    return out


def _whole_run(text: str, peers: dict[str, float]) -> dict[str, dict]:
    sent = _series(text, "wanprobe_probe_packets_sent_total")
    lost = _series(text, "wanprobe_probe_packets_lost_total")
    regressions = _series(text, "wanprobe_regressions_total")
    out = {}
    for peer, rate in peers.items():
        n = int(sent.get((peer, None, None), 0))
        fwd = int(lost.get((peer, "forward", None), 0))
        rev = int(lost.get((peer, "reverse", None), 0))
        f_lo, f_hi = wilson_interval(fwd, n, Z999)
        r_lo, r_hi = wilson_interval(rev, n - fwd, Z999)
        out[peer] = {"set": rate, "sent": n, "forward_lost": fwd, "reverse_lost": rev,
                     "forward_ci999": [round(f_lo, 5), round(f_hi, 5)],
                     "reverse_ci999": [round(r_lo, 5), round(r_hi, 5)],
                     "forward_holds": f_lo <= rate <= f_hi, "reverse_holds": r_lo <= 0.0 <= r_hi,
                     "loss_fired": int(regressions.get((peer, "loss", None), 0))}
    return out


def run(minutes: float, *, short_s: int = 300, sample_s: float = 30.0, rtt_ms: float = 40.0,
        interval_s: float = 2.0, loss_window: int = 60) -> dict:
    """The soak; a dict of every sample and the whole-run figures (see the module docstring)."""
    lab = MultipathLab(f"lw{os.getpid() % 100000}", [
        LinkSettings(rtt_ms=rtt_ms, loss_ab=loss, rate_bps=100e6) for loss in LOSSES.values()],
        ecmp=[0])
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp, lab:
        peers = {}
        for i, (name, loss) in enumerate(LOSSES.items()):
            ep = lab.pin(f"198.18.2.{11 + i}", i)
            peers[name] = (ep.addr, loss)
            procs.append(lab.b.popen([sys.executable, "-m", "wanprobe", "reflect", "--bind",
                                      ep.addr], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL))
        cfg = Path(tmp, "wanprobe.toml")
        cfg.write_text(_toml(Path(tmp, "state"), short_s, interval_s, loss_window,
                             [(n, a) for n, (a, _) in peers.items()]))
        log = open(Path(tmp, "daemon.log"), "w+")  # noqa: SIM115 (closed below)
        try:
            daemon = lab.a.popen([sys.executable, "-m", "wanprobe", "daemon", "--config",
                                  str(cfg)], stdout=log, stderr=subprocess.STDOUT)
            procs.append(daemon)
            rates = {n: r for n, (_, r) in peers.items()}
            samples, t0 = [], time.monotonic()
            time.sleep(short_s)
            while time.monotonic() - t0 < minutes * 60:
                if daemon.poll() is not None:
                    raise RuntimeError(f"the daemon exited {daemon.returncode}")
                samples.append({"t_s": round(time.monotonic() - t0), **_sample(_scrape(lab), rates)})
                time.sleep(sample_s)
            final = _whole_run(_scrape(lab), rates)
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(20)
            log.seek(0)
            text = log.read()
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
            log.close()
    for peer, f in final.items():
        f["loss_cleared"] = sum(1 for line in text.splitlines() if "regression cleared" in line
                                and f"peer={peer} " in line + " " and "metric=loss" in line)
    return {"minutes": minutes, "short_s": short_s, "rtt_ms": rtt_ms, "loss_window": loss_window,
            "interval_s": interval_s, "samples": samples,
            "whole_run": final, "tracebacks": text.count("Traceback")}


def _print(r: dict) -> None:
    print(f"three-peer daemon, {r['minutes']:g} min, RTT {r['rtt_ms']:g} ms, sessions of 10 "
          f"probes every {r['interval_s']:g} s, short window {r['short_s']} s, loss_window "
          f"{r['loss_window']} sessions; {len(r['samples'])} samples of /metrics")
    keys = [k for k in r["samples"][0] if k != "t_s"] if r["samples"] else []
    for k in keys:
        xs = [s[k] for s in r["samples"] if s[k]["estimate"] is not None]
        held = sum(s[k]["holds"] for s in r["samples"])
        est = span((x["estimate"] * 100 for x in xs), ".2f") if xs else "-"
        n = span((x["probes"] for x in xs), ".0f") if xs else "-"
        print(f"  {k:22s} set {xs[0]['set'] * 100 if xs else 0:5.2f} %  windowed {est} % over "
              f"{n} probes; 95 % interval held the set rate in {held}/{len(r['samples'])} samples")
    for peer, f in r["whole_run"].items():
        print(f"  {peer}: whole run {f['forward_lost']}/{f['sent']} forward, 99.9 % interval "
              f"{f['forward_ci999'][0] * 100:.2f}-{f['forward_ci999'][1] * 100:.2f} % (set "
              f"{f['set'] * 100:g} %: {'holds' if f['forward_holds'] else 'MISSES'}); reverse "
              f"{f['reverse_lost']} lost; loss regression fired {f['loss_fired']}, cleared "
              f"{f['loss_cleared']}")


def main() -> int:
    args = parser(__doc__, ("--minutes", 30.0, "soak length"),
                  ("--short", 300, "the daemon's short loss window, seconds"),
                  ("--sample", 30.0, "seconds between /metrics samples"),
                  ("--rtt", 40.0, "lab RTT, ms"),
                  ("--interval", 2.0, "seconds between one peer's probe sessions"),
                  ("--loss-window", 60, "the daemon's [baseline] loss_window, sessions"),
                  ("--json", False, "print one JSON object"),
                  first_line=True).parse_args()
    if lacks_root():
        return 1
    # SIGTERM (a timeout, a kill) unwinds through run()'s cleanup like ^C does
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    r = run(args.minutes, short_s=args.short, sample_s=args.sample, rtt_ms=args.rtt,
            interval_s=args.interval, loss_window=args.loss_window)
    if args.json:
        print(json.dumps(r))
    else:
        _print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
