"""The impairments of one emulated WAN link, validated before anything is created."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from wanprobe.errors import UsageError

MIN_MTU = 576  # RFC 791: every IPv4 host must accept 576-byte datagrams
MAX_MTU = 9000


def _finite(name: str, value: object) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise UsageError(f"{name} must be a finite number, got {value!r}")
    return number


def _probability(name: str, value: object) -> float:
    p = _finite(name, value)
    if not 0.0 <= p <= 1.0:
        raise UsageError(f"{name} must lie between 0 and 1 (0-100%), got {value!r}")
    return p


@dataclass(frozen=True)
class LinkSettings:
    """Per-direction impairments (a→b and b→a). ``rtt_ms`` is split evenly between directions."""

    rtt_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_ab: float = 0.0
    loss_ba: float = 0.0
    rate_bps: float | None = None
    mtu: int = 1500
    black_hole_mtu: int | None = None
    bleach_dscp: bool = False
    reorder: float = 0.0
    queue_ms: float = 0.0    # mean queueing delay at a busy hop (exponential; see delayline.py)

    @property
    def one_way_ms(self) -> float:
        """Delay added in each direction."""
        return self.rtt_ms / 2.0

    def validated(self) -> LinkSettings:
        """Return a normalised copy, or raise UsageError naming the first bad value."""
        rtt = _finite("rtt_ms", self.rtt_ms)
        jitter = _finite("jitter_ms", self.jitter_ms)
        if rtt < 0:
            raise UsageError(f"rtt must be ≥ 0, got {self.rtt_ms!r} ms")
        if rtt > 10_000:
            raise UsageError(f"rtt {self.rtt_ms!r} ms is beyond what the lab emulates (≤ 10 s)")
        if jitter < 0:
            raise UsageError(f"jitter must be ≥ 0, got {self.jitter_ms!r} ms")
        queue = _finite("queue_ms", self.queue_ms)
        if not 0 <= queue <= 10_000:
            raise UsageError(f"queue must be 0-10000 ms, got {self.queue_ms!r} ms")
        rate = None
        if self.rate_bps is not None:
            rate = _finite("rate_bps", self.rate_bps)
            if rate <= 0:
                raise UsageError(f"rate must be > 0, got {self.rate_bps!r} bit/s")
            if rate < 8_000:
                raise UsageError(f"rate {self.rate_bps!r} bit/s is too low to shape (≥ 8 kbit/s)")
        mtu = self._mtu("mtu", self.mtu)
        bh = None if self.black_hole_mtu is None else self._mtu("black_hole_mtu", self.black_hole_mtu)
        if bh is not None and bh > mtu:
            raise UsageError(f"black_hole_mtu {bh} is larger than the interface mtu {mtu}: it would never drop")
        return replace(
            self, rtt_ms=rtt, jitter_ms=jitter, queue_ms=queue, rate_bps=rate, mtu=mtu, black_hole_mtu=bh,
            loss_ab=_probability("loss_ab", self.loss_ab),
            loss_ba=_probability("loss_ba", self.loss_ba),
            reorder=_probability("reorder", self.reorder), bleach_dscp=bool(self.bleach_dscp),
        )

    @staticmethod
    def _mtu(name: str, value: object) -> int:
        number = _finite(name, value)
        if number != int(number) or not MIN_MTU <= number <= MAX_MTU:
            raise UsageError(f"{name} must be an integer {MIN_MTU}-{MAX_MTU}, got {value!r}")
        return int(number)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> LinkSettings:
        fields = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in fields})
