"""The rule signature and its registry decorator, and the prose helpers rules share.

A rule is a pure function ``(measured, host, config) -> Finding | None``: ``measured`` the
typed :class:`~wanprobe.diagnose.measured.Measured` (probe, MTU, both transfers, the fabric
findings, the peer's facts; None where a part was not measured), ``host`` the typed
:class:`~wanprobe.diagnose.host_inputs.Host` (None: the report has no host), ``config`` a
:class:`~wanprobe.diagnose.inputs.DiagnoseConfig`. The engine builds ``measured`` and ``host``
once per report; a rule returns the one :class:`~wanprobe.diagnose.finding.Finding` type.
"""

from __future__ import annotations

from collections.abc import Callable

from wanprobe.diagnose.finding import Finding
from wanprobe.diagnose.host_inputs import Host
from wanprobe.diagnose.inputs import DiagnoseConfig
from wanprobe.diagnose.measured import Measured

RuleFn = Callable[[Measured, Host | None, DiagnoseConfig], Finding | None]


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
