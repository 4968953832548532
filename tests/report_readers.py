"""Which report keys the readers ask for (issue 21): a report document wrapped so that every key a
reader looks up and does not find is noted with its path, then handed to every reader of the
report — the typed measurements and host (``Measured``, ``Host``), the rules engine, the
planner's helpers, the NCCL facts, the impact inputs, the three renderers. A key asked for that
no writer produces (not in the recorded shape of a real diagnose report,
tests/fixtures/golden/report_shape.json) is a reader depending on a spelling nothing writes.
"""

from __future__ import annotations

from typing import Any

import report_shape

# Keys a reader asks for that a diagnose report does not carry but another writer does.
WRITTEN_ELSEWHERE = {
    ("measurements", "paths"): "`wanprobe paths` judges its own document as {'paths': doc} "
                               "(services/paths.py, Measured.paths_summary)",
    ("measurements", "verify"): "`tune apply --verify PEER --report-out` (commands/tune.py; "
                                "test_tune_verify_lab.py)",
    **{("host", "ifaces", "*", ring): "collectors/host_config.py, where the NIC answers the "
       "ring ioctl (ETHTOOL_GRINGPARAM); the lab's veth does not"
       for ring in ("rx_ring", "tx_ring", "rx_ring_max", "tx_ring_max")},
}


class Asked(dict):
    """A dict that notes in ``log`` the path of each key looked up and not found."""

    def __init__(self, d: dict, path: tuple[str, ...], log: set[tuple[str, ...]]) -> None:
        super().__init__({k: track(v, (*path, k), log) for k, v in d.items()})
        self._path, self._log = path, log

    def _missing(self, key: Any) -> bool:
        if dict.__contains__(self, key):
            return False
        self._log.add((*self._path, str(key)))
        return True

    def __getitem__(self, key: Any) -> Any:
        self._missing(key)
        return dict.__getitem__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        return default if self._missing(key) else dict.__getitem__(self, key)

    def __contains__(self, key: object) -> bool:
        return not self._missing(key)


def track(v: Any, path: tuple[str, ...], log: set[tuple[str, ...]]) -> Any:
    if isinstance(v, dict):
        return Asked(v, path, log)
    if isinstance(v, list):
        return [track(x, (*path, "[]"), log) for x in v]
    return v


def _normal(path: tuple[str, ...]) -> tuple[str, ...]:
    """``path`` with data keys (interface, sysctl, counter names) as ``*``."""
    out: list[str] = []
    for key in path:
        maps = [p for p in report_shape.MAPS if len(p) == len(out)
                and report_shape._match(tuple(out), p)]
        out.append(report_shape.ANY if maps else key)
    return tuple(out)


def written(shape: Any, path: tuple[str, ...]) -> bool | None:
    """True when the recorded writer shape has ``path``; False when it does not; None when a
    part on the way was only ever null there (not measured: the shape cannot tell)."""
    node = shape
    for key in path:
        if node == "null" or node is None:
            return None
        if node == "object":   # opaque: evidence, rate trees
            return True
        if not isinstance(node, dict):
            return False
        if "<map>" in node and key == report_shape.ANY:
            node = node["<map>"]
        elif "<list>" in node and key == "[]":
            node = node["<list>"]
        elif key in node or f"?{key}" in node:
            node = node.get(key, node.get(f"?{key}"))
        else:
            return False
    return True


def ask_every_reader(doc: dict) -> set[tuple[str, ...]]:
    """Hand a tracked copy of ``doc`` to every reader; the paths they asked for and missed."""
    import io

    from rich.console import Console

    from tuners import from_report
    from tuners.nccl_env import facts_from_report
    from tuners.registry import build_tuners
    from wanprobe.diagnose.engine import run_rules
    from wanprobe.pictures.report_html import report_page
    from wanprobe.report.codec import host_of, measured_of
    from wanprobe.report.document import Report
    from wanprobe.report.impact_reader import candidate_from_report
    from wanprobe.report.render_md import render_markdown
    from wanprobe.report.render_rich import render_rich

    log: set[tuple[str, ...]] = set()
    tracked = track(doc, (), log)
    run_rules(measured_of(tracked["measurements"]), host_of(tracked["host"]))
    facts_from_report(tracked)
    from_report.knobs_of(tracked)
    from_report.slow_nic(tracked)
    for which in ("local", "peer"):
        from_report.host_address(tracked, which)
        from_report.unknown_of(tracked, which)
    tuners = build_tuners()   # planning reads the live values; nothing is applied
    for side in ("local", "peer"):
        from_report.build_plan(tracked, tuners, host_id="readers-test", side=side)
    candidate_from_report(tracked, "report")
    report = Report.from_valid(tracked)
    render_rich(report, Console(file=io.StringIO(), width=120))
    render_markdown(report)
    report_page(report)
    return log


def unknown_keys(log: set[tuple[str, ...]], shape: Any) -> tuple[list[str], list[str]]:
    """(asked for and written by nothing, asked for where the shape saw only null)."""
    unknown, unverifiable = [], []
    for path in sorted(log):
        norm = _normal(path)
        if norm in WRITTEN_ELSEWHERE or any(norm[:len(k)] == k for k in WRITTEN_ELSEWHERE):
            continue
        got = written(shape, norm)
        if got is False:
            unknown.append(".".join(norm))
        elif got is None:
            unverifiable.append(".".join(norm))
    return sorted(set(unknown)), sorted(set(unverifiable))
