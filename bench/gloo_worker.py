"""One rank of the gloo all_reduce timing run (started by bench/validate_impact.py inside a
lab namespace). Prints one JSON line on rank 0: per size, the slowest rank's median, mean and
minimum time of ``--reps`` back-to-back all_reduce calls (after ``--warmup`` untimed ones)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--sizes", required=True, help="comma-separated byte counts")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args(argv)
    os.environ.pop("LOCAL_WORLD_SIZE", None)  # gloo's shared-memory path would skip the network
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}:{args.port}",
                            rank=args.rank, world_size=args.world)
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        t = torch.ones(max(1, size // 4), dtype=torch.float32)
        for _ in range(args.warmup):
            dist.all_reduce(t)
        dist.barrier()
        samples = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            samples.append(time.perf_counter() - t0)
        ordered = sorted(samples)
        median = (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2
        mine = torch.tensor([median, sum(samples) / len(samples), min(samples)], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        if float(t[0]) != float(args.world) ** (args.warmup + args.reps):
            print(f"rank {args.rank}: wrong all_reduce result {float(t[0])}", file=sys.stderr)
            return 1
        results.append({"size_bytes": t.numel() * 4, "median_s": float(mine[0]),
                        "mean_s": float(mine[1]), "min_s": float(mine[2])})
    if args.rank == 0:
        print(json.dumps({"results": results}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
