"""The rule signature and its registry decorator.

A rule is a pure function ``(measurements, host, config) -> Finding | None``: ``measurements``
holds the probe/mtu/throughput/counters JSON (None where not measured), ``host`` the report's
host dict, ``config`` a :class:`~wanprobe.diagnose.inputs.DiagnoseConfig`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from wanprobe.diagnose.inputs import DiagnoseConfig
from wanprobe.report.document import Finding

RuleFn = Callable[[Mapping[str, Any], Mapping[str, Any] | None, DiagnoseConfig], Finding | None]


def rule(rule_id: str) -> Callable[[RuleFn], RuleFn]:
    """Tag a rule function with the finding id it emits."""

    def wrap(fn: RuleFn) -> RuleFn:
        fn.rule_id = rule_id  # type: ignore[attr-defined]
        return fn

    return wrap


def mbit(bps: float | None) -> str:
    """Rate for prose: ``390.2 Mbit/s``."""
    from wanprobe.units import format_rate

    return "unknown" if bps is None else format_rate(bps)


def mib(n: float | None) -> str:
    from wanprobe.units import format_bytes

    return "unknown" if n is None else format_bytes(n)


def ms(seconds: float) -> str:
    """A duration in ms with sensible precision: ``130 ms``, ``0.05 ms``."""
    return f"{seconds * 1e3:.3g} ms"
