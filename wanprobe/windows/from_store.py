"""One peer's profile from a host's own history (the daemon's SQLite store).

Goodput samples are the peer's scheduled throughput tests that gave a rate; path observations
are its probe sessions of one method (STAMP by default: the method with forward and reverse
loss, RFC 8762), raw or downsampled (a downsampled row stands for ``sessions`` sessions; its
loss ratios are the bucket's means, store.py). Lost packets are recovered from the stored
ratios: forward = ratio x sent, reverse = ratio x (sent - forward lost).
"""

from __future__ import annotations

import time
from pathlib import Path

from wanprobe.errors import shown
from wanprobe.history.store import ProbeRow, Store, open_readonly
from wanprobe.userfiles import check_path_text
from wanprobe.windows.profile import (
    GoodputSample,
    PathObservation,
    Profile,
    ProfileError,
    build_profile,
    lookback_span,
)


def observation(row: ProbeRow) -> PathObservation:
    """A probe row as a path observation (ms to seconds, ratios to packet counts)."""
    sent = row.sent if row.sent else None
    fwd = None if sent is None or row.loss_forward_ratio is None else row.loss_forward_ratio * sent
    rev = (None if fwd is None or row.loss_reverse_ratio is None
           else row.loss_reverse_ratio * (sent - fwd))
    return PathObservation(ts=row.ts, sessions=row.sessions,
                           rtt_p50_seconds=None if row.rtt_p50_ms is None else row.rtt_p50_ms / 1e3,
                           sent=sent, lost_forward=fwd, lost_reverse=rev)


def store_profile(store: Store, peer: str, *, lookback_s: float, now_ts: float | None = None,
                  method: str = "stamp") -> Profile:
    """The profile of ``peer`` over the last ``lookback_s`` (whole hours) of ``store``."""
    now_ts = time.time() if now_ts is None else now_ts
    start, end = lookback_span(now_ts, lookback_s)
    tests = store.throughput(peer, since=start)
    rows = [r for r in store.probes(peer, since=start) if r.method == method]
    if not tests and not rows:
        known = store.peers()
        listed = ", ".join(shown(p) for p in known[:12]) + (" …" if len(known) > 12 else "")
        raise ProfileError(f"no history for peer {shown(peer)} in the last "
                           f"{lookback_s / 86400:g} days of {store.path}; "
                           + (f"peers with history: {listed}" if known else "the store is empty"))
    goodput = [GoodputSample(t["ts"], float(t["bits_per_second"])) for t in tests
               if t["bits_per_second"] is not None and t["error"] is None]
    return build_profile(goodput, [observation(r) for r in rows], start_ts=start, end_ts=end,
                         source={"kind": "store", "path": str(store.path), "peer": peer,
                                 "method": method})


def state_dir_profile(state_dir: str | Path, peer: str, *, lookback_s: float,
                      now_ts: float | None = None, what: str = "--state-dir") -> Profile:
    """``store_profile`` of the daemon history in ``state_dir`` (opened read-only for it)."""
    store = open_readonly(check_path_text(state_dir, what) / "history.sqlite3")
    try:
        return store_profile(store, peer, lookback_s=lookback_s, now_ts=now_ts)
    finally:
        store.close()
