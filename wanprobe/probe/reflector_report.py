"""The Reflector Report TLV: a wanprobe reflector tells the sender, in every reply, what it
received from the session and did not answer, and the rate it answers at.

Why this channel (issue 20: a reflector's rate limit was reported as 36-74 % forward loss):

- The Direct Measurement TLV (RFC 8972 §4.5) alone cannot say it. Our reflector does count a
  probe it drops in R_RxC, "the number of test packets received", which is what that field means,
  so any RFC 8972 sender sees forward loss right; but R_RxC - R_TxC mixes every cause, names no
  limit, and a counter that restarted (an evicted session) looks like loss.
- The authenticated control channel after the session exists only in authenticated mode, needs a
  TCP connection per session (the daemon runs thousands per minute), and arrives after the
  sender has already sent at a rate it could have known was too high.
- A TLV travels in the STAMP exchange itself, in both modes, on every reply (so the counts are
  there when a later probe is answered), and in authenticated mode the HMAC TLV covers it
  (RFC 8972 §4.8): nobody without the key can forge a drop count.

RFC 8972 §4 rules: the sender sets the U flag; a reflector that does not know the type copies it
with U still set, so the sender learns that a third-party reflector cannot say (and notes that
loss at high rates may be the reflector's). Our reflector clears U and fills the value. The type
is from the Private Use range of the STAMP TLV Types registry (RFC 8972 §5.1: 252-254); private
use means another implementation may give it another meaning, so the value starts with a magic
and a version: a reflector that finds another magic treats the TLV as unknown (U stays set), and
a sender ignores a value without our magic (or of another length). tests/test_stamp_interop.py checks that scapy's independent STAMP layer
parses packets that carry it, and that our sender handles a reflector that only echoes it.

Value, 20 octets, big-endian::

    0 Magic 0x7770 ("wp")(2) | 2 Version = 1 (1) | 3 Flags (1), zero in a probe:
      0x01 session refused: the reflector kept no state for this probe, its session table had
      no room it may take (session_table.py); epoch and counts are then 0 (issue 37)
    4 Session epoch (4): random, non-zero, chosen when the reflector created the session; a
      different epoch means the session was evicted or reset and its counters restarted
    8 Rate limit (4): probes per second per source address the reflector answers, 0 = none
   12 Rate-limited (4): probes of this session received and not answered (rate limit)
   16 Refused (4): copies of this session's probes refused by authentication (authenticated
      mode: the anti-replay window, replay_window.py); not counted as received

The sender zeroes everything after the version. Counts are cumulative over the session, so each
reply carries the drops up to it and the sender takes differences between replies
(loss_split.py).

A refused new session (issue 37: a flood held the table; the sender read the silence as 90 %
forward loss) is told, not left silent: the reflector answers a refused probe that carries this
TLV, within the source's reply rate limit, with the session-refused flag. The answer measures
nothing (no session counted it); the sender counts the probe as refused by the reflector, not
sent on the path. A reflector predating the flag leaves the octet zero, and a sender predating
it ignores an epoch of 0. In authenticated mode the HMAC TLV covers the flag (RFC 8972 §4.8):
nobody without the key can make a sender believe it was refused.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from wanprobe.probe.stamp_packet import FLAG_I, FLAG_M, FLAG_U, TLV_HEADER, parse_tlvs

TLV_REFLECTOR_REPORT = 252           # RFC 8972 §5.1 Private Use
MAGIC = 0x7770
VERSION = 1
VALUE_LEN = 20
TLV_LEN = 4 + VALUE_LEN
_HEAD = struct.Struct("!HBx")
_COUNTS = struct.Struct("!IIII")     # epoch, rate limit, rate-limited, refused
_WHOLE = struct.Struct("!BBHHBBIIII")
SESSION_REFUSED = 0x01               # Flags: the reflector refused this probe's new session
_MAGIC_VERSION = _HEAD.pack(MAGIC, VERSION)[:3]


def sender_tlv() -> bytes:
    """The TLV as a sender puts it in a probe: U set, magic and version, counts zero."""
    return TLV_HEADER.pack(FLAG_U, TLV_REFLECTOR_REPORT, VALUE_LEN) + _HEAD.pack(MAGIC, VERSION) \
        + bytes(_COUNTS.size)


def reflector_value(request_value: bytes, report: tuple[int, ...]) -> bytes | None:
    """The value a reflector answers with: ``report`` = (epoch, rate limit per second,
    rate-limited, refused[, flags]). None when ``request_value`` is not ours (another magic or
    version): the caller then treats the TLV as unknown (RFC 8972 §4, U flag)."""
    if len(request_value) != VALUE_LEN or request_value[:3] != _MAGIC_VERSION:
        return None
    epoch, limit, limited, refused, *flags = report
    return _MAGIC_VERSION + bytes(((flags[0] if flags else 0) & 0xFF,)) + _COUNTS.pack(
        epoch & 0xFFFFFFFF, min(limit, 0xFFFFFFFF), limited & 0xFFFFFFFF, refused & 0xFFFFFFFF)


def offset_in(packet: bytes | bytearray, base_len: int) -> int | None:
    """Where the TLV starts in ``packet`` (a probe template), walking its TLVs; None if absent."""
    off = base_len
    while off + 4 <= len(packet):
        _flags, typ, length = TLV_HEADER.unpack_from(packet, off)
        if typ == TLV_REFLECTOR_REPORT:
            return off
        off += 4 + length
    return None


@dataclass
class ReportLog:
    """What one session's replies said about the reflector: per answered sender sequence number
    (epoch, rate-limited, refused) as of that reply; the probes whose new session it refused
    (``session_refused``, answers that measure nothing); the advertised rate limit; how many
    replies came back with the TLV not understood (a third-party reflector)."""

    by_seq: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    session_refused: set[int] = field(default_factory=set)
    limit_pps: int | None = None
    echoed: int = 0
    at: int | None = None     # where the TLV sits in this session's probes (and replies)

    def note_own(self, sseq: int, data, n: int, template: bytes, base_len: int) -> None:
        """:meth:`note` at the offset the TLV has in ``template`` (found once)."""
        if self.at is None:
            self.at = offset_in(template, base_len) or 0
        if self.at:
            self.note(sseq, data, self.at, n)

    def note(self, sseq: int, data, at: int, n: int) -> None:
        """Read the TLV at offset ``at`` of reply ``data[:n]`` (replies keep the request's TLV
        offsets, RFC 8972 §4); anything else at that offset is left alone."""
        if at + TLV_LEN > n:
            return
        flags, typ, length, magic, version, said, epoch, limit, limited, refused = \
            _WHOLE.unpack_from(data, at)
        if typ != TLV_REFLECTOR_REPORT or length != VALUE_LEN:
            return
        if flags & FLAG_U:
            self.echoed += 1
            return
        if flags & (FLAG_M | FLAG_I) or magic != MAGIC or version != VERSION:
            return
        if said & SESSION_REFUSED:
            self.session_refused.add(sseq)
        elif not epoch:
            return
        else:
            self.by_seq[sseq] = (epoch, limited, refused)
        self.limit_pps = limit or None

    def note_area(self, sseq: int, area: bytes) -> None:
        """The same for a reply whose TLVs are not at our offsets (walked)."""
        tlvs, _rest = parse_tlvs(area)
        for t in tlvs:
            if t.type == TLV_REFLECTOR_REPORT:
                raw = TLV_HEADER.pack(t.flags, t.type, len(t.value)) + t.value
                self.note(sseq, raw, 0, len(raw))
                return

    @property
    def counts(self) -> str | None:
        """"reported" (a wanprobe reflector filled the TLV), "not_supported" (it came back
        unprocessed) or None (no reply carried it)."""
        if self.by_seq or self.session_refused:
            return "reported"
        return "not_supported" if self.echoed else None
