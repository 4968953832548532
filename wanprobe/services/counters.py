"""The counters service: snapshots of the host's RoCE/PFC/ECN/NIC/TCP counters (collectors/),
per-second rates between two of them, and the counter rules' findings on them (the diagnose
engine over the counters parts; rules in diagnose/rules_fabric.py and rules_nic.py).
``wanprobe counters``, ``diagnose`` and the daemon all judge counters through :func:`judge`."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:  # types only: the collectors stay unloaded until a snapshot is taken
    from collectors.rates import Rates
    from collectors.snapshot import Snapshot
    from wanprobe.diagnose.finding import Finding


def findings_of(snapshot: Snapshot, rates: Rates | None = None,
                window_s: float | None = None) -> list[Finding]:
    """The counter rules' findings on ``snapshot`` (and the ``rates`` over ``window_s``, by
    default their interval), critical → warning → info, then by id and title."""
    from wanprobe.diagnose.context import Context
    from wanprobe.diagnose.engine import judge as run_engine
    from wanprobe.diagnose.finding import SEVERITIES

    found = run_engine(Context.of_counters(snapshot, rates, window_s))
    return sorted(found, key=lambda f: (SEVERITIES.index(f.severity), f.id, f.title))


@overload
def judge(first: Snapshot, second: None = None) -> tuple[Snapshot, None, list[Finding]]: ...
@overload
def judge(first: Snapshot, second: Snapshot) -> tuple[Snapshot, Rates, list[Finding]]: ...


def judge(first: Snapshot, second: Snapshot | None = None
          ) -> tuple[Snapshot, Rates | None, list[Finding]]:
    """``(snapshot, rates, findings)``: with one snapshot, no rates and the findings that need
    none; with two, the later snapshot, the rates between them and every finding."""
    from collectors.rates import rates as make_rates

    if second is None:
        return first, None, findings_of(first)
    r = make_rates(first, second)
    return second, r, findings_of(second, r, r.interval_s)


def document(snapshot: Snapshot, rates: Rates | None = None,
             findings: Iterable[Finding] = ()) -> dict[str, Any]:
    """The counters document (issue 5 shape) of :func:`judge`'s answer: the snapshot,
    per-second ``rates`` (or null) and ``findings``."""
    doc: dict[str, Any] = snapshot.to_json()
    doc["rates"] = rates.to_json() if rates is not None else None
    doc["findings"] = [f.to_json() for f in findings]
    return doc


class CounterSampler:
    """The daemon's: one snapshot per call, judged against the previous one."""

    def __init__(self, sys_root: Path, proc_root: Path) -> None:
        self.sys_root, self.proc_root = sys_root, proc_root
        self._prev: Snapshot | None = None
        self.raw: dict[tuple[str, str], int] = {}  # the last snapshot's counters, as read

    def sample(self) -> tuple[dict[str, Any] | None, dict[tuple[str, str], float],
                              list[dict[str, Any]]]:
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
