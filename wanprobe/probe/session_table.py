"""The STAMP reflector's session table: no source can fill it, and nothing in it is scanned.

A stateful Session-Reflector keeps per-session counters (RFC 8762 §4.3; a session is the SSID
plus the 4-tuple, RFC 8972 §3). Sessions are created by unauthenticated datagrams, so the table is
bounded twice, each bound enforced by evicting the least recently used entry in O(1)
(``OrderedDict.popitem(last=False)``):

- each source address holds at most ``per_source`` sessions: a flood of new SSIDs from one
  source only recycles that source's own entries;
- the whole table holds at most ``max_sessions``: a new session from anyone evicts the globally
  least recently used one instead of being refused.

Idle sessions expire from the front of the global LRU order a few at a time, so no packet ever
walks the table. A session is a list ``[rx, tx, last_seen_s, follow_up]`` (mutable in place).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

MAX_SESSIONS = 65536
PER_SOURCE = 1024
_EXPIRE_PER_CALL = 8


class SessionTable:
    """Sessions keyed by ``(ssid, source, source port, local address)``."""

    def __init__(self, *, max_sessions: int = MAX_SESSIONS, per_source: int = PER_SOURCE,
                 idle_s: float = 120.0) -> None:
        self.max_sessions = max(1, max_sessions)
        self.per_source = max(1, min(per_source, self.max_sessions))
        self.idle_s = idle_s
        self._lru: OrderedDict[tuple, list] = OrderedDict()
        self._by_source: dict[str, OrderedDict[tuple, None]] = {}
        self.evicted = 0

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
        return len(self._by_source)

    def touch(self, key: tuple, now_s: float) -> list:
        """The session for ``key`` (created if new), marked as used at ``now_s``."""
        sess = self._lru.get(key)
        source = key[1]
        if sess is not None:
            self._lru.move_to_end(key)
            self._by_source[source].move_to_end(key)
            sess[2] = now_s
            return sess
        self.expire(now_s)
        mine = self._by_source.get(source)
        if mine is None:
            mine = self._by_source[source] = OrderedDict()
        if len(mine) >= self.per_source:
            old, _ = mine.popitem(last=False)
            del self._lru[old]
            self.evicted += 1
        elif len(self._lru) >= self.max_sessions:
            self._evict_oldest()
            self.evicted += 1
            mine = self._by_source.setdefault(source, mine)
        sess = [0, 0, now_s, None]
        self._lru[key] = sess
        mine[key] = None
        return sess

    def expire(self, now_s: float, limit: int = _EXPIRE_PER_CALL) -> None:
        """Drop up to ``limit`` sessions idle longer than ``idle_s`` (oldest first)."""
        for _ in range(limit):
            if not self._lru:
                return
            key = next(iter(self._lru))
            if now_s - self._lru[key][2] <= self.idle_s:
                return
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        key, _ = self._lru.popitem(last=False)
        mine = self._by_source[key[1]]
        del mine[key]
        if not mine:
            del self._by_source[key[1]]
