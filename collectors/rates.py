"""Two snapshots → per-second rates, with counter wrap and reset handled.

For each counter present in both samples (gauges excluded):

* ``cur ≥ prev`` → delta = cur − prev.
* ``cur < prev`` and the counter has a known wrap width *w* (32 for mlx5 Q-counters, 64 for
  u64 ethtool/netlink values, ...) and the wrapped delta ``cur + 2^w − prev`` is below half the
  range → it wrapped once; that is the delta (status ``wrapped``). Half the range is the usual
  ambiguity bound (RFC 2578 §7.1.6 style counters; rrdtool applies the same idea): a counter that
  moved by ≥ 2^(w−1) within one interval cannot be told apart from a reset.
* otherwise (decrease of a non-wrapping counter such as an IB PMA counter, which saturates; or
  a decrease too large to be a wrap; or the device's identity changed, e.g. a new ifindex after
  a driver reload) → status ``reset``: no delta, no rate, and an explicit ``"reset"`` in JSON.

A rate is therefore never negative.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from collectors.sample import CounterSet

RateStatus = Literal["ok", "wrapped", "reset"]


def counter_delta(prev: int, cur: int, width_bits: int | None) -> tuple[int | None, RateStatus]:
    """Increase of a counter between two readings (module docstring). Pure."""
    if cur >= prev:
        return cur - prev, "ok"
    if width_bits:
        modulus = 1 << width_bits
        if 0 <= prev < modulus and 0 <= cur < modulus:
            wrapped = cur + modulus - prev
            if wrapped < modulus >> 1:
                return wrapped, "wrapped"
    return None, "reset"


@dataclass(frozen=True)
class RateSample:
    delta: int | None
    per_s: float | None
    status: RateStatus

    def to_json(self) -> float | str:
        return "reset" if self.status == "reset" else round(self.per_s, 6)


@dataclass(frozen=True)
class Rates:
    """Per-second rates keyed like :meth:`Snapshot.counter_sets` (``("netdevs", "eth0",
    "ethtool")`` → ``{name: RateSample}``), over ``interval_s``."""

    interval_s: float
    groups: dict[tuple[str, ...], dict[str, RateSample]] = field(default_factory=dict)
    paths: dict[tuple[str, ...], str] = field(default_factory=dict)

    def get(self, key: tuple[str, ...], name: str) -> RateSample | None:
        return self.groups.get(key, {}).get(name)

    def resets(self) -> list[str]:
        return [".".join(key + (name,)) for key, group in sorted(self.groups.items())
                for name, r in sorted(group.items()) if r.status == "reset"]

    def to_json(self) -> dict:
        out: dict = {"interval_s": round(self.interval_s, 6)}
        for key in sorted(self.groups):
            node = out
            for part in key[:-1]:
                node = node.setdefault(part, {})
            node[key[-1]] = {n: r.to_json() for n, r in sorted(self.groups[key].items())}
        out["resets"] = self.resets()
        return out


def group_rates(prev: CounterSet, cur: CounterSet, interval_s: float,
                force_reset: bool = False) -> dict[str, RateSample]:
    """Rates for one counter group; counters missing from either sample are left out."""
    out: dict[str, RateSample] = {}
    for name, now in cur.values.items():
        if name in cur.gauges or name not in prev.values:
            continue
        if force_reset:
            out[name] = RateSample(None, None, "reset")
            continue
        delta, status = counter_delta(prev.values[name], now, cur.widths.get(name))
        out[name] = RateSample(delta, None if delta is None else delta / interval_s, status)
    return out


def rates(prev, cur) -> Rates:
    """Rates between two :class:`~collectors.snapshot.Snapshot` objects (``cur`` later)."""
    from wanprobe.errors import WanprobeError

    interval_s = cur.monotonic_s - prev.monotonic_s
    if interval_s <= 0:
        raise WanprobeError(f"samples are not in time order (interval {interval_s:.6f} s)")
    before = prev.counter_sets()
    groups, paths = {}, {}
    for key, cs in cur.counter_sets().items():
        if key not in before:
            continue
        changed = prev.identity(key) != cur.identity(key)
        groups[key] = group_rates(before[key], cs, interval_s, force_reset=changed)
        paths[key] = cs.path
    return Rates(interval_s, groups, paths)
