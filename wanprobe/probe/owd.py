"""One-way delay per direction, with the clock error that bounds it (issue 20).

Forward delay = T2 - T1 (sender's kernel TX stamp to the reflector's kernel RX stamp), reverse
delay = T4 - T3 (RFC 7679 §3 one-way delay; STAMP timestamps, RFC 8762 §4). Each mixes the two
hosts' clocks, so an offset between them moves one direction up and the other down by the same
amount (their sum, the RTT, does not move). The absolute values are reported only with a bound
on that offset:

- both ends read one kernel clock (same boot id, clock_tlvs.py's Same-clock TLV): bound 0;
- else each end's worst-case error (chrony: |offset| + root dispersion + root delay / 2; the
  far end's from the Error Estimate of its T2/T3, RFC 4656 §4.1.2) added: bound of the
  measurement. An end not synchronised to an external source (S bit clear), an invalid
  estimate, a bound not smaller than the smaller one-way minimum, or a one-way delay below
  minus the bound (which proves a declared error wrong; owamp users saw -267 ms reported with a
  1 ms estimate, perfsonar/owamp#66) withholds them (None, with the reason).

The variation survives any offset (RFC 3393 §1.1; RFC 5481 §4.2 PDV: each delay minus the
minimum of its direction) and is always reported: where a queue builds shows there even when
the clocks say nothing. A third-party reflector cannot tell whether it shares our clock; its
own Error Estimate is then taken at its word, and the result says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from collectors.clock_state import ClockState
from wanprobe.errors import ConfigError, shown
from wanprobe.json_fields import fields, quantiles
from wanprobe.probe.clock_tlvs import FarClock
from wanprobe.probe.stats import percentiles_sorted

OWD_KEYS = ("min", "p50", "p90", "p99")
VARIATION_KEYS = ("p50", "p90", "p99", "max")
THIRD_PARTY_NOTE = ("the reflector did not answer wanprobe's Same-clock TLV (a third-party or "
                    "older reflector): whether both ends share one clock is unknown, and its "
                    "own Error Estimate is taken at its word")


@dataclass(frozen=True)
class OwdClock:
    """Both ends' clocks for one session: this host's state and what the reflector said."""

    local: ClockState
    far: FarClock


@dataclass(frozen=True)
class OwdReport:
    """``forward``/``reverse``: min, p50, p90, p99 in ms, None when withheld; ``*_variation``:
    p50, p90, p99, max of each delay minus its direction's minimum (ms)."""

    forward: tuple[float, ...] | None
    reverse: tuple[float, ...] | None
    forward_variation: tuple[float, ...]
    reverse_variation: tuple[float, ...]
    clock_error_bound_ms: float | None
    clock_source: str
    withheld: str | None
    clock: OwdClock
    note: str | None = None
    forward_samples_ms: tuple[float, ...] = field(default=(), repr=False)
    reverse_samples_ms: tuple[float, ...] = field(default=(), repr=False)
    # the number of samples when they were not kept (read back from a report without them)
    sample_count: int | None = field(default=None, repr=False)

    @property
    def forward_spread_ms(self) -> float:
        """p99 - min of the forward delays (what a queue on the way there grows)."""
        return self.forward_variation[2]

    @property
    def reverse_spread_ms(self) -> float:
        return self.reverse_variation[2]

    def to_json(self) -> dict:
        def r(values, keys):
            return {k: (None if values is None else round(v, 6))
                    for k, v in zip(keys, values or [None] * len(keys), strict=True)}

        bound = self.clock_error_bound_ms
        return {
            "forward": r(self.forward, OWD_KEYS), "reverse": r(self.reverse, OWD_KEYS),
            "variation": {"forward": r(self.forward_variation, VARIATION_KEYS),
                          "reverse": r(self.reverse_variation, VARIATION_KEYS),
                          "reference": "min"},
            "clock_error_bound_ms": None if bound is None else round(bound, 6),
            "clock_source": self.clock_source, "withheld": self.withheld,
            "same_clock": self.clock.far.same_clock, "note": self.note,
            "local_clock": self.clock.local.to_json(), "far_clock": self.clock.far.to_json(),
            "samples": (len(self.forward_samples_ms) if self.sample_count is None
                        else self.sample_count),
        }

    @classmethod
    def from_json(cls, doc: Any) -> OwdReport | None:
        """``to_json`` read back (None: not measured); the derived clock keys are recomputed;
        ConfigError if malformed."""
        if doc is None:
            return None
        (forward, reverse, variation, bound, source, withheld, same, note, local, far,
         samples) = fields(doc, "path.owd_ms", OWD_DOC_KEYS)
        fv, rv = fields(variation, "path.owd_ms.variation", ("forward", "reverse"))
        where = "path.owd_ms.variation"
        return cls(quantiles(forward, "path.owd_ms.forward", OWD_KEYS),
                   quantiles(reverse, "path.owd_ms.reverse", OWD_KEYS),
                   tuple(fields(fv, where + ".forward", VARIATION_KEYS)),
                   tuple(fields(rv, where + ".reverse", VARIATION_KEYS)),
                   bound, source, withheld, OwdClock(clock_state(local), far_clock(far, same)),
                   note, sample_count=samples)


def _quantiles(values: Sequence[float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    a = sorted(values)
    lo = a[0]
    p50, p90, p99 = percentiles_sorted(a, (50, 90, 99))
    return (lo, p50, p90, p99), (p50 - lo, p90 - lo, p99 - lo, a[-1] - lo)


def judge(clock: OwdClock, forward_min_ms: float,
          reverse_min_ms: float) -> tuple[float | None, str, str | None, str | None]:
    """(bound ms, clock source, reason to withhold or None, note or None) for one session."""
    local, far = clock.local, clock.far
    if far.same_clock is True:
        return 0.0, "same-clock", None, None
    note = THIRD_PARTY_NOTE if far.same_clock is None else None
    source = f"{local.source}/{far.sync_source or 'unknown'}"
    if not local.synchronized:
        return None, source, f"this host's clock is not synchronised ({local.detail})", note
    if far.synchronized is not True:
        return None, source, ("the reflector's clock is not synchronised to an external source "
                              "(S bit clear or invalid Error Estimate)"), note
    bound = local.error_bound_ms + far.error_bound_ms
    low = min(forward_min_ms, reverse_min_ms)
    if low < -bound:
        return bound, source, (f"a one-way delay of {low:.3f} ms is below minus the clock error "
                               f"bound ({bound:.3f} ms): a declared clock error is wrong"), note
    if bound >= low:
        return bound, source, (f"the clock error bound {bound:.3f} ms is not smaller than the "
                               f"one-way delays (min {low:.3f} ms)"), note
    return bound, source, None, note


def owd_report(forward_ms: Sequence[float], reverse_ms: Sequence[float],
               clock: OwdClock | None) -> OwdReport | None:
    """The report for one session's per-probe delays (ms), or None without any."""
    if clock is None or not forward_ms or len(forward_ms) != len(reverse_ms):
        return None
    fq, fv = _quantiles(forward_ms)
    rq, rv = _quantiles(reverse_ms)
    bound, source, withheld, note = judge(clock, fq[0], rq[0])
    return OwdReport(None if withheld else fq, None if withheld else rq, fv, rv, bound, source,
                     withheld, clock, note, tuple(forward_ms), tuple(reverse_ms))


def merge(reports: Sequence[OwdReport | None]) -> OwdReport | None:
    """The flows of one multi-flow probe (same two hosts and clocks): pooled samples, judged
    against the first flow's clocks."""
    got = [r for r in reports if r is not None]
    if not got:
        return None
    return owd_report([x for r in got for x in r.forward_samples_ms],
                      [x for r in got for x in r.reverse_samples_ms], got[0].clock)


def text_rows(report: OwdReport | None) -> list[tuple[str, str]]:
    """Rows of ``probe``'s table: one-way delay per direction (or why it is withheld), its
    variation and the clock bound."""
    if report is None:
        return []

    def ms(v: float) -> str:
        return f"{v:.3f} ms"

    rows = []
    for name, vals, var in (("forward", report.forward, report.forward_variation),
                            ("reverse", report.reverse, report.reverse_variation)):
        rows.append((f"one-way {name} min / p50 / p99",
                     "withheld" if vals is None else
                     f"{vals[0]:.3f} / {vals[1]:.3f} / {vals[3]:.3f} ms"))
        rows.append((f"one-way {name} variation p50 / p99", f"{var[0]:.3f} / {ms(var[2])}"))
    bound = report.clock_error_bound_ms
    rows.append(("clock error bound", ("unknown" if bound is None else ms(bound))
                 + f" ({report.clock_source})"))
    if report.withheld:
        rows.append(("one-way withheld", report.withheld))
    if report.note:
        rows.append(("clock note", report.note))
    return rows


# -- read back (issue 21, one codec) --------------------------------------------------------
CLOCK_KEYS = ("source", "synchronized", "error_bound_ms", "sync_source", "detail", "offset_ms",
              "root_delay_ms", "root_dispersion_ms", "leap")


def clock_state(doc: Any) -> ClockState:
    return ClockState(*fields(doc, "path.owd_ms.local_clock", CLOCK_KEYS))


def far_clock(doc: Any, same_clock: bool | None) -> FarClock:
    words, sync, method = fields(doc, "path.owd_ms.far_clock",
                                 ("error_estimates", "sync_source", "timestamp_method"))
    try:
        error_words = tuple(int(w, 16) for w in words)
    except (TypeError, ValueError):
        raise ConfigError("path.owd_ms.far_clock: error_estimates must be hex words, got "
                          + shown(words)) from None
    return FarClock(error_words, sync, method, same_clock)


OWD_DOC_KEYS = ("forward", "reverse", "variation", "clock_error_bound_ms", "clock_source",
                "withheld", "same_clock", "note", "local_clock", "far_clock", "samples")


