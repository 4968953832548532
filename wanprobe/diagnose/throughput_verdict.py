"""The throughput verdict (issue 38): what limited a transfer, judged from the figures the
throughput engine measured (``VerdictInput``) by the first rule of ``rules_throughput.RULES``
that answers, run through the one engine (``engine.judge``, ``first=True``).

The composing layer hands :data:`JUDGE` to the throughput engine (``run_throughput(...,
judge=JUDGE)``), which builds its ``ThroughputResult`` with the verdict and the notes it gives:
a measurement never judges (docs/architecture.md).
"""

from __future__ import annotations

from wanprobe.diagnose.context import Context
from wanprobe.diagnose.engine import judge as run_engine
from wanprobe.diagnose.rules_throughput import RULES, steal_notes
from wanprobe.throughput.verdict import Judge, Verdict, VerdictInput


def decide(v: VerdictInput) -> Verdict:
    """The limit with the strongest kernel evidence, in table order: host_cpu, receive window,
    send buffer, pacing, congestion (loss explains the rate: Mathis), network (none of the
    above, which always answers). A rule that raises fails the verdict with its own error, as
    the test's (``raising``: a verdict has no list of findings to carry an error)."""
    (answer,) = run_engine(Context(throughput=v), RULES, first=True, raising=True)
    return Verdict(answer.id.removeprefix("throughput."), dict(answer.evidence), answer.title)


JUDGE = Judge(decide=decide, notes=steal_notes)
