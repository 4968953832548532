"""The two TLVs by which a STAMP sender learns how far to trust the reflector's clock, and what a
session gathers from the replies.

- **Timestamp Information** (RFC 8972 §4.3, type 3, 4 octets): Sync Src In | Timestamp In |
  Sync Src Out | Timestamp Out. The sender sends it zeroed with U set; the reflector fills in
  what disciplines its clock when it took T2 (in) and T3 (out) and how it took them. Code points
  from RFC 8972 §5 (IANA, the "Synchronization Source" and "Timestamping Method"
  sub-registries): sync 1 NTP, 2 PTP, 3 SSU/BITS, 4 GPS/GLONASS/LORAN-C/BDS/Galileo,
  5 local free-running; method 1 HW assist, 2 SW local, 3 control plane.
- **Same clock** (wanprobe's, RFC 8972 §4 experimental type 244, 16 octets): Nonce(4) |
  Digest(8) | Verdict(1) | Reserved(3). The sender puts a per-process nonce and the first 8
  octets of SHA-256(nonce ‖ its boot id); a wanprobe reflector computes the same over its own
  boot id and answers Verdict 1 (same kernel clock) or 2 (another clock), neither end revealing
  its boot id. Two ends on one kernel clock (two network namespaces of one host, a lab) have no
  clock offset at all. A reflector that does not know the TLV echoes it with U set (RFC 8972
  §4), and then nobody can say whether the clocks are one: the sender reports that.

The error magnitude itself rides in every packet's Error Estimate (error_estimate.py).
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass

from collectors.clock_state import ClockState
from wanprobe.probe import error_estimate
from wanprobe.probe.stamp_packet import FLAG_U, TLV_HEADER, TLV_TIMESTAMP_INFO, parse_tlvs

TIMESTAMP_INFO_LEN = 4
TLV_SAME_CLOCK = 244             # RFC 8972 §4 Table 1: 240-251 experimental
SAME_CLOCK_LEN = 16
CLOCK_TLV_BYTES = 4 + TIMESTAMP_INFO_LEN + 4 + SAME_CLOCK_LEN
SYNC_NTP, SYNC_PTP, SYNC_SSU_BITS, SYNC_GNSS, SYNC_FREE_RUNNING = 1, 2, 3, 4, 5
TS_HW_ASSIST, TS_SW_LOCAL, TS_CONTROL_PLANE = 1, 2, 3
SYNC_CODES = {"ntp": SYNC_NTP, "ptp": SYNC_PTP, "ssu-bits": SYNC_SSU_BITS, "gnss": SYNC_GNSS,
              "free-running": SYNC_FREE_RUNNING}
SYNC_NAMES = {v: k for k, v in SYNC_CODES.items()}
METHOD_NAMES = {TS_HW_ASSIST: "hw-assist", TS_SW_LOCAL: "sw-local",
                TS_CONTROL_PLANE: "control-plane"}
VERDICT_SAME, VERDICT_OTHER = 1, 2
MAX_FAR_WORDS = 16               # distinct Error Estimates kept per session (each is rare)
_NONCE = os.urandom(4)           # per process: a reflector cannot link runs by it


def clock_digest(nonce: bytes, boot_id: str) -> bytes:
    """First 8 octets of SHA-256(nonce ‖ boot id)."""
    return hashlib.sha256(bytes(nonce) + boot_id.encode()).digest()[:8]


def request_tlvs(boot_id: str | None) -> bytes:
    """Timestamp Information (zeroed, RFC 8972 §4.3) and Same-clock TLVs as a sender sends
    them, U set. Without a boot id the digest is zero and no reflector can match it."""
    digest = clock_digest(_NONCE, boot_id) if boot_id else bytes(8)
    return (TLV_HEADER.pack(FLAG_U, TLV_TIMESTAMP_INFO, TIMESTAMP_INFO_LEN)
            + bytes(TIMESTAMP_INFO_LEN)
            + TLV_HEADER.pack(FLAG_U, TLV_SAME_CLOCK, SAME_CLOCK_LEN) + _NONCE + digest + bytes(4))


def timestamp_info_value(state: ClockState) -> bytes:
    """What a reflector answers in TLV 3: its clock's sync source in and out (one system clock
    takes T2 and T3), timestamps taken in software (kernel RX stamp, clock read before send)."""
    sync = SYNC_CODES.get(state.sync_source, SYNC_FREE_RUNNING) if state.synchronized \
        else SYNC_FREE_RUNNING
    return bytes((sync, TS_SW_LOCAL, sync, TS_SW_LOCAL))


def same_clock_verdict(value: bytes, boot_id: str | None) -> int:
    """The reflector's Verdict for a Same-clock TLV value (0 when it has no boot id)."""
    if not boot_id or len(value) < 12:
        return 0
    return VERDICT_SAME if clock_digest(value[:4], boot_id) == bytes(value[4:12]) \
        else VERDICT_OTHER


@dataclass(frozen=True)
class FarClock:
    """What one session learnt of the reflector's clock: the Error Estimates it sent (distinct
    words), its Timestamp Information answer, the same-clock verdict (None: not answered)."""

    error_words: tuple[int, ...] = ()
    sync_source: str | None = None
    timestamp_method: str | None = None
    same_clock: bool | None = None

    @property
    def synchronized(self) -> bool | None:
        """True when every reply said S = 1 with a valid estimate; None without replies."""
        if not self.error_words:
            return None
        return all(e.synchronized and e.error_s is not None
                   for e in map(error_estimate.decode, self.error_words))

    @property
    def error_bound_ms(self) -> float | None:
        """The largest error the reflector declared; None unless it said it is synchronised
        (an unsynchronised clock's estimate bounds nothing)."""
        if not self.synchronized:
            return None
        return max(error_estimate.decode(w).error_s for w in self.error_words) * 1e3

    def to_json(self) -> dict:
        bound = self.error_bound_ms
        return {"synchronized": self.synchronized,
                "error_bound_ms": None if bound is None else round(bound, 6),
                "sync_source": self.sync_source, "timestamp_method": self.timestamp_method,
                "error_estimates": [f"0x{w:04x}" for w in self.error_words]}


class SessionClock:
    """Per-session clock bookkeeping on the sender: the local state at the start, the Error
    Estimate word sent, and what the replies said (see :class:`FarClock`). ``note_far`` runs
    only when a reply's Error Estimate differs from the last one; ``read_tlvs`` only until the
    TLVs were seen once, so the per-reply cost is one comparison."""

    __slots__ = ("local", "error_word", "far_word", "pending", "_words", "_ts", "_same")

    def __init__(self, local: ClockState) -> None:
        self.local = local
        self.error_word = error_estimate.encode(
            None if local.error_bound_ms is None else local.error_bound_ms / 1e3,
            synchronized=local.synchronized)
        self.far_word = -1
        self.pending = True
        self._words: list[int] = []
        self._ts: tuple[int, int, int, int] | None = None
        self._same: bool | None = None

    def note_far(self, word: int) -> None:
        self.far_word = word
        if word not in self._words and len(self._words) < MAX_FAR_WORDS:
            self._words.append(word)

    def read_tlvs(self, area: bytes) -> None:
        """The Timestamp Information and Same-clock answers in a reply's TLV area; a TLV still
        flagged U was not processed (RFC 8972 §4) and tells nothing."""
        tlvs, _rest = parse_tlvs(bytes(area))
        for t in tlvs:
            if t.flags & FLAG_U:
                continue
            if t.type == TLV_TIMESTAMP_INFO and len(t.value) == TIMESTAMP_INFO_LEN:
                self._ts = tuple(t.value)
            elif t.type == TLV_SAME_CLOCK and len(t.value) == SAME_CLOCK_LEN \
                    and t.value[:4] == _NONCE:
                verdict = t.value[12]
                self._same = True if verdict == VERDICT_SAME else \
                    False if verdict == VERDICT_OTHER else None
        self.pending = False

    def far(self) -> FarClock:
        ts = self._ts
        return FarClock(tuple(self._words),
                        SYNC_NAMES.get(ts[2], f"code {ts[2]}") if ts else None,
                        METHOD_NAMES.get(ts[3], f"code {ts[3]}") if ts else None, self._same)


def unpack_timestamp_info(value: bytes) -> tuple[int, int, int, int]:
    """(Sync Src In, Timestamp In, Sync Src Out, Timestamp Out) of a TLV 3 value."""
    return struct.unpack("!BBBB", value)
