"""One rank of a gloo training run that records its steps with wanprobe's StepRecorder
(started by bench/job_events.py, one rank per lab namespace, each pinned to its own core).

Every step: forward, backward and SGD on an MLP of about ``--params`` parameters with a batch
of ``--batch`` (the compute), then the gradients all-reduced (fp32) inside ``rec.comm()``.
Runs until ``--seconds`` have passed (rank 0 decides; the others follow through a broadcast
flag each step) and writes one JSON line per step to ``--steps`` (and, with ``--socket``, sends
it to the daemon's ``[job]`` socket too). The recorders' own cost is
measured in the same steps: the wall time of each ``with rec.step`` and ``with rec.comm`` less
the time of their bodies, over the step times; rank 0 prints it as one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    for name in ("--rank", "--world", "--port", "--params", "--batch"):
        ap.add_argument(name, type=int, required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--steps", required=True)
    ap.add_argument("--socket", help="also send the steps to a daemon's [job] socket")
    args = ap.parse_args(argv)
    os.environ.pop("LOCAL_WORLD_SIZE", None)
    import torch
    import torch.distributed as dist

    from wanprobe.job.recorder import StepRecorder

    torch.set_num_threads(1)
    torch.manual_seed(args.rank)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}:{args.port}",
                            rank=args.rank, world_size=args.world)
    d = max(8, int((args.params / 32) ** 0.5))
    net = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.ReLU(),
                              torch.nn.Linear(4 * d, 4 * d), torch.nn.ReLU(),
                              torch.nn.Linear(4 * d, d))
    params = list(net.parameters())
    opt = torch.optim.SGD(params, lr=1e-4)
    x, y = torch.randn(args.batch, d), torch.randn(args.batch, d)
    flag = torch.zeros(1)
    rec = StepRecorder(args.steps, rank=args.rank, job="lab")
    live = StepRecorder(socket_path=args.socket, rank=args.rank, job="lab") if args.socket \
        else None
    overhead = total = 0.0
    end_at = time.time() + args.seconds
    n = 0
    while True:
        flag[0] = 1.0 if args.rank == 0 and time.time() >= end_at else 0.0
        dist.broadcast(flag, 0)
        if flag[0] > 0:
            break
        t0 = time.perf_counter()
        with rec.step(n), (live.step(n) if live else contextlib.nullcontext()):
            b0 = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            torch.nn.functional.mse_loss(net(x), y).backward()
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            c0 = time.perf_counter()
            with rec.comm(), (live.comm() if live else contextlib.nullcontext()):
                c1 = time.perf_counter()
                dist.all_reduce(flat)
                c2 = time.perf_counter()
            c3 = time.perf_counter()
            flat /= args.world
            i = 0
            for p in params:
                p.grad.copy_(flat[i:i + p.numel()].view_as(p))
                i += p.numel()
            opt.step()
            b1 = time.perf_counter()
        t1 = time.perf_counter()
        overhead += (t1 - t0) - (b1 - b0) + (c3 - c0) - (c2 - c1)
        total += t1 - t0
        n += 1
    rec.close()
    dropped = live.dropped if live else 0
    if live:
        live.close()
    mine = torch.tensor([overhead / max(total, 1e-9), float(n), float(dropped)],
                        dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    dist.barrier()
    if args.rank == 0:
        print(json.dumps({"steps": int(mine[1]), "recorder_share": float(mine[0]),
                          "dropped": int(mine[2])}), flush=True)
    sys.stderr.flush()
    os._exit(0)   # gloo's teardown may abort when the peers close at different moments


if __name__ == "__main__":
    sys.exit(main())
