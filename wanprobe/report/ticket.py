"""What a ticket to a carrier or a network team carries (issue 36), for the Markdown and the HTML
renderers alike: both ends' addresses, the times in UTC, each direction's loss with its sample
and 95 % interval, the RTT percentiles, the one-way delay where the clocks allow it, the path's
capacity and how it was measured, the MTU, what became of the DSCP, both directions' rates, the
ECMP paths when ``paths`` was measured — and text a reader outside wanprobe can follow: no rule
ids, no references to files that are not in the package (:func:`plain`).

Pure: a :class:`~wanprobe.report.document.Report` in, rows of text out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from wanprobe.diagnose.measured import LossSample, Measured, ThroughputMeasured
from wanprobe.report.document import Report
from wanprobe.units import dscp_name, format_rate

# "(R-9)", "R-7:", "tcp-tuning.md §3.1", "roce-nccl.md §2.6", "[path.window_limited] ". A file
# name starts a word and is at most 64 characters: linear in the text (an unbounded [\w-]+ before
# ".md" backtracked quadratically over a long word: 250 s for one 3,000-finding report)
_INTERNAL = re.compile(r"\s*\((?:R-\d+(?:, *R-\d+)*|[\w-]{1,64}\.md(?: §[\d.]+)?[^)]*)\)"
                       r"|\bR-\d+\b:?\s*|\s*(?<![\w-])[\w-]{1,64}\.md(?: §[\d.]+)?"
                       r"|\[[a-z]{1,32}\.[a-z_.]{1,64}\]\s*")
DIRECTION_LABELS = (("forward", "this host → the peer"), ("reverse", "the peer → this host"),
                    ("round_trip", "round trip"))


def plain(text: Any, fallback: str = "") -> str:
    """``text`` without the internal references a ticket's reader cannot follow (rule ids and
    the project's reference files), tidied; ``fallback`` where nothing else was said."""
    out = _INTERNAL.sub(" ", str(text))
    out = re.sub(r"\(\s*\)", "", out)
    out = re.sub(r"\s+([,;.)])", r"\1", re.sub(r" {2,}", " ", out)).strip()
    return out or fallback


def utc(iso: Any) -> str:
    """An ISO 8601 time as ``2026-12-06 02:10:33 UTC`` (the text as it is when it is not one)."""
    try:
        t = datetime.fromisoformat(str(iso).replace("Z", "+00:00"))
    except ValueError:
        return str(iso)
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


def loss_text(s: LossSample | None) -> str:
    """``2.94 % (10 of 340; 95 % interval 1.61–5.31 %)``."""
    if s is None:
        return "not counted"
    lo, hi = s.ci95
    return f"{s.ratio:.3%} ({s.lost:,} of {s.of:,}; 95 % interval {lo:.3%}–{hi:.3%})"


def _num(d: Any, *keys: str) -> float | None:
    for k in keys:
        d = d.get(k) if isinstance(d, Mapping) else None
    return d if isinstance(d, int | float) and not isinstance(d, bool) else None


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _owd(doc: Mapping[str, Any]) -> str | None:
    owd = doc.get("owd_ms") if isinstance(doc.get("owd_ms"), Mapping) else None
    if owd is None:
        return None
    fwd, rev = _num(owd, "forward", "p50"), _num(owd, "reverse", "p50")
    if fwd is None or rev is None:
        return f"not given: {plain(owd.get('withheld') or 'the clocks cannot bound it')}"
    bound = _num(owd, "clock_error_bound_ms")
    return (f"{fwd:.3f} / {rev:.3f} ms (p50; clocks {owd.get('clock_source') or '?'}, error "
            f"bound ± {_ms(bound)} ms)")


def _rate_text(t: ThroughputMeasured | None, doc: Any) -> str:
    if t is None or t.bits_per_second is None:
        return "not measured"
    omit, dur = _num(doc, "omit_s"), _num(doc, "requested_duration_s")
    how = (f", {dur - omit:g} s measured after {omit:g} s of ramp-up" if omit and dur else "")
    return (f"{format_rate(t.bits_per_second)} (one stream, {t.cc or '?'}{how}; limited by "
            f"{t.verdict or '?'})")


def _capacity(m: Measured, doc: Any) -> str | None:
    cap = m.path.capacity if m.path else None
    if cap is None:
        source = m.path.capacity_source if m.path else None
        return f"not measured ({plain(source)})" if source else None
    reason = doc.get("capacity_reason") if isinstance(doc, Mapping) else None
    text = f"{'≥ ' if cap.lower_bound else ''}{format_rate(cap.bits_per_second)}"
    return f"{text} ({plain(reason or cap.source)})"


def _dscp(m: Measured) -> str | None:
    d = m.path.dscp if m.path else None
    if d is None:
        return None

    def name(v: int | None) -> str:
        return "unknown" if v is None else f"{dscp_name(v)} ({v})"
    return (f"sent {name(d.sent)}, seen at the far end {name(d.at_reflector)}, returned "
            f"{name(d.returned)}")


def _mtu(m: Measured) -> str | None:
    mtu = m.mtu
    if mtu is None or mtu.path_mtu_bytes is None:
        return None
    icmp = ("ICMP unknown" if mtu.icmp_seen is None
            else "ICMP 'fragmentation needed' seen" if mtu.icmp_seen else "no ICMP seen")
    iface = f", interface {mtu.iface} {mtu.iface_mtu_bytes:.0f} B" if mtu.iface_mtu_bytes else ""
    return f"{mtu.path_mtu_bytes:.0f} B{iface} ({icmp})"


def path_rows(report: Report) -> list[tuple[str, str]]:
    """(label, value) rows of the path: what a carrier asks for first."""
    r, m = report, report.measured
    meas = r.measurements
    host_addr = r.host.get("address") or "?"
    rows = [("source → destination", f"{host_addr} ({r.host.get('hostname') or '?'}) → "
                                     f"{r.peer.get('address')} port {r.peer.get('port') or '?'}"),
            ("measured", f"{utc(r.timestamps.get('started') or r.created_at)} – "
                         f"{utc(r.timestamps.get('finished') or r.created_at)}")]
    path = meas.get("path") if isinstance(meas.get("path"), Mapping) else None
    if m.path is not None and path is not None:
        p = m.path
        how = ", ".join(x for x in (
            f"{_num(path, 'loss', 'sent') or 0:,.0f} {p.method.upper()} probes",
            f"every {p.interval_s * 1e3:g} ms" if p.interval_s else "",
            f"{p.size_bytes:.0f} B" if p.size_bytes else "",
            f"from {utc(p.started_at)}" if p.started_at else "") if x)
        rows.append(("RTT min / p50 / p90 / p99", " / ".join(
            _ms(_num(path, "rtt_ms", k)) for k in ("min", "p50", "p90", "p99")) + f" ms ({how})"))
        for direction, label in DIRECTION_LABELS:
            s = p.loss_of(direction)
            if s is not None or direction != "round_trip":
                rows.append((f"loss, {label}", loss_text(s)))
        owd = _owd(path)
        if owd:
            rows.append(("one-way delay forward / reverse", owd))
    for label, value in (("path capacity", _capacity(m, meas.get("capacity"))),
                         ("path MTU", _mtu(m)), ("DSCP", _dscp(m))):
        if value:
            rows.append((label, value))
    rows.append(("throughput, this host → the peer", _rate_text(m.throughput,
                                                                meas.get("throughput"))))
    rows.append(("throughput, the peer → this host", _rate_text(m.throughput_reverse,
                                                                meas.get("throughput_reverse"))))
    if m.paths_summary:
        summary = m.paths_summary
        rows.append(("ECMP paths (`wanprobe paths`)",
                     f"{summary.get('distinct_paths', '?')} distinct paths over "
                     f"{summary.get('flows', '?')} flows; loss differs between them: "
                     f"{summary.get('differ_loss')}"))
    return rows
