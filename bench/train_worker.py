"""One rank of a small data-parallel training run over torch.distributed gloo (started by
bench/validate_plan.py, one rank per lab host). Prints one JSON line on rank 0.

The model is an MLP of about ``--params`` parameters trained with SGD on fixed random data
(the loss is not the point: the timing is). First ``--calib`` steps without any exchange give
each rank's compute time per step (forward, backward, optimiser step; the slowest rank's mean
is reported). Then for each ``H:dtype`` in ``--configs``:

* H = 1 (synchronous data parallel): every step's gradients flattened, cast to ``dtype``,
  all-reduced and averaged before the optimiser step;
* H > 1 (local SGD, DiLoCo's exchange without its outer optimiser): H local steps, then the
  parameters flattened, cast, all-reduced and averaged — the same bytes as the pseudo-gradient.

One untimed exchange of the config's dtype first; then ``--periods`` sync periods are timed
(H = 1: ``--periods`` × 4 steps) from a barrier to the last exchange; the step time is the
wall time over the steps, and the compute time per step the time spent computing in them
(forward, backward, optimiser step), each the slowest rank's. The compute time is the user's
input to a plan (``--compute-ms``); measured in the same steps, it carries whatever the two
shared cores did to it, so the comparison tests the communication and its schedule.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _mlp(params: int, torch):
    """Three layers d → 4d → 4d → d with about ``params`` parameters (32d² + 9d)."""
    d = max(8, int((params / 32) ** 0.5))
    return torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.ReLU(),
                               torch.nn.Linear(4 * d, 4 * d), torch.nn.ReLU(),
                               torch.nn.Linear(4 * d, d)), d


def _exchange(tensors, dtype, world, dist, torch) -> None:
    """Flatten, cast, all-reduce (sum), average, copy back."""
    flat = torch.cat([t.reshape(-1) for t in tensors]).to(dtype)
    dist.all_reduce(flat)
    flat = flat.to(torch.float32) / world
    i = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[i:i + n].view_as(t))
        i += n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    for name in ("--rank", "--world", "--port", "--params"):
        ap.add_argument(name, type=int, required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--configs", required=True, help="comma-separated H:dtype, e.g. 1:fp32,4:bf16")
    ap.add_argument("--calib", type=int, default=6)
    ap.add_argument("--periods", type=int, default=3)
    ap.add_argument("--batch", type=int, default=512)
    args = ap.parse_args(argv)
    os.environ.pop("LOCAL_WORLD_SIZE", None)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(args.rank)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}:{args.port}",
                            rank=args.rank, world_size=args.world)
    net, d = _mlp(args.params, torch)
    params = list(net.parameters())
    n_params = sum(p.numel() for p in params)
    opt = torch.optim.SGD(params, lr=1e-3)
    x, y = torch.randn(args.batch, d), torch.randn(args.batch, d)

    def compute() -> None:
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(net(x), y).backward()

    busy = [0.0]   # compute time of this rank in the current config (forward, backward, SGD)

    def step(sync_grads: str | None) -> None:
        t = time.perf_counter()
        compute()
        busy[0] += time.perf_counter() - t
        if sync_grads:
            _exchange([p.grad for p in params], dtypes[sync_grads], args.world, dist, torch)
        t = time.perf_counter()
        opt.step()
        busy[0] += time.perf_counter() - t

    compute()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.calib):
        step(None)
    mine = torch.tensor([(time.perf_counter() - t0) / args.calib], dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    results = []
    for spec in args.configs.split(","):
        h_text, dtype = spec.split(":")
        h = int(h_text)
        steps = h * args.periods if h > 1 else 4 * args.periods
        with torch.no_grad():
            _exchange(params, dtypes[dtype], args.world, dist, torch)   # untimed
        dist.barrier()
        busy[0] = 0.0
        t = time.perf_counter()
        for i in range(1, steps + 1):
            if h == 1:
                step(dtype)
            else:
                step(None)
                if i % h == 0:
                    with torch.no_grad():
                        _exchange(params, dtypes[dtype], args.world, dist, torch)
        took = torch.tensor([(time.perf_counter() - t) / steps, busy[0] / steps],
                            dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        results.append({"sync_every": h, "dtype": dtype, "steps": steps,
                        "step_s": float(took[0]), "compute_s": float(took[1])})
    dist.barrier()
    if args.rank == 0:
        print(json.dumps({"params": n_params, "compute_s": float(mine[0]),
                          "results": results}), flush=True)
    # gloo's teardown may abort ("terminate called without an active exception") when the
    # peers close their pairs at different moments; every result is out: leave at once
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
