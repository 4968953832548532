"""The daemon's end of a training job's live step stream (issue 41): ``[job] socket = PATH``.

The job's ``StepRecorder(socket_path=PATH)`` sends one datagram per step (the recorder's JSON
line). The daemon binds a UNIX datagram socket there (mode 0660; a stale socket file is
replaced, anything else at the path is refused), reads what arrives from the event loop
(``add_reader``: at most ``BATCH`` datagrams a wake-up, never blocking), and keeps per job the
last ``KEEP`` steps. A datagram that is not a step line, or names a job beyond ``max_jobs``,
is counted and dropped: a sender can neither crash the daemon nor grow its memory, and at most
``MAX_PENDING`` attributions per job run at once (a burst beyond stays unexplained).

A step slower than ``explain.SLOW_FACTOR`` × the median of the ``explain.WINDOW`` normal steps
before it is attributed in a worker thread, as ``wanprobe job explain`` does, once the probe
sessions around it are in the history (``ATTRIBUTE_DELAY_S`` later): the job's recent steps
and this host's sessions (``job/explain.py``). Metrics:

- ``wanprobe_job_step_duration_seconds{training_job}``: the last step's duration;
- ``wanprobe_job_step_baseline_seconds{training_job}``: the running median it is judged against;
- ``wanprobe_job_steps_total{training_job}``,
  ``wanprobe_job_slow_steps_total{training_job,attribution}``;

(``training_job``, not ``job``: Prometheus's own ``job`` label names the scrape job.)
- ``wanprobe_job_datagrams_refused_total``.

A slow step put on the path or a host is also filed as a finding (``job.slow_step``), so the
daemon's page draws it on its time axis beside the path events.

``wanprobe fleet rules`` alerts on ``wanprobe_job_slow_steps_total{attribution="path"}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import stat
import statistics
from collections import deque
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from wanprobe.blocking import run_blocking
from wanprobe.daemon.config_job import JobSettings
from wanprobe.errors import ConfigError
from wanprobe.job import explain as ex
from wanprobe.job.path_events import path_events, probe_interval_s, sessions_of
from wanprobe.job.steps import StepLine, StepLog, merged, parse_line

BATCH, KEEP, MAX_DATAGRAM = 256, 512, 4096
JOB_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
ATTRIBUTIONS = ("path", "host", "unexplained")
SESSIONS_BEFORE_S = 120.0
# a session is in the history one flush (1 s, main.FLUSH_INTERVAL_S) after it ends
ATTRIBUTE_DELAY_S = 2.0
MAX_PENDING = 4   # attributions in flight per job; beyond, a slow step stays unexplained


class _Job:
    def __init__(self) -> None:
        self.steps: deque[StepLine] = deque(maxlen=KEEP)
        self.normal: deque[float] = deque(maxlen=ex.WINDOW)
        self.last: tuple[float, float | None] | None = None
        self.total = 0
        self.pending = 0
        self.slow = dict.fromkeys(ATTRIBUTIONS, 0)


class JobIngest:
    """The socket, the jobs and their metrics (a registry collector)."""

    def __init__(self, daemon: Any, settings: JobSettings) -> None:
        self.daemon, self.settings = daemon, settings
        self.jobs: dict[str, _Job] = {}
        self.refused = 0
        self.sock: socket.socket | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.delay_s = ATTRIBUTE_DELAY_S

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        path = self.settings.socket
        assert path is not None
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(path)
            os.chmod(path, 0o660)
        except OSError as exc:
            sock.close()
            raise ConfigError(f"job.socket {path}: {exc.strerror or exc}") from None
        sock.setblocking(False)
        self.sock = sock
        loop.add_reader(sock.fileno(), self._readable)

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.sock is not None:
            loop.remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None
        for t in self._tasks:
            t.cancel()

    def _readable(self) -> None:
        assert self.sock is not None
        for _ in range(BATCH):
            try:
                data = self.sock.recv(MAX_DATAGRAM + 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self.take(data)

    def take(self, data: bytes) -> None:
        """One datagram: a step line, or a refusal counted."""
        try:
            obj = json.loads(data.decode("utf-8")) if len(data) <= MAX_DATAGRAM else None
        except (ValueError, RecursionError):
            obj = None
        line = parse_line(obj)
        name = obj.get("job", "default") if isinstance(obj, dict) else None
        if line is None or not isinstance(name, str) or not JOB_NAME.match(name) \
                or (name not in self.jobs and len(self.jobs) >= self.settings.max_jobs):
            self.refused += 1
            return
        self.add(name, line)

    def add(self, name: str, line: StepLine) -> None:
        job = self.jobs.setdefault(name, _Job())
        job.steps.append(line)
        job.total += 1
        duration = line.end - line.start
        base = statistics.median(job.normal) if len(job.normal) >= ex.MIN_BASELINE else None
        job.last = (duration, base)
        if base is not None and duration > ex.SLOW_FACTOR * base:
            if job.pending >= MAX_PENDING:   # a burst of slow steps (or a hostile sender)
                job.slow["unexplained"] += 1
                return
            job.pending += 1
            task = asyncio.get_running_loop().create_task(self._attribute(name, job, line))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            job.normal.append(duration)

    async def _attribute(self, name: str, job: _Job, line: StepLine) -> None:
        try:
            await asyncio.sleep(self.delay_s)   # the sessions around the step reach the history
            got = await run_blocking(self._explain, list(job.steps), line)
        except Exception:  # noqa: BLE001 - a broken history read leaves it unexplained
            got = None
        finally:
            job.pending -= 1
        job.slow[got.attribution if got else "unexplained"] += 1
        if got is not None and got.attribution != "unexplained" and self.daemon.store:
            # on the page's time axis beside the path events (pictures: the findings table)
            self.daemon.store.add_finding(got.start, {
                "id": "job.slow_step", "severity": "warning" if got.attribution == "path"
                else "info", "evidence": got.to_json(),
                "title": f"{name}: step {got.step} took {got.duration_s:.2f} s (usually "
                         f"{got.baseline_s:.2f} s), {got.attribution}: {got.cause}"},
                peer=got.evidence.get("peer") if got.attribution == "path" else None)

    def _explain(self, lines: list[StepLine], slow: StepLine) -> ex.SlowStep | None:
        store = self.daemon.store
        # the sessions around this step and the reference before them, not the whole window
        # of kept steps: one slow step reads minutes of history, not the job's every step
        sessions = sessions_of(store.probes(None, since=slow.start - SESSIONS_BEFORE_S),
                               until=slow.end) if store is not None else []
        result = ex.explain(StepLog(merged(lines)),
                            path_events(sessions, probe_interval_s(sessions)))
        mine = [s for s in result.slow_steps if s.step == slow.step]
        return mine[0] if mine else None

    def collect(self) -> Iterator[Any]:
        key = ["training_job"]
        dur = GaugeMetricFamily("wanprobe_job_step_duration_seconds",
                                "The last step's duration of each training job.", labels=key)
        base = GaugeMetricFamily("wanprobe_job_step_baseline_seconds", "The median of the "
                                 "job's recent normal steps its steps are judged against.",
                                 labels=key)
        total = CounterMetricFamily("wanprobe_job_steps", "Steps received from each job.",
                                    labels=key)
        slow = CounterMetricFamily("wanprobe_job_slow_steps", "Slow steps (over 1.3x the "
                                   "baseline) by what they were put on.",
                                   labels=[*key, "attribution"])
        for name, job in list(self.jobs.items()):
            if job.last is not None:
                dur.add_metric([name], job.last[0])
                if job.last[1] is not None:
                    base.add_metric([name], job.last[1])
            total.add_metric([name], job.total)
            for a in ATTRIBUTIONS:
                slow.add_metric([name, a], job.slow[a])
        refused = CounterMetricFamily("wanprobe_job_datagrams_refused", "Datagrams on the job "
                                      "socket that were not a step line (or a job too many).")
        refused.add_metric([], self.refused)
        yield from (dur, base, total, slow, refused)


def start(daemon: Any) -> asyncio.Task[None]:
    """Open ``[job] socket`` in a started daemon (main.py; a bind failure is the daemon's
    ConfigError at start), register the metrics; the task closes the socket when cancelled."""
    settings: JobSettings = daemon.cfg.job
    loop = asyncio.get_running_loop()
    ingest = None
    if settings.socket is not None:
        ingest = JobIngest(daemon, settings)
        ingest.open(loop)
        daemon.metrics.registry.register(ingest)
    daemon.job_ingest = ingest
    return loop.create_task(_held(ingest, loop), name="job")


async def _held(ingest: JobIngest | None, loop: asyncio.AbstractEventLoop) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        if ingest is not None:
            ingest.close(loop)
