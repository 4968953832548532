"""The STAMP reflector's session table: no source can fill it, and nothing in it is scanned.

A stateful Session-Reflector keeps per-session counters (RFC 8762 §4.3; a session is the SSID
plus the 4-tuple, RFC 8972 §3). Sessions are created by unauthenticated datagrams, so the table is
bounded twice, each bound enforced by evicting the least recently used entry in O(1)
(``OrderedDict.popitem(last=False)``):

- each source group (an IPv4 address, an IPv6 /64; below) holds at most ``per_source``
  sessions: a flood of new SSIDs from one source only recycles that source's own entries;
- the whole table holds at most ``max_sessions``: a new session from anyone evicts the globally
  least recently used one instead of being refused.

Eviction recycles only sessions that are not still probing (issue 19: a flood of new sessions,
from the prober's own address or from many others, evicted the prober's session, its counters
restarted and the sender read that as forward loss). A session is *active* while it has seen at
least two probes and the last one is no older than ``PROTECT_GAPS`` of its own mean gap between
probes (at least ``PROTECT_MIN_S``, at most ``idle_s``), and for ``PROTECT_NEW_S`` after a first
probe that starts a session (a sender numbers a session's probes from zero, RFC 8762 §4.2.1; the
reflector marks a first probe numbered below ``START_SEQS``): otherwise a flood that cycles the
share faster than the prober's interval would evict every new session before its second probe. When the entry that would be evicted is
active it gets a second chance (moved to the back, as in the CLOCK algorithm) and the next one is
tried, at most ``SECOND_CHANCES`` times; when all of those are active, the new session is refused
(``refused``) instead of evicting one that is in use. A flood of one-probe sessions therefore only
recycles itself, and a flood of two-probe sessions can lock out new sessions of its own source
(its share is full of active ones) but never reset a session that is probing.

A flood from many sources fills the table, not one share: the issue-37 reproducer (64 sources
x 1,024 SSIDs, two probes each) held every slot with active sessions, so every new session of
every other prober was refused, and the daemon starts a new session every interval. Shares are
therefore held per *source group* (an IPv4 address; an IPv6 /64, :func:`source_group`) and
kept max-min fair: when the table is full and no idle session can go, a new session of a group
holding ``n`` sessions takes the least recently used session (idle if one of the first
SECOND_CHANCES is, else even an active one) of a largest group, provided that group holds at
least ``n + 2`` (so afterwards it still holds more than the newcomer). A prober with a session
or two is never the largest group while a flood holds the table, so its running sessions are
never taken and its new ones always find room; the flood only loses its own. What is left
cannot be told from a prober without authentication: a flood spread over as many source groups
as the table has sessions (one each) or one from the prober's own group. Such a refusal is told
to the sender (reflector.py answers it with the Reflector Report TLV's refused flag), which
reports it as refused, never as path loss. Authenticated mode drops unsigned datagrams before
the table (RFC 8762 §4.4); replays of captured probes from spoofed sources are what can still
reach it there, and they are shared out the same way.

Idle sessions expire from the front of the global LRU order a few at a time, so no packet ever
walks the table; the largest group is found in O(1) (groups are kept in buckets by how many
sessions they hold). A session is a list indexed by the constants below (mutable in place):
receive and transmit counts, last and first time seen, the follow-up stamp of its last reply, a
random epoch chosen at creation (a new epoch tells the sender its session restarted:
reflector_report.py), its probes refused for the rate limit or by authentication, its
anti-replay window (replay_window.py), whether it started with a first probe, and its source
group.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterator

from wanprobe.addresses import source_group

MAX_SESSIONS = 65536
PER_SOURCE = 1024
_EXPIRE_PER_CALL = 8
PROTECT_MIN_S = 1.0     # a session that probed within this is never evicted
PROTECT_NEW_S = 2.0     # nor a session started (probe 0-3) within this, before its second probe
START_SEQS = 4          # a first probe numbered below this starts a session (RFC 8762 §4.2.1)
PROTECT_GAPS = 4.0      # ... nor one that probed within 4 of its own mean gaps (up to idle_s)
SECOND_CHANCES = 8      # active entries skipped per new session before it is refused
# session list indices
(RX, TX, SEEN, FOLLOW_UP, EPOCH, FIRST, RATE_LIMITED, REFUSED, REPLAY_HI, REPLAY_MASK, START,
 GROUP) = range(12)


def new_session(now_s: float, group: str | bytes | None = None) -> list:
    """A fresh session: counts 0, seen now, a random non-zero 32-bit epoch, an empty replay
    window (highest sequence number -1), not (yet) marked as a session's start."""
    return [0, 0, now_s, None, random.getrandbits(32) or 1, now_s, 0, 0, -1, 0, False, group]


def is_active(sess: list, now_s: float, idle_s: float) -> bool:
    """True while ``sess`` is still probing (module docstring): two probes or more, the last one
    within PROTECT_GAPS of its mean gap (clamped to [PROTECT_MIN_S, idle_s])."""
    rx = sess[RX]
    if rx < 2:
        return sess[START] and now_s - sess[SEEN] <= PROTECT_NEW_S
    gap_s = (sess[SEEN] - sess[FIRST]) / (rx - 1)
    return now_s - sess[SEEN] <= min(idle_s, max(PROTECT_MIN_S, PROTECT_GAPS * gap_s))


class SessionTable:
    """Sessions keyed by ``(ssid, source, source port, local address)``; ``per_source`` and the
    fair share are per source group (:func:`source_group`)."""

    def __init__(self, *, max_sessions: int = MAX_SESSIONS, per_source: int = PER_SOURCE,
                 idle_s: float = 120.0) -> None:
        self.max_sessions = max(1, max_sessions)
        self.per_source = max(1, min(per_source, self.max_sessions))
        self.idle_s = idle_s
        self._lru: OrderedDict[tuple, list] = OrderedDict()
        self._by_group: dict[str | bytes, OrderedDict[tuple, None]] = {}
        self._level: dict[int, dict[str | bytes, None]] = {}   # n -> the groups holding n
        self._top = 0                                          # the most any group holds
        self.evicted = 0
        self.refused = 0
        self.reclaimed = 0   # sessions taken from the largest group for a smaller one

    def __len__(self) -> int:
        return len(self._lru)

    def items(self) -> Iterator[tuple[tuple, list]]:
        """A snapshot of the sessions. ``stats()`` runs in another thread than the reflector's
        loop, and a garbage collection inside ``list()`` can hand the GIL to that loop mid-copy
        (OrderedDict then raises "mutated during iteration"): copy again rather than lock the
        per-packet path."""
        while True:
            try:
                return iter(list(self._lru.items()))
            except RuntimeError:
                continue

    def sources(self) -> int:
        """Source groups holding sessions."""
        return len(self._by_group)

    def touch(self, key: tuple, now_s: float) -> list | None:
        """The session for ``key`` (created if new), marked as used at ``now_s``; None when it
        is new and there is no room it may take (module docstring): refused."""
        sess = self._lru.get(key)
        if sess is not None:
            self._lru.move_to_end(key)
            self._by_group[sess[GROUP]].move_to_end(key)
            sess[SEEN] = now_s
            return sess
        self.expire(now_s)
        group = source_group(key[1])
        mine = self._by_group.get(group)
        held = 0 if mine is None else len(mine)
        if held >= self.per_source:
            if not self._recycle(mine, now_s):
                self.refused += 1
                return None
        elif len(self._lru) >= self.max_sessions and not self._recycle(self._lru, now_s) \
                and not self._reclaim(held, now_s):
            self.refused += 1
            return None
        mine = self._by_group.get(group)
        if mine is None:
            mine = self._by_group[group] = OrderedDict()
        sess = new_session(now_s, group)
        self._lru[key] = sess
        mine[key] = None
        self._moved(group, len(mine) - 1, len(mine))
        return sess

    def _recycle(self, order: OrderedDict, now_s: float) -> bool:
        """Evict the least recently used entry of ``order`` (a group's or the global order)
        that is not active; active ones met on the way move to the back. False if none of the
        first SECOND_CHANCES was idle."""
        for _ in range(min(SECOND_CHANCES, len(order))):
            key = next(iter(order))
            if not is_active(self._lru[key], now_s, self.idle_s):
                self._evict(key)
                self.evicted += 1
                return True
            order.move_to_end(key)
        return False

    def _reclaim(self, held: int, now_s: float) -> bool:
        """Room for a new session of a group holding ``held``, taken from a largest group if it
        holds at least ``held + 2`` (max-min fair): its least recently used idle session, else
        its least recently used one. False when no group holds that many."""
        if self._top < held + 2:
            return False
        order = self._by_group[next(iter(self._level[self._top]))]
        if not self._recycle(order, now_s):
            self._evict(next(iter(order)))
            self.evicted += 1
        self.reclaimed += 1
        return True

    def _moved(self, group: str | bytes, old: int, new: int) -> None:
        """``group`` went from ``old`` to ``new`` sessions: its bucket and the top, in O(1)."""
        if old:
            level = self._level[old]
            del level[group]
            if not level:
                del self._level[old]
                if self._top == old:
                    self._top = new
        if new:
            self._level.setdefault(new, {})[group] = None
            if new > self._top:
                self._top = new

    def expire(self, now_s: float, limit: int = _EXPIRE_PER_CALL) -> None:
        """Drop up to ``limit`` sessions idle longer than ``idle_s`` (oldest first)."""
        for _ in range(limit):
            if not self._lru:
                return
            key = next(iter(self._lru))
            if now_s - self._lru[key][SEEN] <= self.idle_s:
                return
            self._evict(key)

    def _evict(self, key: tuple) -> None:
        group = self._lru.pop(key)[GROUP]
        mine = self._by_group[group]
        del mine[key]
        if not mine:
            del self._by_group[group]
        self._moved(group, len(mine) + 1, len(mine))
