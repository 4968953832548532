"""Record a training job's steps: one JSON line per step, to a file or to the local daemon.

Usage, in the training loop (torch stays the job's dependency, never wanprobe's)::

    from wanprobe.job.recorder import StepRecorder

    rec = StepRecorder("steps.jsonl", rank=rank, job="llama-70b")   # or socket_path=...
    for n, batch in enumerate(loader):
        with rec.step(n):
            loss = model(batch).backward()
            with rec.comm():                 # or: ddp.register_comm_hook(None, rec.ddp_hook())
                dist.all_reduce(grads)
            opt.step()
    rec.close()

A line is ``{"step": n, "start": unix_s, "end": unix_s, "comm_s": s, "rank": r, "job": name}``
(``comm_s`` and ``rank`` only when known). ``start``/``end`` are wall-clock (``time.time``)
to join with the daemon's path events; the duration is taken from ``time.monotonic`` so a clock
step during a step does not change it (``end = start + duration``). Communication is the union
of the timed spans inside the step: overlapping DDP buckets count once.

Cost per step: two clock reads per span and one ``write`` (file, line-buffered) or one
non-blocking ``sendto`` (socket: the daemon's socket queues ``net.unix.max_dgram_qlen``
datagrams, 10 by default, so a daemon busy for ten steps loses the next ones; ``dropped``
counts what the socket refused, and the job never waits). bench/job_events.py measures the
recorder against the step time in the same steps (0.02-0.04 %).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

MAX_LINE_BYTES = 4096   # one datagram / one line; the daemon refuses longer


class StepRecorder:
    """One job's steps on one rank (module docstring). Not thread-safe across steps; ``comm``
    spans may come from other threads (DDP's hook callbacks): they are appended under the GIL."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, socket_path: str | None = None,
                 rank: int | None = None, job: str | None = None,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if (path is None) == (socket_path is None):
            raise ValueError("StepRecorder needs exactly one of a path or a socket_path")
        self.rank, self.job = rank, job
        self._clock, self._mono = clock, monotonic
        self._file: TextIO | None = None
        self._sock: socket.socket | None = None
        self._addr = socket_path
        self._spans: list[tuple[float, float]] = []
        self.dropped = 0
        if path is not None:
            self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        else:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)

    @contextmanager
    def step(self, n: int) -> Iterator[None]:
        """Time step ``n``; the line is written when it ends (also when it raises)."""
        self._spans = []
        wall, t0 = self._clock(), self._mono()
        try:
            yield
        finally:
            self.record(n, wall, self._mono() - t0, _union(self._spans) if self._spans else None)

    @contextmanager
    def comm(self) -> Iterator[None]:
        """Time one communication span inside the current step."""
        t0 = self._mono()
        try:
            yield
        finally:
            self._spans.append((t0, self._mono()))

    def add_comm(self, start_monotonic: float, end_monotonic: float) -> None:
        """A span timed elsewhere (``time.monotonic`` values)."""
        self._spans.append((start_monotonic, end_monotonic))

    def ddp_hook(self) -> Callable[[Any, Any], Any]:
        """A DDP communication hook (``register_comm_hook(None, rec.ddp_hook())``): each
        bucket all-reduced and averaged like DDP's default, its span from the hook's call to the
        future's completion."""
        import torch.distributed as dist  # the job's dependency, imported only when asked

        def hook(state: Any, bucket: Any) -> Any:
            t0 = self._mono()
            tensor = bucket.buffer()
            fut = dist.all_reduce(tensor, async_op=True).get_future()

            def done(f: Any) -> Any:
                self.add_comm(t0, self._mono())
                return f.value()[0].div_(dist.get_world_size())

            return fut.then(done)

        import torch

        # DDP reads these through inspect.signature (this module's annotations are strings)
        hook.__annotations__ = {"state": object, "bucket": dist.GradBucket,  # type: ignore[attr-defined]
                                "return": torch.futures.Future[torch.Tensor]}
        return hook

    def record(self, n: int, start: float, duration_s: float, comm_s: float | None) -> None:
        """Write one step's line (``recorder`` format, module docstring)."""
        line: dict[str, Any] = {"step": int(n), "start": start, "end": start + duration_s}
        if comm_s is not None:
            line["comm_s"] = round(comm_s, 6)
        if self.rank is not None:
            line["rank"] = int(self.rank)
        if self.job is not None:
            line["job"] = self.job
        text = json.dumps(line, separators=(",", ":"))
        if self._file is not None:
            self._file.write(text + "\n")
            return
        assert self._sock is not None and self._addr is not None
        try:
            self._sock.sendto(text.encode()[:MAX_LINE_BYTES], self._addr)
        except OSError:     # no daemon, or its queue full: the job never waits for wanprobe
            self.dropped += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._sock is not None:
            self._sock.close()

    def __enter__(self) -> StepRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _union(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of ``spans`` (overlapping buckets count once)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total
