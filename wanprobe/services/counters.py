"""The counters service: snapshots of the host's RoCE/PFC/ECN/NIC/TCP counters (collectors/),
per-second rates between two of them, and the fabric rules' findings on them
(diagnose/rules_fabric.py). ``wanprobe counters``, ``diagnose`` and the daemon all judge
counters through :func:`judge`."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def judge(first: Any, second: Any | None = None) -> tuple[Any, Any, list]:
    """``(snapshot, rates, findings)``: with one snapshot, no rates and the findings that need
    none; with two, the later snapshot, the rates between them and every finding."""
    from collectors.rates import rates as make_rates
    from wanprobe.diagnose.rules_fabric import evaluate

    if second is None:
        return first, None, evaluate(first)
    r = make_rates(first, second)
    return second, r, evaluate(second, r, r.interval_s)


def document(snapshot: Any, rates: Any = None, findings: Any = ()) -> dict:
    """The counters document (issue 5 shape) of :func:`judge`'s answer: the snapshot,
    per-second ``rates`` (or null) and ``findings``."""
    doc = snapshot.to_json()
    doc["rates"] = rates.to_json() if rates is not None else None
    doc["findings"] = [f.to_json() for f in findings]
    return doc


class CounterSampler:
    """The daemon's: one snapshot per call, judged against the previous one."""

    def __init__(self, sys_root: Path, proc_root: Path) -> None:
        self.sys_root, self.proc_root = sys_root, proc_root
        self._prev: Any = None
        self.raw: dict[tuple[str, str], int] = {}  # the last snapshot's counters, as read

    def sample(self) -> tuple[dict[str, Any] | None, dict[tuple[str, str], float], list[dict]]:
        """Take a snapshot; return (rates JSON, {(source, counter): per-second rate}, findings
        JSON). The first call has no previous snapshot: (None, {}, [])."""
        from collectors.snapshot import collect

        cur = collect(sys_root=self.sys_root, proc_root=self.proc_root)
        prev, self._prev = self._prev, cur
        self.raw = {(".".join(key), name): value for key, cs in cur.counter_sets().items()
                    for name, value in cs.values.items() if name not in cs.gauges}
        if prev is None:
            return None, {}, []
        _, rates, findings = judge(prev, cur)
        flat = {(".".join(key), name): r.per_s for key, group in rates.groups.items()
                for name, r in group.items() if r.per_s is not None}
        return rates.to_json(), flat, [f.to_json() for f in findings]
