"""Anti-replay for authenticated STAMP: a sliding window over the Session-Sender's sequence
numbers, per session.

RFC 8762 §4.4 protects a test packet's integrity with an HMAC, but an HMAC does not make a packet
fresh: a captured authenticated probe verifies every time it is sent again, and before this a
reflector answered 9,998 of 9,998 replayed packets (issue 19). The Sequence Number (octets 0-3)
is covered by the HMAC (octets 0-95), so a reflector can keep, per session, which numbers it has
already accepted. The algorithm is the receiver's sliding window of IPsec ESP (RFC 4303 §3.4.3):
the highest number accepted and a bitmap of the ``WINDOW`` numbers below it (ESP asks for at
least 32 and defaults to 64; probes are cheap to remember and a reordering path can hold more
than 64 of them at a few thousand per second, so 1,024). A number above the highest moves the window; one inside it is
accepted once; one already seen, or older than the window, is a replay. (RFC 4086, sometimes
named for this, is about randomness, not replay.)

A STAMP sender numbers each session from 0 and never reuses a number (RFC 8762 §4.2.1), so only
replays and network duplicates are refused; reordering by fewer than ``WINDOW`` probes is not.
The check runs after the HMAC verified (an unauthenticated packet never moves the window) and
before the packet is counted or consumes rate-limit tokens. The window lives as long as its
session: a capture replayed after the session went idle and expired (session_table.py, 120 s)
opens a new session and is answered once more; a bound on that needs the probes' T1 checked
against the reflector's clock, which unsynchronised hosts cannot afford.
"""

from __future__ import annotations

from wanprobe.probe.session_table import REPLAY_HI, REPLAY_MASK

WINDOW = 1024                  # sequence numbers remembered below the highest one accepted
_ALL = (1 << WINDOW) - 1


def fresh(sess: list, seq: int) -> bool:
    """Accept ``seq`` for ``sess`` (mark it seen) and return True, or return False for a number
    already accepted or older than the window (a replay)."""
    hi = sess[REPLAY_HI]
    if seq > hi:
        shift = seq - hi
        sess[REPLAY_MASK] = ((sess[REPLAY_MASK] << shift) | 1) & _ALL if shift < WINDOW else 1
        sess[REPLAY_HI] = seq
        return True
    bit = 1 << (hi - seq) if hi - seq < WINDOW else 0
    if not bit or sess[REPLAY_MASK] & bit:
        return False
    sess[REPLAY_MASK] |= bit
    return True
