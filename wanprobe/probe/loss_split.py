"""Loss per direction from the reflector's counters, without the reflector's own drops and across
restarts of its session (a pure function of one session's answered replies).

The reflector's receive count at each answered probe (Direct Measurement R_RxC, RFC 8972 §4.5, or
a stateful reflector's own sequence number, RFC 8762 §4.3.1) splits loss by direction: between two
answered probes, the probes sent minus the probes the reflector received were lost on the way
there, and those it received minus those it answered (its drops, from the Reflector Report TLV,
reflector_report.py) minus the replies that came back were lost on the way back. Copies the
reflector refused as replays (authenticated mode) were never counted as received, so they take
nothing away: they are reported, not subtracted. Summed over the
session this is the familiar "sent up to the last answered probe - received" (issue 3), with the
reflector's drops taken out of both directions (issue 20: they are the reflector's, not the
path's).

A counter that restarts (the reflector evicted or reset the session; issue 19) would make every
probe before the restart look lost. A restart is recognised by a new session epoch in the
Reflector Report TLV, or, from a reflector that has no epoch, by a receive count that fell back
to no more than the probes sent since the previous answer (a forward reordering makes the count
fall by a little, never to that). The session is then split at the restart: each part is
accounted on its own, and the probes in the gap before the first answer of a new part, which
could have reached either incarnation, are counted as ``unattributed`` instead of as lost in
either direction. Probes after the last answered one cannot be attributed to a direction; they
count in the round-trip ratio (``tail``), unless the reflector was dropping probes of this
session, or of a sibling flow from the same host (multiflow.py): then each could be its drop as
well as the path's loss, and they are ``unattributed`` too (at twice the limit, the last few
probes of one flow of sixteen are often all the reflector's).

A probe whose new session the reflector refused (its Reflector Report TLV's session-refused
flag, issue 37) reached no session and is counted nowhere: it is taken out of the sequence
(``reflector_session_refused``), and a refusal between two answers splits the session as a
restart does (the session after it is a new one, admitted later), the unanswered probes
around it ``unattributed``: each could be a refusal whose answer was rate-limited or lost.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import replace
from typing import NamedTuple

from wanprobe.probe import stats
from wanprobe.probe.result import LossStats


class _Point(NamedTuple):
    """One answered probe as the reflector counted it."""

    sseq: int
    rx: int                        # reflector receive count including this probe
    epoch: int | None = None
    rate_limited: int = 0
    refused: int = 0


_START = _Point(-1, 0)


def split_loss(sent: int, received: int, late: int, kept: list, reports=None) -> LossStats:
    """``kept``: the answered replies in sender sequence order (probe_summary.Reply);
    ``reports``: the session's ReportLog (reflector_report.py) or None. Long because: one pass
    over the answered probes keeps every count of a part together."""
    points = _points(kept, received, reports.by_seq if reports is not None else {})
    answered = [r.sseq for r in kept]
    no = _refusals(sent, answered, reports)
    if not points:
        if not no:
            return LossStats(sent, received, stats.wilson_interval(sent - received, sent),
                             late=late)
        unanswered = sent - received - len(no)   # a refusal whose answer was lost, or loss
        return LossStats(sent, received, stats.wilson_interval(0, received), late=late,
                         unattributed=unanswered, reflector_session_refused=len(no))

    def refused_in(lo: int, hi: int) -> int:   # refusals in (lo, hi]
        return bisect_right(no, hi) - bisect_right(no, lo) if no else 0

    known = bool(points) and all(p.epoch is not None for p in points)
    fwd = fwd_of = rev = rev_of = limited = refused = resets = unattributed = 0
    base, prev = _START, None
    for p in points + [None]:
        if p is not None and prev is None:
            if refused_in(-1, p.sseq):   # admitted after refusals: its count starts at p
                unattributed += p.sseq + 1 - bisect_right(answered, p.sseq) - refused_in(-1, p.sseq)
                base = p
            prev = p
            continue
        if p is not None and not _restarted(prev, p) and not refused_in(prev.sseq, p.sseq):
            prev = p
            continue
        window = prev.sseq - base.sseq
        reached = min(max(0, prev.rx - base.rx), window)
        got = bisect_right(answered, prev.sseq) - bisect_right(answered, base.sseq)
        # a count that went down or claims more than went unanswered is not believed
        dropped = min(max(0, prev.rate_limited - base.rate_limited),
                      max(0, reached - got)) if known else 0
        fwd += window - reached
        fwd_of += window
        rev += max(0, reached - dropped - got)
        rev_of += reached - dropped
        limited += dropped
        refused += max(0, prev.refused - base.refused) if known else 0
        if p is not None:   # a restart (or a refusal) between prev and p: p starts a part
            resets += _restarted(prev, p)
            unattributed += (p.sseq - prev.sseq) - (bisect_right(answered, p.sseq)
                                                    - bisect_right(answered, prev.sseq)) \
                - refused_in(prev.sseq, p.sseq)
            base = prev = p
    dropped = limited if known else 0
    tail = (sent - 1 - prev.sseq) - (len(answered) - bisect_right(answered, prev.sseq)) \
        - refused_in(prev.sseq, sent)
    if dropped or refused_in(prev.sseq, sent):   # the tail: the reflector's or the path's
        unattributed, tail = unattributed + tail, 0
    path_sent = sent - dropped - unattributed - len(no)
    return LossStats(
        sent, received, stats.wilson_interval(path_sent - received, path_sent),
        forward_lost=fwd, forward_of=fwd_of, reverse_lost=rev, reverse_of=rev_of,
        forward_ci95=stats.wilson_interval(fwd, fwd_of),
        reverse_ci95=stats.wilson_interval(rev, rev_of), late=late,
        reflector_rate_limited=limited if known else None,
        reflector_replays_refused=refused if known else None,
        reflector_resets=resets, unattributed=unattributed, tail=tail,
        reflector_session_refused=len(no))


def _refusals(sent: int, answered: list[int], reports) -> list[int]:
    """The probes (sender sequence numbers, sorted) whose new session the reflector refused and
    that no other answer contradicts."""
    said = getattr(reports, "session_refused", None)
    if not said:
        return []
    got = set(answered)
    return sorted(s for s in said if 0 <= s < sent and s not in got)


def _points(kept: list, received: int, by_seq: dict) -> list[_Point] | None:
    """The answered probes with a receive count (Direct Measurement, else a stateful reflector's
    sequence number, else "nothing lost yet"); None when the reflector gives no count."""
    if not kept:
        return None
    dm = [r for r in kept if r.reflector_rx_count is not None]
    if dm:
        pairs = [(r.sseq, r.reflector_rx_count) for r in dm]
    elif any(r.reflector_seq is not None and r.reflector_seq != r.sseq for r in kept):
        pairs = [(r.sseq, r.reflector_seq + 1) for r in kept if r.reflector_seq is not None]
    elif kept[-1].reflector_seq is not None and received == kept[-1].sseq + 1:
        pairs = [(r.sseq, r.sseq + 1) for r in kept]   # nothing lost up to here
    else:
        return None
    out = []
    for sseq, rx in pairs:
        rep = by_seq.get(sseq)
        out.append(_Point(sseq, rx) if rep is None else _Point(sseq, rx, *rep))
    return out


def _restarted(prev: _Point, cur: _Point) -> bool:
    """True if the reflector's session restarted between two answered probes (module
    docstring): a new epoch, or, without epochs, a count that fell back to a restart's."""
    if prev.epoch is not None and cur.epoch is not None:
        return prev.epoch != cur.epoch
    return cur.rx < prev.rx and cur.rx <= cur.sseq - prev.sseq


def share_tails(results: list) -> list:
    """Sessions of one host to one reflector at the same time (the flows of ``paths`` and
    ``probe --flows``) share its per-source rate limit: when any of them says the reflector
    dropped probes, every flow's unanswered tail could be its drop too (``unattributed``)."""
    if not any(r.loss.reflector_rate_limited for r in results):
        return results
    return [replace(r, loss=r.loss.tail_unattributed()) for r in results]
