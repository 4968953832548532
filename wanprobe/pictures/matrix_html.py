"""The site x site matrix of the daemon's page, each cell split by direction.

As in perfSONAR's MaDDash grid, the upper half of the cell in row R, column C is R → C and the
lower half C → R. One daemon measures the paths from its own site, so its row and column are
filled (forward loss is its site → the other, reverse loss the other → its site, both from the
STAMP counters, RFC 8762 §4.2.1); other cells are measured by the daemons there. A half is
coloured by the worst excess over baseline among the peers of that site pair (state.py), so a
130 ms pair and a 2 ms pair are on the same scale.
"""

from __future__ import annotations

import statistics

from wanprobe.pictures.html import Markup, esc
from wanprobe.pictures.peer_html import ms, pct
from wanprobe.pictures.state import DaemonState, PeerState, excess_class


def _half(arrow: str, peers: list[PeerState], forward: bool) -> str:
    """One direction of a site pair: the median RTT, and the worst peer's loss over the long
    window (its sample and interval in the tooltip)."""
    key = "forward" if forward else "reverse"
    scores = [s for p in peers if (s := p.excess.direction(forward)) is not None]
    score = max(scores) if scores else None
    p50s = [v for p in peers if (v := ((p.last or {}).get("rtt_ms") or {}).get("p50")) is not None]
    losses = [w for p in peers if (w := (p.loss_long or {}).get(key)) is not None and w.of]
    worst = max(losses, key=lambda w: w.ratio) if losses else None
    text = (f"{arrow} p50 {ms(statistics.median(p50s)) if p50s else '-'} ms, loss "
            f"{pct(worst.ratio) if worst else '-'}")
    tip = (f"{len(peers)} peers; worst excess {score:.2f} of the regression threshold"
           if score is not None else f"{len(peers)} peers; no baseline yet")
    if worst is not None:
        lo, hi = worst.ci95
        tip += (f"; loss over the last {worst.window_s / 60:g} min {pct(worst.ratio)} (95 % "
                f"interval {pct(lo)}–{pct(hi)}, {worst.lost:,} of {worst.of:,} probes)")
    return f'<div class="{excess_class(score)}" title="{esc(tip)}">{esc(text)}</div>'


def site_matrix(state: DaemonState) -> Markup:
    """Rows and columns: every site of the fleet this daemon probes, its own first."""
    by_site: dict[str, list[PeerState]] = {}
    for p in state.peers:
        by_site.setdefault(p.site, []).append(p)
    sites = [state.site] + sorted(s for s in by_site if s != state.site)
    head = "".join(f"<th>to {esc(s)}</th>" for s in sites)
    rows = []
    for row in sites:
        cells = []
        for col in sites:
            if row == state.site and col in by_site:      # we → col above, col → we below
                cell = _half("→", by_site[col], True) + _half("←", by_site[col], False)
            elif col == state.site and row in by_site:    # row → we above, we → row below
                cell = _half("→", by_site[row], False) + _half("←", by_site[row], True)
            else:
                cell = '<div class="xn">measured by the daemons there</div>'
            cells.append(f"<td>{cell}</td>")
        rows.append(f"<tr><th>from {esc(row)}</th>{''.join(cells)}</tr>")
    return Markup(f'<table class="matrix"><thead><tr><th></th>{head}</tr></thead><tbody>'
                  f"{''.join(rows)}</tbody></table><p class=\"note\">Each cell: upper half row → "
                  "column, lower half column → row (RTT is round trip; loss per direction).</p>")
