"""The results of ``wanprobe ring``: one edge in one run (``EdgeRun``), an edge as reported
(``Edge``) and the whole ring (``RingResult``). Frozen dataclasses whose ``to_json`` and
``from_json`` round-trip exactly; units live in the names, a figure nobody measured is None
(docs/conventions.md §3, §4); a malformed document is refused in one line naming the key path
(§8, ``json_fields``), and here the values' types are checked too, since a ring result may be
read on its own, outside a report validated against report/schema.json (``$defs.ring``).

What the figures mean: a ring all-reduce moves one chunk over every ring edge at each step, all
edges at once, so each step waits for the slowest edge; its bus bandwidth (nccl-tests
doc/PERFORMANCE.md: busbw = algbw × 2(n−1)/n for all-reduce) is the slowest edge's rate while
every edge is busy (``ring_bits_per_second``; edges through one shared bottleneck at its
total over their number, since the ring paces them alike: ``plan.ring_rates``). NCCL splits a
transfer equally over its sockets, so an edge moves at "the minimum speed of the sockets multiplied by the number of sockets"
(NVIDIA/nccl-tests#83, NVIDIA/nccl#438), not at their sum: ``nccl_bits_per_second``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

from wanprobe.errors import ConfigError, shown
from wanprobe.json_fields import Decoded, build, json_list, json_object, objects, required, strings
from wanprobe.models.collectives import busbw_factor
from wanprobe.throughput.result import kept_intervals

if TYPE_CHECKING:
    from wanprobe.throughput.result import ThroughputResult

Pair = tuple[str, str]  # (from, to): one direction between two hosts


# -- the value checks of from_json (one line naming the key path) ------------------------------
def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def text(v: Any, what: str) -> str:
    """A JSON string."""
    if not isinstance(v, str):
        raise ConfigError(f"{what}: expected a string, got {shown(v)}")
    return v


def optional_text(v: Any, what: str) -> str | None:
    return None if v is None else text(v, what)


def figure(v: Any, what: str) -> float | None:
    """A measured figure ≥ 0 (a rate, an RTT, a spread), or null: not measured (§3)."""
    if v is None:
        return None
    if not _finite(v) or v < 0:
        raise ConfigError(f"{what}: expected a number ≥ 0 or null, got {shown(v)}")
    out: float = v
    return out


def count(v: Any, what: str) -> int:
    """A whole number ≥ 0 (a count, a rank, an id)."""
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ConfigError(f"{what}: expected a whole number ≥ 0, got {shown(v)}")
    return v


def flag(v: Any, what: str) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{what}: expected true or false, got {shown(v)}")
    return v


def figures(v: Any, what: str) -> tuple[float, ...]:
    """An array of measured figures, none null (per-stream rates)."""
    out = []
    for i, x in enumerate(json_list(v, what)):
        got = figure(x, f"{what}[{i}]")
        if got is None:
            raise ConfigError(f"{what}[{i}]: expected a number ≥ 0, got null")
        out.append(got)
    return tuple(out)


def host_groups(v: Any, what: str) -> tuple[tuple[str, ...], ...]:
    """An array of arrays of host names (the sites)."""
    return tuple(strings(g, f"{what}[{i}]") for i, g in enumerate(json_list(v, what)))


def pair(v: Any, what: str) -> Pair:
    """``{"from": h, "to": h}``."""
    d = json_object(v, what)
    required(d, ("from", "to"), what)
    return text(d["from"], f"{what}.from"), text(d["to"], f"{what}.to")


def pair_groups(v: Any, what: str) -> tuple[tuple[Pair, ...], ...]:
    """An array of groups, each an array of ``{"from", "to"}`` (the shared bottlenecks)."""
    return tuple(objects(g, f"{what}[{i}]", pair) for i, g in enumerate(json_list(v, what)))


def matrix(v: Any, what: str) -> tuple[tuple[float | None, ...], ...]:
    """An array of rows of figures or nulls (the RTT matrix)."""
    return tuple(tuple(figure(x, f"{what}[{i}][{j}]") for j, x in enumerate(json_list(row, f"{what}[{i}]")))
                 for i, row in enumerate(json_list(v, what)))


def text_map(v: Any, what: str) -> dict[str, str]:
    """A JSON object of strings (NCCL variables and their reasons)."""
    return {k: text(x, f"{what}.{k}") for k, x in json_object(v, what).items()}


def count_map(v: Any, what: str) -> dict[str, int]:
    """A JSON object of whole numbers ≥ 0 (node ranks, fabric ids)."""
    return {k: count(x, f"{what}.{k}") for k, x in json_object(v, what).items()}


def _rate(bps: float | None) -> float | None:
    """A rate as written: a finite number, else None (JSON has no inf/nan)."""
    return bps if bps is not None and math.isfinite(bps) else None


class _Directed(Decoded):
    """An edge's JSON names its ends ``from`` and ``to``: its fields ``src`` and ``dst``."""

    @classmethod
    def from_json(cls, d: Any, what: str | None = None) -> Self:
        where = what or cls.JSON_NAME
        obj = json_object(d, where)
        required(obj, ("from", "to"), where)
        rest = {k: v for k, v in obj.items() if k not in ("from", "to")}
        rest.update(src=text(obj["from"], f"{where}.from"), dst=text(obj["to"], f"{where}.to"))
        return build(cls, rest, where, cls.JSON_PARTS)


# -- one edge in one run ----------------------------------------------------------------------
@dataclass(frozen=True)
class EdgeRun(_Directed, json_name="ring edge run", json_parts={
        "bits_per_second": figure, "stream_bits_per_second": figures, "error": optional_text}):
    """One transfer ``src`` → ``dst`` in one run (with the whole ring, or alone): its goodput,
    each stream's, and why it failed (None when it did not)."""

    src: str
    dst: str
    bits_per_second: float | None
    stream_bits_per_second: tuple[float, ...]
    error: str | None = None

    @property
    def key(self) -> Pair:
        return self.src, self.dst

    @property
    def streams(self) -> int:
        return len(self.stream_bits_per_second)

    @property
    def min_stream_bits_per_second(self) -> float | None:
        return min(self.stream_bits_per_second, default=None)

    @property
    def max_stream_bits_per_second(self) -> float | None:
        return max(self.stream_bits_per_second, default=None)

    @property
    def nccl_bits_per_second(self) -> float | None:
        """What NCCL would move over these sockets: the slowest × their number (nccl-tests#83)."""
        slowest = self.min_stream_bits_per_second
        return None if slowest is None else slowest * self.streams

    @property
    def spread(self) -> float | None:
        """Fastest stream over slowest, minus 1 (0: even); None without streams, or when the
        slowest moved nothing (unbounded: its NCCL figure, 0, says it)."""
        lo, hi = self.min_stream_bits_per_second, self.max_stream_bits_per_second
        return None if lo is None or hi is None or lo <= 0 else hi / lo - 1.0

    @classmethod
    def from_throughput(cls, src: str, dst: str, result: ThroughputResult) -> EdgeRun:
        """From a throughput test ``src`` → ``dst`` (throughput/result.py): its receiver
        goodput and each stream's, both after the test's ramp-up (``omit_s``: the full
        intervals after it, as its own rate); its error is the first stream's, or why it was
        partial."""
        kept = kept_intervals(result.intervals, result.omit_s)
        secs = sum(iv.end_s - iv.start_s for iv in kept)
        received: dict[Any, float] = {}
        for iv in kept:
            for rec in iv.streams:
                received[rec.get("id")] = received.get(rec.get("id"), 0.0) + float(
                    rec.get("bytes_received") or 0)
        rates = tuple(b * 8 / secs for _, b in sorted(received.items(), key=lambda kv: str(kv[0]))
                      ) if secs > 0 else ()
        error = next((s.error for s in result.streams if s.error), None) or result.partial_reason
        return cls(src, dst, _rate(result.bits_per_second), rates, error)

    def to_json(self) -> dict[str, Any]:
        return {"from": self.src, "to": self.dst, "bits_per_second": self.bits_per_second,
                "stream_bits_per_second": list(self.stream_bits_per_second), "error": self.error}


# -- an edge as reported ----------------------------------------------------------------------
@dataclass(frozen=True)
class Edge(_Directed, json_name="ring edge", json_parts={
        "bits_per_second": figure, "alone_bits_per_second": figure,
        "min_stream_bits_per_second": figure, "streams": count, "nccl_bits_per_second": figure,
        "wan": flag, "stream_spread": figure}):
    """One ring edge: its rate with every edge busy (None if it failed), alone (None unless
    measured alone: the WAN edges), its slowest stream, the streams, NCCL's view of them,
    whether it crosses between sites, and its streams' spread."""

    src: str
    dst: str
    bits_per_second: float | None
    alone_bits_per_second: float | None
    min_stream_bits_per_second: float | None
    streams: int
    nccl_bits_per_second: float | None
    wan: bool
    stream_spread: float | None

    @classmethod
    def of(cls, run: EdgeRun, alone_bits_per_second: float | None, wan: bool) -> Edge:
        """The edge of a ring run; a failed run's figures are None (its error goes to notes)."""
        ok = run.error is None
        return cls(run.src, run.dst, run.bits_per_second if ok else None,
                   _rate(alone_bits_per_second), run.min_stream_bits_per_second if ok else None,
                   run.streams, run.nccl_bits_per_second if ok else None, wan,
                   run.spread if ok else None)

    def to_json(self) -> dict[str, Any]:
        return {"from": self.src, "to": self.dst, "bits_per_second": self.bits_per_second,
                "alone_bits_per_second": self.alone_bits_per_second,
                "min_stream_bits_per_second": self.min_stream_bits_per_second,
                "streams": self.streams, "nccl_bits_per_second": self.nccl_bits_per_second,
                "wan": self.wan, "stream_spread": self.stream_spread}


def _edges(v: Any, what: str) -> tuple[Edge, ...]:
    return objects(v, what, Edge.from_json)


def _algbw(busbw: float | None, hosts: int) -> float | None:
    """nccl-tests' algbw of a ring all-reduce whose busbw is ``busbw``: busbw / (2(n−1)/n)."""
    return None if busbw is None or hosts < 2 else busbw / busbw_factor("allreduce", hosts)


RING_PARTS: Mapping[str, Callable[[Any, str], Any]] = {
    "order": strings, "edges": _edges, "ring_bits_per_second": figure,
    "ring_nccl_bits_per_second": figure, "crossings": count, "shared_bottlenecks": pair_groups,
    "sites": host_groups, "rtt_ms": matrix, "best_order": strings, "best_crossings": count,
    "best_ring_bits_per_second": figure, "best_ring_nccl_bits_per_second": figure,
    "best_edges": _edges, "nccl": text_map, "nccl_why": text_map, "fabric_ids": count_map,
    "node_ranks": count_map, "notes": strings}


# -- the ring ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RingResult(Decoded, json_name="ring", json_parts=RING_PARTS):
    """The ring in the given ``order`` (edge i: order[i] → order[i+1 mod n]) with every edge
    busy; its rate is its slowest edge's (``ring_bits_per_second``: a ring all-reduce's
    busbw), NCCL's view the slowest edge's slowest stream × streams; the groups of edges that
    slowed together on one link (``shared_bottlenecks``); the sites (``sites``, by RTT; a
    site's index is its fabric id) and the RTT matrix (``rtt_ms[i][j]``: order[i] →
    order[j], None where not measured); the order crossing between sites least
    (``best_order``, measured when ``best_edges`` is not empty); the NCCL variables that
    express it (``nccl`` with a reason each in ``nccl_why``), each host's fabric id and its
    launcher node rank in the best order; and notes (failures, lone slow edges)."""

    order: tuple[str, ...]
    edges: tuple[Edge, ...]
    ring_bits_per_second: float | None
    ring_nccl_bits_per_second: float | None
    crossings: int
    shared_bottlenecks: tuple[tuple[Pair, ...], ...]
    sites: tuple[tuple[str, ...], ...]
    rtt_ms: tuple[tuple[float | None, ...], ...]
    best_order: tuple[str, ...]
    best_crossings: int
    best_ring_bits_per_second: float | None
    best_ring_nccl_bits_per_second: float | None
    best_edges: tuple[Edge, ...] = ()
    nccl: Mapping[str, str] = field(default_factory=dict)
    nccl_why: Mapping[str, str] = field(default_factory=dict)
    fabric_ids: Mapping[str, int] = field(default_factory=dict)
    node_ranks: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def ring_algbw_bits_per_second(self) -> float | None:
        """The algbw nccl-tests would print for an all-reduce over this ring (PERFORMANCE.md)."""
        return _algbw(self.ring_bits_per_second, len(self.order))

    @property
    def best_ring_algbw_bits_per_second(self) -> float | None:
        return _algbw(self.best_ring_bits_per_second, len(self.best_order))

    def rtt(self, src: str, dst: str) -> float | None:
        """The RTT src → dst as measured (None where not, or a host outside the order)."""
        if src not in self.order or dst not in self.order:
            return None
        return self.rtt_ms[self.order.index(src)][self.order.index(dst)]

    def to_json(self) -> dict[str, Any]:
        """The ``$defs.ring`` document; the algbw keys are derived (left out by from_json)."""
        return {
            "order": list(self.order), "edges": [e.to_json() for e in self.edges],
            "ring_bits_per_second": self.ring_bits_per_second,
            "ring_nccl_bits_per_second": self.ring_nccl_bits_per_second,
            "ring_algbw_bits_per_second": self.ring_algbw_bits_per_second,
            "crossings": self.crossings,
            "shared_bottlenecks": [[{"from": a, "to": b} for a, b in g]
                                   for g in self.shared_bottlenecks],
            "sites": [list(s) for s in self.sites], "rtt_ms": [list(r) for r in self.rtt_ms],
            "best_order": list(self.best_order), "best_crossings": self.best_crossings,
            "best_ring_bits_per_second": self.best_ring_bits_per_second,
            "best_ring_nccl_bits_per_second": self.best_ring_nccl_bits_per_second,
            "best_ring_algbw_bits_per_second": self.best_ring_algbw_bits_per_second,
            "best_edges": [e.to_json() for e in self.best_edges], "nccl": dict(self.nccl),
            "nccl_why": dict(self.nccl_why), "fabric_ids": dict(self.fabric_ids),
            "node_ranks": dict(self.node_ranks), "notes": list(self.notes)}
