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


def _delay(name: str, value: object) -> float | None:
    if value is None:
        return None
    d = _finite(name, value)
    if not 0 <= d <= 10_000:
        raise UsageError(f"{name} must be 0-10000 ms, got {value!r}")
    return d


@dataclass(frozen=True)
class LinkSettings:
    """Per-direction impairments (a→b and b→a). ``rtt_ms`` is split evenly between directions
    unless ``delay_ab_ms``/``delay_ba_ms`` set each direction (then ``rtt_ms`` is their sum);
    ``queue_ab_ms``/``queue_ba_ms`` put the queue in one direction (None: ``queue_ms``)."""

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
    delay_ab_ms: float | None = None
    delay_ba_ms: float | None = None
    queue_ab_ms: float | None = None
    queue_ba_ms: float | None = None

    @property
    def one_way_ms(self) -> float:
        """Delay added in each direction when both are the same (half the RTT)."""
        return self.rtt_ms / 2.0

    @property
    def asymmetric(self) -> bool:
        return self.delay_ab_ms is not None

    def delay_ms(self, direction: str) -> float:
        """Delay added a→b (``"ab"``) or b→a (``"ba"``)."""
        d = self.delay_ab_ms if direction == "ab" else self.delay_ba_ms
        return self.rtt_ms / 2.0 if d is None else d

    def queue_of(self, direction: str) -> float:
        """Mean queueing delay a→b or b→a."""
        q = self.queue_ab_ms if direction == "ab" else self.queue_ba_ms
        return self.queue_ms if q is None else q

    def with_delays(self, rtt_ms: float | None = None, delay_ab_ms: float | None = None,
                    delay_ba_ms: float | None = None) -> LinkSettings:
        """New delays: an RTT alone is split evenly; both directions give the RTT (a given RTT
        must be their sum); one direction with an RTT gives the other the rest; one direction
        alone keeps the other as it is."""
        if delay_ab_ms is None and delay_ba_ms is None:
            if rtt_ms is None:
                return self
            return replace(self, rtt_ms=rtt_ms, delay_ab_ms=None, delay_ba_ms=None)
        ab, ba = _delay("delay_ab_ms", delay_ab_ms), _delay("delay_ba_ms", delay_ba_ms)
        if rtt_ms is not None:
            rtt = _finite("rtt_ms", rtt_ms)
            if ab is not None and ba is not None and abs(ab + ba - rtt) > 1e-6:
                raise UsageError(f"rtt {rtt:g} ms is not delay a→b {ab:g} + b→a {ba:g} ms: "
                                 "give the rtt or both delays")
            ab = rtt - ba if ab is None else ab
            ba = rtt - ab if ba is None else ba
            if min(ab, ba) < 0:
                raise UsageError(f"a one-way delay above the rtt {rtt:g} ms leaves the other "
                                 "direction negative")
        ab = self.delay_ms("ab") if ab is None else ab
        ba = self.delay_ms("ba") if ba is None else ba
        return replace(self, rtt_ms=ab + ba, delay_ab_ms=ab, delay_ba_ms=ba)

    def changed(self, **changes) -> LinkSettings:
        """A validated copy with ``changes`` (LinkSettings fields; ``loss`` sets both
        directions; ``rtt_ms``/``delay_*_ms`` combined by :meth:`with_delays`)."""
        if "loss" in changes:
            loss = changes.pop("loss")
            changes.setdefault("loss_ab", loss)
            changes.setdefault("loss_ba", loss)
        unknown = set(changes) - set(self.__dataclass_fields__)
        if unknown:
            raise UsageError(f"unknown lab setting(s): {', '.join(sorted(unknown))}")
        base = self.with_delays(*(changes.pop(k, None)
                                  for k in ("rtt_ms", "delay_ab_ms", "delay_ba_ms")))
        return replace(base, **changes).validated()

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
        ab, ba = _delay("delay_ab_ms", self.delay_ab_ms), _delay("delay_ba_ms", self.delay_ba_ms)
        if (ab is None) != (ba is None):
            raise UsageError("give both one-way delays (delay_ab_ms and delay_ba_ms) or neither")
        if ab is not None:
            rtt = ab + ba
            if rtt > 10_000:
                raise UsageError(f"rtt {rtt:g} ms is beyond what the lab emulates (≤ 10 s)")
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
            delay_ab_ms=ab, delay_ba_ms=ba, queue_ab_ms=_delay("queue_ab_ms", self.queue_ab_ms),
            queue_ba_ms=_delay("queue_ba_ms", self.queue_ba_ms),
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
