"""The 2-octet Error Estimate of OWAMP/TWAMP/STAMP timestamps (RFC 4656 §4.1.2; STAMP uses it
unchanged, RFC 8762 §4.2.1; the Z bit is RFC 8186 §2.3)::

     0                   1
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5
    |S|Z|   Scale   |   Multiplier  |

S = 1: the clock is synchronised to UTC from an external source; Z = 0: NTP timestamp format,
1: PTPv2 truncated. Error = Multiplier × 2^-32 × 2^Scale seconds; a Multiplier of 0 is invalid
("MUST NOT be sent", RFC 4656 §4.1.2), so the receiver treats the estimate as unknown.
Pure functions; no clock is read here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

S_BIT = 0x8000
Z_BIT = 0x4000
MAX_SCALE = 63
MAX_MULTIPLIER = 255
# the largest error the field can say (255 × 2^31 s): what an end that knows nothing sends
UNKNOWN_ERROR_WORD = (MAX_SCALE << 8) | MAX_MULTIPLIER


@dataclass(frozen=True)
class ErrorEstimate:
    """A decoded Error Estimate; ``error_s`` is None when the Multiplier is 0 (invalid)."""

    synchronized: bool
    ptp_format: bool
    scale: int
    multiplier: int

    @property
    def error_s(self) -> float | None:
        if self.multiplier == 0:
            return None
        return self.multiplier * 2.0 ** (self.scale - 32)

    def to_json(self) -> dict:
        e = self.error_s
        return {"synchronized": self.synchronized, "scale": self.scale,
                "multiplier": self.multiplier, "error_ms": None if e is None else e * 1e3}


def decode(word: int) -> ErrorEstimate:
    """The fields of a 16-bit Error Estimate."""
    return ErrorEstimate(bool(word & S_BIT), bool(word & Z_BIT), (word >> 8) & 0x3F, word & 0xFF)


def encode(error_s: float | None, *, synchronized: bool, ptp_format: bool = False) -> int:
    """The Error Estimate word for an error of ``error_s`` seconds: the smallest Scale whose
    Multiplier (rounded up) fits in 8 bits, so the value sent is never below the error known
    (an estimate must not claim a better clock than it has). None, negative or not finite →
    the largest value the field holds; an error beyond it is sent as that largest value with
    S cleared, since it cannot be said."""
    flags = (S_BIT if synchronized else 0) | (Z_BIT if ptp_format else 0)
    if error_s is None or not math.isfinite(error_s) or error_s < 0:
        return flags | UNKNOWN_ERROR_WORD
    units = error_s * 2.0 ** 32     # in units of 2^-32 s
    for scale in range(MAX_SCALE + 1):
        multiplier = max(1, math.ceil(units / 2.0 ** scale))
        if multiplier <= MAX_MULTIPLIER:
            return flags | (scale << 8) | multiplier
    return (flags & ~S_BIT) | UNKNOWN_ERROR_WORD
