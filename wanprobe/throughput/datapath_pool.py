"""The parent side of the data path: worker processes that move the streams' bytes.

A test side spreads its streams round-robin over ``worker_count()`` processes
(datapath_worker.py): one per stream up to the cores this process may run on
(``sched_getaffinity``) and the ``--cpus`` asked for. Processes, not threads: the data path then
never waits on the GIL, each worker's CPU time and run-queue wait are its own (getrusage,
/proc/<pid>/schedstat), and ``taskset`` on the tool confines its workers too (they inherit the
affinity mask).

The workers are spawned early (while the control handshake and the data connections are set up)
and are ready before the test starts, so their start-up time never falls inside the measured
interval. The parent keeps its copy of every stream socket (TCP_INFO sampling, sampler.py) and
reads the streams' counters from a shared memfd; it closes its copies when their worker exits.
"""

from __future__ import annotations

import json
import mmap
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from wanprobe.errors import ProbeError
from wanprobe.throughput import datapath_worker as wk
from wanprobe.throughput.tcp_info import parse_tcp_info

WORKER_PATH = Path(wk.__file__)
READY_TIMEOUT_S = 15.0   # interpreter start-up on a loaded 2-core host took up to 0.4 s
_EXIT_WAIT_S = 2.0
_WAKE_S = 0.25           # the reader looks at the abort flag at least this often
_FDS_PER_MESSAGE = 200   # below SCM_MAX_FD (253, include/net/scm.h)
# At most this many workers per test side, whatever the cores: 16 kernel-bound sendfile workers
# cover a 400 Gbit/s host (ESnet's 100G guidance is -P 12 across cores), and each costs ~6 MB
# of private memory (measured: RssAnon 4.9 MB at start plus its 1 MiB buffer), which the
# daemon's unit caps (systemd/wanprobe.service MemoryMax, TasksMax).
MAX_WORKERS = 16


def available_cores() -> int:
    """CPUs this thread may run on (its affinity mask: taskset, cgroup cpusets)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except OSError:
        return max(os.cpu_count() or 1, 1)


def _cpu_ids() -> list[int] | None:
    try:
        return sorted(os.sched_getaffinity(0))
    except OSError:
        return None


def worker_count(streams: int, cpus: int | None = None) -> int:
    """One worker per stream, up to the cores available, the ``cpus`` asked for and
    MAX_WORKERS."""
    return max(1, min(streams, available_cores(), cpus or MAX_WORKERS, MAX_WORKERS))


def _ratio(num_s: float | None, den_s: float) -> float | None:
    return None if num_s is None or den_s <= 0 else round(num_s / den_s, 4)


class DataWorkers:
    """``count`` worker processes for one test side; see the module docstring."""

    def __init__(self, count: int) -> None:
        self.procs: list[subprocess.Popen] = []
        self.ctls: list[socket.socket] = []
        self.exits: list[dict | None] = []
        self.streams: list = []
        self._by_worker: list[list[int]] = []
        self._counters: mmap.mmap | None = None
        self._reader: threading.Thread | None = None
        self._cpu0 = time.process_time()
        self.process_cpu_s: float | None = None
        try:
            for _ in range(count):
                parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                self.ctls.append(parent)
                try:
                    self.procs.append(subprocess.Popen(
                        [sys.executable, "-I", "-S", str(WORKER_PATH), str(child.fileno())],
                        pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                finally:
                    child.close()
        except OSError as exc:
            self.close()
            raise ProbeError(f"cannot start the data workers: {exc.strerror or exc}") from None
        self.exits = [None] * len(self.procs)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        """True once every worker runs (said ``ready``); False when one died or time ran out."""
        deadline = time.monotonic() + timeout_s
        for ctl in self.ctls:
            ctl.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                msg = json.loads(ctl.recv(4096) or b"{}")
            except (OSError, ValueError):
                return False
            if not msg.get("ready"):
                return False
        return True

    # ---- the test --------------------------------------------------------------------------
    def start(self, streams: Sequence, *, t_start: float, duration_s: float, max_bytes: int,
              abort: threading.Event, payload, grace_s: float,
              on_finished: Callable[[], None] | None) -> None:
        """Hand the streams to the workers (round-robin) and start them at ``t_start``."""
        self.streams = list(streams)
        n = len(self.procs)
        size = max(len(streams), 1) * wk.SLOT_WORDS * 8
        cfd = os.memfd_create("wanprobe-counters", os.MFD_CLOEXEC)
        try:
            os.ftruncate(cfd, size)
            self._counters = mmap.mmap(cfd, size)
            view = memoryview(self._counters).cast("q")
            self._by_worker = [list(range(w, len(streams), n)) for w in range(n)]
            go = {"t_start_ns": int(t_start * 1e9), "duration_s": duration_s,
                  "grace_s": grace_s, "max_bytes": max_bytes}
            for w, ctl in enumerate(self.ctls):
                ctl.settimeout(None)
                pfd = payload.fd if payload is not None else cfd
                socket.send_fds(ctl, [json.dumps({"setup": {
                    "payload_bytes": payload.size if payload is not None else 0,
                    "slots": len(streams)}}).encode()], [pfd, cfd])
                mine = self._by_worker[w]
                for i in range(0, len(mine), _FDS_PER_MESSAGE):
                    part = mine[i:i + _FDS_PER_MESSAGE]
                    specs = [{"slot": k, "sending": streams[k].sending} for k in part]
                    socket.send_fds(ctl, [json.dumps({"add": specs}).encode()],
                                    [streams[k].sock.fileno() for k in part])
                for k in mine:
                    streams[k].attach(view, k, worker_id=w)
                ctl.send(json.dumps({"go": go}).encode())
        except OSError as exc:  # a worker died between ready and start
            raise ProbeError(f"a data worker exited before the test started: "
                             f"{exc.strerror or exc}") from None
        finally:
            os.close(cfd)
        self._reader = threading.Thread(target=self._read_events, args=(abort, on_finished),
                                        name="wanprobe-datapath", daemon=True)
        for s in streams:
            s.thread = self._reader
        self._reader.start()

    def _read_events(self, abort: threading.Event, on_finished) -> None:
        """Collect the workers' reports; forward an abort; finish each worker's streams when it
        exits (or dies). Long because: one select loop over every worker's control socket."""
        sel = selectors.DefaultSelector()
        for w, ctl in enumerate(self.ctls):
            sel.register(ctl, selectors.EVENT_READ, w)
        live, aborted = set(range(len(self.ctls))), False
        try:
            while live:
                if abort.is_set() and not aborted:
                    aborted = True
                    for w in live:
                        self._tell(w, abort=True)
                for key, _ in sel.select(_WAKE_S):
                    w = key.data
                    try:
                        raw = self.ctls[w].recv(1 << 16)
                        msg = json.loads(raw) if raw else None
                    except (OSError, ValueError):
                        msg = None
                    if msg is not None and "done" in msg:
                        self._done(msg)
                        continue
                    if msg is not None and "exit" in msg:
                        self.exits[w] = msg["exit"]
                    elif msg is not None and "fatal" not in msg:
                        continue
                    error = None if msg and "exit" in msg else (
                        (msg or {}).get("fatal") or "data worker exited unexpectedly")
                    sel.unregister(self.ctls[w])
                    live.discard(w)
                    self._finish_worker(w, error)
        finally:
            sel.close()
            self.process_cpu_s = time.process_time() - self._cpu0
            self._freeze()
            if on_finished is not None:
                on_finished()

    def _tell(self, w: int, **msg) -> None:
        try:
            self.ctls[w].send(json.dumps(msg).encode())
        except OSError:
            pass

    def _done(self, msg: dict) -> None:
        try:
            s = self.streams[int(msg["done"])]
        except (IndexError, KeyError, TypeError, ValueError):
            return
        if msg.get("error") and not s.error:
            s.error = str(msg["error"])
        if msg.get("tcp_info"):
            try:
                s.final_tcp_info = parse_tcp_info(bytes.fromhex(msg["tcp_info"]))
            except ValueError:
                pass
        s.reported = True

    def _finish_worker(self, w: int, error: str | None) -> None:
        ex = self.exits[w] or {}
        elapsed = ex.get("elapsed_s") or 0.0
        run_ns, wait_ns = ex.get("run_ns"), ex.get("wait_ns")
        stats = {"worker_id": w, "cpu_s": ex.get("cpu_s"),
                 "busy_ratio": _ratio(ex.get("cpu_s"), elapsed),
                 "demand_ratio": (_ratio((run_ns + wait_ns) / 1e9, elapsed)
                                  if run_ns is not None and wait_ns is not None else None)}
        for k in self._by_worker[w] if self._by_worker else ():
            s = self.streams[k]
            if not getattr(s, "reported", False) and not s.error:
                s.error = error or "data worker ended without reporting the stream"
            s.cpu_s = ex.get("cpu_s") or 0.0
            s.worker = stats
            s.close_parent_copy()
            s.done.set()

    def _freeze(self) -> None:
        for s in self.streams:
            s.freeze()
        if self._counters is not None:
            try:
                self._counters.close()
            except BufferError:
                pass
            self._counters = None

    def summary(self) -> dict:
        """The side's engine CPU: its workers' (the data path) and this process's."""
        if self._reader is not None:
            self._reader.join(_EXIT_WAIT_S)
        done = [e for e in self.exits if e]
        data_s = sum(e["cpu_s"] for e in done) if done else None
        elapsed = max((e["elapsed_s"] for e in done), default=None)
        stats = [s.worker for s in self.streams if getattr(s, "worker", None)]
        busy = [x["busy_ratio"] for x in stats if x["busy_ratio"] is not None]
        demand = [x["demand_ratio"] for x in stats if x["demand_ratio"] is not None]
        return {"workers": len(self.procs), "cores": available_cores(), "cpu_ids": _cpu_ids(),
                "data_cpu_seconds": None if data_s is None else round(data_s, 4),
                "data_user_seconds": round(sum(e["user_s"] for e in done), 4) if done else None,
                "data_sys_seconds": round(sum(e["sys_s"] for e in done), 4) if done else None,
                "process_cpu_seconds": (None if self.process_cpu_s is None
                                        else round(self.process_cpu_s, 4)),
                "elapsed_s": None if elapsed is None else round(elapsed, 6),
                "worker_busy_max_ratio": max(busy, default=None),
                "worker_demand_max_ratio": max(demand, default=None)}

    def close(self) -> None:
        """Abort and reap every worker (kill one that does not exit within 2 s)."""
        for w in range(len(self.ctls)):
            self._tell(w, abort=True)
        if self._reader is not None:
            self._reader.join(_EXIT_WAIT_S)
        deadline = time.monotonic() + _EXIT_WAIT_S
        for p in self.procs:
            try:
                p.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for ctl in self.ctls:
            ctl.close()
