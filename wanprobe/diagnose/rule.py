"""The rule decorator, and the prose helpers rules share.

A rule is a pure function of the :class:`~wanprobe.diagnose.context.Context` parts it names,
``@rule(rule_id, needs=(...))``, taken as its positional arguments in that order, returning the one
:class:`~wanprobe.diagnose.finding.Finding` type, a list of them, or None. The parts (context.py):
``REPORT`` ``(measured, host, config)`` for the report's rules — the typed
:class:`~wanprobe.diagnose.measured.Measured`, the :class:`~wanprobe.diagnose.host_inputs.Host`
judged (None: the report has no host) and the
:class:`~wanprobe.diagnose.inputs.DiagnoseConfig`, built once per report — ``COUNTERS``
``(snapshot, rates, window_s)`` for counter health, ``path_event``, ``trend`` and ``verify``.
engine.py lists every rule (``RULES``, in table order) and runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from wanprobe.diagnose.context import OPTIONAL, PARTS, REPORT

RuleFn = Callable[..., object]
F = TypeVar("F", bound=Callable[..., object])


def rule(rule_id: str, needs: tuple[str, ...] = REPORT) -> Callable[[F], F]:
    """Tag a rule with its id (an ``engine.rule_error`` names it) and the context parts it takes."""
    unknown = [p for p in needs if p not in PARTS]
    if unknown or all(p in OPTIONAL for p in needs):
        raise ValueError(f"rule {rule_id}: needs {needs!r}: unknown parts {unknown} or only "
                         f"optional ones {OPTIONAL}")

    def wrap(fn: F) -> F:
        fn.rule_id = rule_id  # type: ignore[attr-defined]
        fn.needs = tuple(needs)  # type: ignore[attr-defined]
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
