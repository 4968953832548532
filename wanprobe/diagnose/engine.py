"""The one engine: every rule (``RULES``, in table order) and the one loop that runs them on a
:class:`~wanprobe.diagnose.context.Context` (:func:`judge`: the rules whose parts the context
has, a rule that raises turned into an ``engine.rule_error`` finding).

Callers keep their order: a report's findings are de-duplicated and ranked so the first names
the main fault (:func:`run_rules`: by severity, then by modelled impact — the share of the
achievable rate the fault costs — then by rule order: path before host before fabric, measured
before configured); counter health sorts by severity, id and title (services/counters.py); the
after-apply verdict and the daemon's path events and regressions take the first rule that
answers (``first=True``, :func:`first`), as does the throughput verdict
(throughput_verdict.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from wanprobe.diagnose import (
    path_findings,
    regressions,
    rules_ecmp,
    rules_fabric,
    rules_host,
    rules_loss,
    rules_path,
    rules_throughput,
    verify_limit,
)
from wanprobe.diagnose.context import REPORT, Context
from wanprobe.diagnose.finding import Finding, Knob
from wanprobe.diagnose.host_inputs import Host
from wanprobe.diagnose.inputs import DiagnoseConfig
from wanprobe.diagnose.measured import Measured
from wanprobe.diagnose.rule import RuleFn
from wanprobe.diagnose.transfer import hosts

# the report's rules (measured, host, config)
ALL_RULES: tuple[RuleFn, ...] = (*rules_path.RULES, *rules_loss.RULES, *rules_ecmp.RULES,
                                  *rules_fabric.RULES, *rules_host.RULES)
# every rule, in table order: the report's, counter health, path events, regressions, the
# throughput verdict and the after-apply verdict (first-match tables: their order is their
# precedence)
RULES: tuple[RuleFn, ...] = (*ALL_RULES, *rules_fabric.COUNTER_RULES, *path_findings.RULES,
                             *regressions.RULES, *rules_throughput.RULES, *verify_limit.RULES)
RULE_ERROR = "engine.rule_error"
BUFFER_KEYS = ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem")
SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}

# A host-config finding restates what a measured finding already shows: keep the measured one
# and carry over the knobs it lacks.
SUPERSEDED_BY = {
    "host.buffers_below_bdp": ("path.window_limited", "path.send_buffer_limited"),
    "host.loss_based_default_cc": ("path.lossy_loss_based_cc",),
    "host.mtu_probing_off": ("path.mtu_black_hole",),
}


def _merge(kept: Finding, dropped: Finding) -> Finding:
    # The measured finding already says which host each of its knobs is for: a host-config
    # knob on the same key restates it and is not carried over — except a buffer for the other
    # host: a measured buffer finding is about one direction, and the other end's buffers
    # carry the other direction.
    def ident(k: Knob) -> tuple[str | None, ...]:
        return (k.tuner, k.key, k.iface) + ((k.for_host,) if k.key in BUFFER_KEYS else ())

    keys = {ident(k) for k in kept.knobs}
    extra = tuple(k for k in dropped.knobs if ident(k) not in keys)
    if not extra:
        return kept
    return replace(kept, knobs=kept.knobs + extra)


def _dedupe(findings: list[Finding]) -> list[Finding]:
    by_id = {f.id: i for i, f in enumerate(findings)}
    drop: set[int] = set()
    for i, f in enumerate(findings):
        for winner in SUPERSEDED_BY.get(f.id, ()):
            if winner in by_id:
                j = by_id[winner]
                findings[j] = _merge(findings[j], f)
                drop.add(i)
                break
    return [f for i, f in enumerate(findings) if i not in drop]


def rank(findings: Iterable[Finding]) -> list[Finding]:
    """Stable sort: severity, then impact (unknown last within its severity)."""
    return sorted(findings, key=lambda f: (SEVERITY_RANK[f.severity],
                                           -(f.impact if f.impact is not None else -1.0)))


def _rule_error(fn: RuleFn, exc: Exception) -> Finding:
    name = getattr(fn, "rule_id", fn.__name__)
    return Finding(id=RULE_ERROR, severity="info",
                   title=f"rule {name} could not be evaluated",
                   evidence={"rule": name, "error": f"{type(exc).__name__}: {exc}"},
                   recommendation="Report this as a wanprobe bug with the report attached.",
                   expected_effect="")


def judge(ctx: Context, rules: Iterable[RuleFn] = RULES, *, first: bool = False,
          raising: bool = False) -> list[Finding]:
    """The findings of every rule in ``rules`` whose parts ``ctx`` has, in table order. A rule
    that raises does not stop the others: it becomes an ``engine.rule_error`` finding (with
    ``raising``, its error propagates: a caller whose answer has no list of findings to carry
    it, the throughput verdict). With ``first`` the loop stops at the first rule that answers
    (a first-match table; the errors before it are kept)."""
    found: list[Finding] = []
    for fn in rules:
        needs = getattr(fn, "needs", REPORT)
        if not ctx.has(needs):
            continue
        try:
            result = fn(*ctx.parts(needs))
        except Exception as exc:  # one broken rule must not cost the whole judgement
            if raising:
                raise
            found.append(_rule_error(fn, exc))
            continue
        if isinstance(result, Finding):
            found.append(result)
        elif isinstance(result, list):
            found.extend(result)
        if first and result:
            break
    return found


def first(ctx: Context, rules: Iterable[RuleFn] = RULES) -> Finding | None:
    """The one finding of a context whose rules exclude each other (a path event, a
    regression): the first rule's that answers; where none does, the error of one that raised
    (None: no rule judges this context)."""
    found = judge(ctx, rules, first=True)
    return next((f for f in found if f.id != RULE_ERROR), found[0] if found else None)


def run_rules(measured: Measured, local: Host | None,
              config: DiagnoseConfig | None = None,
              rules: Iterable[RuleFn] = RULES) -> list[Finding]:
    """All findings for these measurements, deduplicated and ranked (main fault first).
    ``measured`` and ``local`` are a report's measurements and host, typed once by the report
    codec (``wanprobe/report/codec.py``) for every rule; the peer, typed from the facts it
    sent, is judged by ``rules_host.PEER_RULES``."""
    rules = tuple(rules)
    peer = hosts(measured, local).peer
    ctx = Context(measured=measured, host=local, config=config or DiagnoseConfig())
    found = judge(ctx, rules)
    if peer is not None:
        found += judge(replace(ctx, host=peer), [fn for fn in rules_host.PEER_RULES if fn in rules])
    return rank(_dedupe([_with_hosts(f) for f in found]))


def _with_hosts(f: Finding) -> Finding:
    """Every knob names the host it is for. A rule that left it implicit meant this host, or,
    with ``side="both"``, both ends of the path: that knob is given once per host (the far
    end's plan re-validates it against its own live values when applied there)."""
    if all(k.host for k in f.knobs):
        return f
    knobs: list[Knob] = []
    for k in f.knobs:
        if k.host:
            knobs.append(k)
        elif k.side == "both":
            knobs += [replace(k, host="local"), replace(k, host="peer")]
        else:
            knobs.append(replace(k, host=k.for_host))
    return replace(f, knobs=tuple(knobs))
