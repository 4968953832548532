"""The daemon's own page (``/``): every peer with its last session, RTT bands over the window for
the peers furthest above their baselines, the site x site matrix with a mesh file, path events,
tuning changes and the reflector's refusals.

Every peer is a row of the table; a band is drawn for at most MAX_BANDS of them (the highest
excess first, then by name), so the page and its cost stay bounded at 1,000 peers: each band is
one indexed range query, the table comes from memory. ``/peer/NAME`` draws any one peer.
"""

from __future__ import annotations

import urllib.parse

from wanprobe.pictures.history_data import HistoryReader, bucket_s, tuning_changes
from wanprobe.pictures.html import Markup, Page, esc, link, table
from wanprobe.pictures.peer_html import (
    PeerView,
    add_event_tables,
    add_peer_section,
    band_spec,
    ms,
    pct,
    span,
    utc,
)
from wanprobe.pictures.state import EXCESS_STEPS, DaemonState, PeerState, excess_class
from wanprobe.probe.loss_window import WindowLoss

MAX_BANDS = 12


def peer_href(name: str, window: str | None = None) -> str:
    href = "/peer/" + urllib.parse.quote(name, safe="")
    return href + (f"?window={urllib.parse.quote(window, safe='')}" if window else "")


def ranked(peers: tuple[PeerState, ...]) -> list[PeerState]:
    """Highest excess first (unknown last), then by name."""
    return sorted(peers, key=lambda p: (-(p.excess.score if p.excess.score is not None
                                          else float("-inf")), p.name))


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def legend() -> Markup:
    parts, lo = [], 0.0
    for limit, cls in EXCESS_STEPS:
        text = f"≥ {lo:g}" if limit == float("inf") else f"{lo:g}–{limit:g}"
        parts.append(f'<span class="{cls}">{esc(text)}</span>')
        lo = limit
    parts.append('<span class="xn">no baseline yet</span>')
    return Markup('<p class="legend">Excess over each path\'s own baseline, in units of the '
                  "daemon's regression threshold: " + "".join(parts) + "</p>")


def window_loss(w: WindowLoss | None) -> str:
    """``2.9 % (1.6–5.3 %, n=300)``: a windowed loss with its interval and sample."""
    if w is None or not w.of:
        return "-"
    lo, hi = w.ci95
    return f"{pct(w.ratio)} ({pct(lo)}–{pct(hi)}, n={w.of:,})"


def peer_table(state: DaemonState, window: str | None) -> Markup:
    peers = ranked(state.peers)
    rows = []
    for p in peers:
        rtt = (p.last or {}).get("rtt_ms") or {}
        loss = p.loss_short or {}
        rows.append((link(peer_href(p.name, window), p.name), p.site or "-", p.address, p.method,
                     utc(p.last_ts), ms(rtt.get("p50")), ms(rtt.get("p99")),
                     window_loss(loss.get("round_trip")), window_loss(loss.get("forward")),
                     window_loss(loss.get("reverse")), ms(p.baseline.get("rtt_p50_ms")),
                     _x(p.excess.score), ", ".join(p.degraded) or "-"))
    short = state.peers[0].loss_short if state.peers and state.peers[0].loss_short else None
    span = f"last {next(iter(short.values())).window_s / 60:g} min" if short else "window"
    return table(["peer", "site", "address", "method", "last session (UTC)", "p50 ms", "p99 ms",
                  f"loss, {span} (95 % interval, probes)", "forward", "reverse",
                  "baseline p50 ms", "excess", "regressed"],
                 rows, numeric=range(5, 12),
                 row_classes=[excess_class(p.excess.score) for p in peers])


def overview_page(state: DaemonState, *, window_s: float, window: str | None) -> Page:
    """The whole ``/`` page (``window``: the ``?window=`` text, kept in the links)."""
    from wanprobe.pictures.matrix_html import site_matrix

    title = f"wanprobe on {state.host}" + (f" ({state.site})" if state.site else "")
    page = Page(title)
    page.h(1, title)
    page.p(f"wanprobe {state.version}; {len(state.peers)} peers probed every "
           f"{state.probe_interval_s:g} s; reflector {state.reflector}; drawn at "
           f"{utc(state.now)} UTC over the last {span(window_s)}", cls="meta")
    page.add(legend())
    if state.fleet:
        page.h(2, "Sites")
        page.add(site_matrix(state))
    since = state.now - window_s
    top = ranked(state.peers)[:MAX_BANDS]
    with HistoryReader(state.db_path) as reader:
        events = reader.events(None, since)
        changes = tuning_changes(state.tune_state_dir, since)
        page.h(2, f"RTT over the last {span(window_s)}"
               + (f": the {len(top)} peers furthest above their baselines"
                  if len(state.peers) > len(top) else ""))
        for p in top:
            page.add(Markup(f"<h3>{link(peer_href(p.name, window), p.name)}"
                            f"{esc(f' ({p.site})' if p.site else '')}</h3>"))
            band = reader.band(p.name, p.method, since=since, until=state.now,
                               bucket=bucket_s(window_s))
            mine = [e for e in events if e["peer"] == p.name]
            page.chart(band_spec(band, f"RTT to {p.name}: min to p99 band, p50, loss marks",
                                 mine, changes))
    page.h(2, f"Peers ({len(state.peers)})")
    page.add(peer_table(state, window))
    add_event_tables(page, events, changes)
    page.h(2, "Reflector refusals (since start)")
    if state.refusals:
        page.add(table(["reason", "datagrams or connections"], sorted(state.refusals.items()),
                       numeric=[1]))
    else:
        page.p("none" if state.reflector == "ok" else f"reflector {state.reflector}", cls="note")
    return page


def peer_page(state: DaemonState, peer: PeerState, *, window_s: float) -> Page:
    """``/peer/NAME``: one peer over the window."""
    title = f"wanprobe on {state.host}: {peer.name}"
    page = Page(title)
    page.add(Markup(f'<p><a href="/">← all peers</a></p><h1>{esc(title)}</h1>'))
    with HistoryReader(state.db_path) as reader:
        add_peer_section(page, reader, PeerView(peer.name, peer.site, peer.address, peer.method),
                         window_s=window_s, now=state.now, state_dir=state.tune_state_dir)
    return page
