#!/usr/bin/env python3
"""How much drawing the daemon's page delays its event loop, measured inside the daemon.

A daemon with N peers (default 1,000; injected probes answering in 10 ms, so no root or network
is needed) over a history of 24 h x N peers (one session a minute, 1.44 M rows at 1,000), and a
coroutine on its loop that sleeps 10 ms and records how late it wakes. First ``--seconds`` with
no viewer, then the same with ``/`` rendered back to back (the page cache turned off: a render
per GET, far more than the one per probe interval a viewer causes). Prints the lateness
percentiles of both phases and the render times; repeat ``--runs`` times for ranges.

    python bench/pictures_loop_lag.py [--peers 1000] [--seconds 15] [--runs 3]
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import parser  # noqa: E402
from pictures_page import addresses, fill_history  # noqa: E402 - the same history


def _doc() -> dict:
    return {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "rtt_ms": {"min": 29.9, "p50": 30.1, "p90": 30.5, "p99": 31.0, "max": 32.0},
            "loss": {"sent": 10, "received": 10, "ratio": 0.0}}


class _NoReflector:
    async def start(self, listen):
        pass

    async def close(self):
        pass


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1e3


async def one_run(state_dir: Path, n: int, seconds: float) -> dict:
    from wanprobe.daemon.config import parse_config
    from wanprobe.daemon.main import Daemon
    from wanprobe.pictures import routes

    cfg = parse_config({
        "daemon": {"state_dir": str(state_dir), "metrics_listen": "127.0.0.1:0"},
        "probe": {"interval": "10s", "jitter": "1s", "count": 10, "packet_interval": "1s",
                  "timeout": "1s"},
        "counters": {"enabled": False},
        "peers": [{"name": f"p{i}", "address": a} for i, a in enumerate(addresses(n))]})

    async def prober(peer, method, s):
        await asyncio.sleep(0.01)
        return _doc()

    d = Daemon(cfg, tuple(cfg.peers), prober=prober, reflector=_NoReflector())
    task = asyncio.create_task(d.run())
    await asyncio.sleep(12)   # every peer has a session
    host, port = d.metrics_address
    lag: dict[str, list[float]] = {"quiet": [], "render": []}
    phase = "quiet"

    async def ticker():
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            lag[phase].append(time.perf_counter() - t - 0.01)

    def get() -> float:
        t0 = time.perf_counter()
        urllib.request.urlopen(f"http://{host}:{port}/", timeout=120).read()
        return time.perf_counter() - t0

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(seconds)
    phase, renders = "render", []
    saved = routes.CACHE_MIN_S, routes.CACHE_MAX_S
    routes.CACHE_MIN_S = routes.CACHE_MAX_S = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        renders.append(await asyncio.to_thread(get))
    routes.CACHE_MIN_S, routes.CACHE_MAX_S = saved
    tick.cancel()
    d.stop_event.set()
    await task
    return {k: (pct(v, 0.5), pct(v, 0.99), max(v) * 1e3) for k, v in lag.items()} | {
        "renders": (len(renders), pct(renders, 0.5))}


def main() -> int:
    args = parser(__doc__, ("--peers", 1000), ("--seconds", 15.0), ("--runs", 3)).parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="wanprobe-lag-"))
    try:
        template = tmp / "template.sqlite3"
        fill_history(template, args.peers, 24.0, 60.0)
        print(f"{args.peers} peers, 24 h of history; loop lateness of a 10 ms sleep, ms "
              f"(p50 / p99 / max); {args.seconds:g} s per phase")
        for i in range(args.runs):
            state = tmp / f"run{i}"
            state.mkdir()
            shutil.copy(template, state / "history.sqlite3")
            r = asyncio.run(one_run(state, args.peers, args.seconds))
            q, w = r["quiet"], r["render"]
            print(f"  run {i + 1}: no viewer {q[0]:.2f} / {q[1]:.1f} / {q[2]:.0f}   "
                  f"rendering back to back {w[0]:.2f} / {w[1]:.1f} / {w[2]:.0f}   "
                  f"({r['renders'][0]} renders, median {r['renders'][1]:.0f} ms each)")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
