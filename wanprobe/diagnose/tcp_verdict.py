"""A TCP test's verdict checked against the path's capacity measured in the same run, so that a
report never contradicts itself (issue 35).

The throughput engine says ``network`` when it finds no host limit in its own evidence (no CPU,
window, pacing or loss bound). That is "the path's bottleneck set the rate" only when the rate
came close to the path's capacity: ``network`` stays only at ≥ NETWORK_SHARE of a capacity the
report trusts (measured exactly, or the operator's). Below it the verdict names what held the
test back, from the after-apply verdict table (verify_limit.py, first match): a congestion
window that stopped short, CPU steal, a rate still climbing at the end (``duration``), a
standing queue (``cross_traffic``), a sender out of data, a congestion control whose rate never
reached the path (``cc_rate``), or ``unexplained`` — never the path.

Without a capacity it trusts — only a lower bound (a host, not the path, limited the bursts) or
none measured — ``network`` cannot be confirmed: the verdict says ``unverified`` and why, with
the engine's own verdict in its evidence.
"""

from __future__ import annotations

from dataclasses import replace

from wanprobe.diagnose.context import Context, VerifyRun
from wanprobe.diagnose.engine import RULE_ERROR
from wanprobe.diagnose.engine import judge as run_engine
from wanprobe.diagnose.verify_limit import RULES, evidence_of
from wanprobe.throughput.result import ThroughputResult, after_omit_bps
from wanprobe.throughput.verdict import Verdict

NETWORK_SHARE = 0.8  # "the path's bottleneck set the rate" needs ≥ 80 % of its capacity


def against_capacity(result: ThroughputResult | None, capacity_bps: float | None,
                     capacity_source: str | None, trusted: bool, why: str = ""
                     ) -> ThroughputResult | None:
    """``result`` with its verdict checked against the capacity (see the module docstring);
    ``why`` says why an untrusted capacity is not trusted."""
    if result is None or result.protocol != "tcp" or result.limited_by.verdict != "network":
        return result
    rate = after_omit_bps(result.intervals, result.omit_s) or result.bits_per_second
    verdict = result.limited_by
    share = rate / capacity_bps if capacity_bps and capacity_bps > 0 else None
    checked = {"capacity_bits_per_second": round(capacity_bps) if capacity_bps else None,
               "capacity_source": capacity_source, "capacity_trusted": trusted,
               "share_of_capacity": None if share is None else round(share, 4),
               "network_share": NETWORK_SHARE}
    if not trusted or share is None:
        return replace(result, limited_by=Verdict("unverified", {
            **verdict.evidence, **checked, "engine_verdict": verdict.verdict},
            f"no host limit found, but no capacity this report trusts to compare with "
            f"({why or capacity_source}): whether the path or a host set the rate is not known"))
    if share >= NETWORK_SHARE:
        return replace(result, limited_by=replace(
            verdict, evidence={**verdict.evidence, **checked}))
    found = run_engine(Context(verify=VerifyRun(
        evidence_of(result, result.omit_s), rate_bps=rate, capacity_bps=capacity_bps,
        capacity_source=capacity_source)), RULES, first=True)
    answer = next((f for f in found if f.id != RULE_ERROR), None)
    cause = answer.id.removeprefix("verify.") if answer is not None else "unexplained"
    summary = (answer.title if answer is not None else
               f"{share:.0%} of the capacity and the verdict rules could not say why")
    evidence = {**verdict.evidence, **(dict(answer.evidence) if answer else {}), **checked,
                "engine_verdict": verdict.verdict,
                "next_step": answer.recommendation if answer else None}
    return replace(result, limited_by=Verdict(cause, evidence, summary))
