"""``[job]``: the socket a training job's StepRecorder sends its steps to (daemon/job_ingest.py).

``socket`` is an absolute path (none: no ingest); ``max_jobs`` bounds the jobs kept (a sender
naming more is refused, counted)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JobSettings:
    """``[job]``: the socket path (None: no ingest) and how many jobs are kept."""

    socket: str | None = None
    max_jobs: int = 16


def job_settings(v: Any, t: dict[str, Any]) -> JobSettings:
    v.known(t, "job", {"socket", "max_jobs"})
    path = v.string(t, "job.socket", None)
    if path is not None and not os.path.isabs(path):
        v.problem("job.socket", f"must be an absolute path, not {path!r}")
    return JobSettings(socket=path, max_jobs=v.integer(t, "job.max_jobs", 16, lo=1, hi=256))
