"""Run every rule on one set of measurements and rank the findings so the first names the main
fault: by severity, then by modelled impact (share of the achievable rate the fault costs),
then by rule order (path before host before fabric; measured before configured)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from wanprobe.diagnose import rules_ecmp, rules_fabric, rules_host, rules_path
from wanprobe.diagnose.finding import Finding, Knob
from wanprobe.diagnose.host_inputs import Host
from wanprobe.diagnose.inputs import DiagnoseConfig
from wanprobe.diagnose.measured import Measured
from wanprobe.diagnose.rule import RuleFn
from wanprobe.diagnose.transfer import hosts

ALL_RULES: tuple[RuleFn, ...] = (*rules_path.RULES, *rules_ecmp.RULES, *rules_fabric.RULES,
                                  *rules_host.RULES)
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
    def ident(k: Knob) -> tuple:
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
    return Finding(id="engine.rule_error", severity="info",
                   title=f"rule {name} could not be evaluated",
                   evidence={"rule": name, "error": f"{type(exc).__name__}: {exc}"},
                   recommendation="Report this as a wanprobe bug with the report attached.",
                   expected_effect="")


def run_rules(measurements: Mapping[str, Any], host: Mapping[str, Any] | None,
              config: DiagnoseConfig | None = None,
              rules: Iterable[RuleFn] = ALL_RULES) -> list[Finding]:
    """All findings for these measurements, deduplicated and ranked (main fault first).
    ``measurements`` and ``host`` are the report's dicts, typed once here for every rule
    (:class:`Measured`, :class:`Host`); the peer, typed from the facts it sent, is judged by
    ``rules_host.PEER_RULES``.

    A rule that raises does not stop the others: it becomes an ``engine.rule_error`` finding.
    """
    config = config or DiagnoseConfig()
    rules = tuple(rules)
    measured = Measured.from_report(measurements)
    local = Host.from_report(host)
    peer = hosts(measured, local).peer
    calls = [(fn, local) for fn in rules] + \
        [(fn, peer) for fn in rules_host.PEER_RULES if peer is not None and fn in rules]
    found: list[Finding] = []
    for fn, judged in calls:
        try:
            result = fn(measured, judged, config)
        except Exception as exc:  # one broken rule must not cost the whole diagnosis
            found.append(_rule_error(fn, exc))
            continue
        if isinstance(result, Finding):
            found.append(result)
        elif isinstance(result, list):
            found.extend(result)
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
