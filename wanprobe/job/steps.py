"""A training job's step log read back: JSON lines from ``recorder.StepRecorder`` (or any
writer of the same keys), one rank or many.

Reading is forgiving, and says what it forgave: a line that is not a JSON object with a whole
``step`` and finite ``start`` ≤ ``end`` is skipped and counted (the first few line numbers
kept); a rank's steps that overlap (step n+1 starting before step n ended) are kept and
noted; ranks whose wall clocks disagree are aligned. A synchronous step ends on every rank at
the collective that closes it, so the median over steps of (rank's end − rank 0's end) is that
rank's clock offset; it is subtracted when larger than ``SKEW_NOTED_S`` and noted. What could
be read is always returned; only a log with no readable step is an error.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from wanprobe.errors import ConfigError

SKEW_NOTED_S = 0.005      # below this the ranks' clocks agree as well as NTP keeps them
MAX_LINES = 10_000_000


@dataclass(frozen=True)
class StepLine:
    """One rank's record of one step (unix seconds; ``comm_s`` None when not timed)."""

    step: int
    start: float
    end: float
    comm_s: float | None = None
    rank: int = 0


@dataclass(frozen=True)
class Step:
    """One step across its ranks: from the first start to the last end."""

    step: int
    start: float
    end: float
    ranks: tuple[StepLine, ...]

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    def compute_s(self, line: StepLine) -> float | None:
        """A rank's time outside communication in this step (None when not timed)."""
        return None if line.comm_s is None else max(0.0, (line.end - line.start) - line.comm_s)


@dataclass(frozen=True)
class StepLog:
    """The steps in order, and what reading them forgave (one line each)."""

    steps: tuple[Step, ...]
    notes: tuple[str, ...] = ()
    skipped: int = 0
    offsets_s: dict[int, float] = field(default_factory=dict)


def _num(v: Any) -> float | None:
    """A finite JSON number as a float; None for anything else (bool included)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def parse_line(obj: Any) -> StepLine | None:
    """One decoded JSON value as a step line; None when it is not one."""
    if not isinstance(obj, Mapping):
        return None
    step, rank, raw_comm = obj.get("step"), obj.get("rank", 0), obj.get("comm_s")
    start, end = _num(obj.get("start")), _num(obj.get("end"))
    comm = None if raw_comm is None else _num(raw_comm)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        return None
    if start is None or end is None or end < start or (raw_comm is not None and
                                                       (comm is None or comm < 0)):
        return None
    return StepLine(step, start, end, comm, rank)


def parse_lines(lines: Iterable[str], source: str) -> StepLog:
    """Read step lines (module docstring); ConfigError only when none is readable."""
    got: list[StepLine] = []
    bad: list[int] = []
    for i, text in enumerate(lines, 1):
        if i > MAX_LINES:
            break
        if not text.strip():
            continue
        try:
            line = parse_line(json.loads(text))
        except (ValueError, RecursionError):
            line = None
        if line is None:
            bad.append(i)
        else:
            got.append(line)
    if not got:
        raise ConfigError(f"{source}: no step line readable ({len(bad)} line(s) not a JSON "
                          "object with step, start <= end)")
    notes = []
    if bad:
        notes.append(f"{len(bad)} line(s) skipped: not a step (lines {', '.join(map(str, bad[:5]))}"
                     f"{', …' if len(bad) > 5 else ''})")
    got, offsets, skew_notes = _aligned(got)
    notes += skew_notes + _overlaps(got)
    return StepLog(merged(got), tuple(notes), len(bad), offsets)


def _aligned(lines: list[StepLine]) -> tuple[list[StepLine], dict[int, float], list[str]]:
    """Each rank's clock offset against the lowest rank, from the steps both recorded."""
    ranks = sorted({ln.rank for ln in lines})
    ref = {ln.step: ln.end for ln in lines if ln.rank == ranks[0]}
    offsets: dict[int, float] = {}
    notes = []
    for r in ranks[1:]:
        diffs = [ln.end - ref[ln.step] for ln in lines if ln.rank == r and ln.step in ref]
        if not diffs:
            continue
        off = statistics.median(diffs)
        if abs(off) > SKEW_NOTED_S:
            offsets[r] = off
            notes.append(f"rank {r}'s clock is {off * 1e3:+.1f} ms off rank {ranks[0]}'s (median "
                         f"over {len(diffs)} steps of the end of each step): aligned")
    out = [replace(ln, start=ln.start - offsets.get(ln.rank, 0.0),
                   end=ln.end - offsets.get(ln.rank, 0.0)) for ln in lines]
    return out, offsets, notes


def _overlaps(lines: list[StepLine]) -> list[str]:
    notes = []
    for r in sorted({ln.rank for ln in lines}):
        mine = sorted((ln for ln in lines if ln.rank == r), key=lambda ln: (ln.start, ln.step))
        over = sum(1 for a, b in zip(mine, mine[1:], strict=False) if b.start < a.end - 1e-6)
        if over:
            notes.append(f"rank {r}: {over} step(s) start before the previous one ended "
                         "(kept; is the recorder wrapped around overlapping work?)")
        twice = len(mine) - len({ln.step for ln in mine})
        if twice:
            notes.append(f"rank {r}: {twice} step number(s) recorded twice (the later kept)")
    return notes


def merged(lines: Iterable[StepLine]) -> tuple[Step, ...]:
    """The lines as steps, in step order, each across its ranks (the later line of a rank kept)."""
    by_step: dict[int, dict[int, StepLine]] = {}
    for ln in lines:
        by_step.setdefault(ln.step, {})[ln.rank] = ln
    return tuple(Step(n, min(x.start for x in rs.values()), max(x.end for x in rs.values()),
                      tuple(rs[r] for r in sorted(rs)))
                 for n, rs in sorted(by_step.items()))
