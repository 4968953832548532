#!/usr/bin/env python3
"""A real torch.distributed gloo all-reduce against what `wanprobe ring` predicts for it, across
three lab sites (Taipei, Tokyo, US West; one host each, profile tpe-tyo-usw: 35/100/130 ms,
100-200 Mbit/s, clean links, reno in the hosts as bench/validate_impact.py has them).

Per run: `wanprobe ring` in gloo's direction (rank r sends to r-1: ring/predict.gloo_order, one
stream per hop like gloo's one connection), ring/predict.predict_gloo for each size, then gloo
(bench/gloo_worker.py, one rank per host) for each size. Prints measured/predicted bus bandwidth
per size over the runs, and gloo's share of the ring's rate. tests/test_ring_gloo.py runs one
run of one size through ``measure``. Needs root and torch's CPU wheel.

Usage: python bench/ring_vs_gloo.py [--sizes 67108864 268435456] [--runs 3] [--json]
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from common import lacks_root, parser, span  # noqa: E402

from wanprobe.lab import netns  # noqa: E402
from wanprobe.lab.sites import SitesLab, sites_profile  # noqa: E402
from wanprobe.ring.model import RingResult  # noqa: E402
from wanprobe.ring.predict import gloo_order, predict_gloo  # noqa: E402

WORKER = REPO / "bench" / "gloo_worker.py"
KEY = "ring-gloo-shared-key-0123456789"
RANKS = ("tpe1", "tyo1", "usw1")
CC = "reno"  # bbr paces gloo's bursts at a lagging estimate, which the model leaves out


def run_ranks(lab, ranks, worker: Path, args: list[str], *, port: int,
              what: str = "gloo rank") -> dict:
    """One torch.distributed rank of ``worker`` per host (rank order ``ranks``, rendezvous at
    the first), each given ``args`` after its rank, world, master and port; rank 0's last
    stdout line as JSON. Every rank is waited for (killed on any failure)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_WORLD_SIZE", "PMI_SIZE")}
    env.update(GLOO_SOCKET_IFNAME="lan0", PYTHONPATH=str(REPO))
    master = lab.host(ranks[0]).addr
    procs = [lab.host(h).popen([sys.executable, str(worker), "--rank", str(r), "--world",
                                str(len(ranks)), "--master", master, "--port", str(port), *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r, h in enumerate(ranks)]
    try:
        outs = [p.communicate(timeout=900) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        if p.returncode != 0:
            raise RuntimeError(f"{what} {rank} exited {p.returncode}: {err.strip()[-300:]}")
    return json.loads(outs[0][0].strip().splitlines()[-1])


def run_gloo(lab, ranks, sizes, *, reps: int, warmup: int, port: int = 29517) -> list[dict]:
    """One gloo rank per host (rank order ``ranks``); rank 0's result per size."""
    return run_ranks(lab, ranks, WORKER, ["--sizes", ",".join(map(str, sizes)), "--reps",
                                          str(reps), "--warmup", str(warmup)], port=port)["results"]


def lab_of(name: str, profile: str = "tpe-tyo-usw", rate_bps: float | None = None) -> SitesLab:
    """One host per site of ``profile``, its links without loss (the gloo runs measure time,
    not loss recovery), at ``rate_bps`` when given (else the profile's)."""
    sites, links = sites_profile(profile, hosts=1)
    rate = {} if rate_bps is None else {"rate_bps": rate_bps}
    return SitesLab(name, sites, {k: v.changed(loss=0.0, **rate) for k, v in links.items()})


def three_sites(name: str) -> SitesLab:
    return lab_of(name, "tpe-tyo-usw")


def ring_of(lab: SitesLab, key: Path, ranks=RANKS, *, sysctls: tuple[str, ...] = (),
            duration: str = "3s", omit: str = "1s") -> RingResult:
    """On a lab that is up: ``CC`` (and ``sysctls``) in every host, reflectors, then the ring
    test in gloo's direction for ``ranks`` (one stream per hop, like gloo's one connection)."""
    for h in lab.hosts:
        h.run(["sysctl", "-q", "-w", f"net.ipv4.tcp_congestion_control={CC}", *sysctls],
              check=True)
    procs = []
    try:
        for h in lab.hosts:
            p = h.popen([sys.executable, "-m", "wanprobe", "reflect", "--bind", h.addr,
                         "--allow", "198.18.0.0/15", "--hmac-key-file", str(key)],
                        stderr=subprocess.PIPE, text=True)
            ready, _, _ = select.select([p.stderr], [], [], 30)
            if not ready or "STAMP on udp" not in p.stderr.readline():
                raise RuntimeError(f"reflector on {h.name} did not start")
            procs.append(p)
        order = [lab.host(h).addr for h in gloo_order(ranks)]
        r = lab.host(ranks[0]).run([sys.executable, "-m", "wanprobe", "ring", *order,
                                    "--hmac-key-file", str(key), "--streams", "1", "--duration",
                                    duration, "--omit", omit, "--no-best", "--json"],
                                   capture_output=True, text=True, timeout=180)
        if r.returncode != 0:
            raise RuntimeError(f"ring failed: {r.stderr.strip()}")
    finally:
        for p in procs:
            netns.stop(p, 10)
    return RingResult.from_json(json.loads(r.stdout))


def measure(lab: SitesLab, key: Path, sizes, *, reps: int = 2, warmup: int = 1) -> list[dict]:
    """On a lab that is up: the ring test, the predictions, gloo; one row per size with the
    measured and predicted bus bandwidth."""
    ring = ring_of(lab, key)
    got = run_gloo(lab, RANKS, sizes, reps=reps, warmup=warmup)
    rows = []
    for size, g in zip(sizes, got, strict=True):
        p = predict_gloo(ring, [lab.host(h).addr for h in RANKS], size)
        busbw = size * 8 * 2 * (len(RANKS) - 1) / len(RANKS) / g["median_s"]
        rows.append({"size_bytes": size, "median_s": g["median_s"], "busbw": busbw,
                     "predicted_s": p.time_s, "predicted_busbw": p.busbw_bits_per_second,
                     "ratio": busbw / p.busbw_bits_per_second,
                     "ring_bits_per_second": ring.ring_bits_per_second,
                     "gloo_share_of_ring": busbw / ring.ring_bits_per_second})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, ("--sizes", [64 * 2**20, 256 * 2**20]), ("--runs", 3),
                  ("--json", False)).parse_args(argv)
    if lacks_root():
        return 1
    runs = []
    with tempfile.TemporaryDirectory() as d:
        key = Path(d) / "key"
        key.write_text(KEY)
        key.chmod(0o600)
        for _ in range(args.runs):
            with three_sites("rgloo") as lab:
                runs.append(measure(lab, key, args.sizes))
    if args.json:
        print(json.dumps(runs, indent=2))
        return 0
    print(f"gloo all_reduce over 3 sites (35/100/130 ms), {len(runs)} runs:")
    for i, size in enumerate(args.sizes):
        rows = [run[i] for run in runs]
        print(f"  {size >> 20:5d} MiB: measured/predicted busbw {span(r['ratio'] for r in rows)}, "
              f"busbw {span((r['busbw'] / 1e6 for r in rows), '.1f')} Mbit/s, gloo's share of "
              f"the ring's rate {span(r['gloo_share_of_ring'] for r in rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
