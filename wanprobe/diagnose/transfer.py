"""Typed inputs of the path rules: one measured transfer per direction and the two hosts.

A diagnose measures both directions: ``forward`` (this host sends, the peer receives) and
``reverse`` (the peer sends, this host receives). Each :class:`Transfer` is built once from the
throughput JSON (one spelling per key: the names ``throughput/result.py`` and ``verdict.py``
write), so a rule reads typed fields and knows which host sent and which received.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from collectors.host_facts import HostFacts
from wanprobe.diagnose import inputs as I
from wanprobe.diagnose.host_inputs import Host, facts_or_none

DIRECTIONS = {"forward": ("local", "peer"), "reverse": ("peer", "local")}  # (sender, receiver)
SECTION = {"forward": "throughput", "reverse": "throughput_reverse"}


@dataclass(frozen=True)
class Transfer:
    """One direction's TCP test; shares are of the sender's busy time (tcpi_*_limited)."""

    direction: str
    sender: str
    receiver: str
    bits_per_second: float | None
    verdict: str | None
    rwnd_limited_share: float | None
    sndbuf_limited_share: float | None
    peer_window_max_bytes: float | None  # largest window the receiver advertised (snd_wnd)
    streams: int
    cc: str | None


@dataclass(frozen=True)
class Hosts:
    """Both ends (None: not known — the peer could not answer). ``legacy``: a report from
    before schema 1.1, which knows one host only (no ``peer_facts`` key at all)."""

    local: Host | None
    peer: Host | None
    peer_error: str | None = None
    legacy: bool = False

    def of(self, which: str) -> Host | None:
        return self.local if which == "local" else self.peer

    def facts(self, which: str) -> HostFacts | None:
        """The host-facts document host ``which`` sent (schema 1.1)."""
        host = self.of(which)
        return host.facts if host else None


def transfer(m: Mapping[str, Any], direction: str) -> Transfer | None:
    """The measured transfer of ``direction``, None when that direction was not measured."""
    tput = I.section(m, SECTION[direction])
    if not tput:
        return None
    view = {"throughput": tput}
    ev = (tput.get("limited_by") or {}).get("evidence") or {}
    sender, receiver = DIRECTIONS[direction]
    cc = tput.get("cc")
    return Transfer(
        direction=direction, sender=sender, receiver=receiver,
        bits_per_second=I.num(tput, "bits_per_second"), verdict=I.verdict(view),
        rwnd_limited_share=I.rwnd_limited_share(view),
        sndbuf_limited_share=I.sndbuf_limited_share(view),
        peer_window_max_bytes=I.num(ev, "peer_window_max_bytes") or _max_snd_wnd(view),
        streams=max(1, len(I.streams(view))), cc=cc if isinstance(cc, str) and cc else None)


def _max_snd_wnd(view: Mapping[str, Any]) -> float | None:
    """Largest window the receiver advertised, from the streams' final TCP_INFO (snd_wnd)."""
    wnds = [I.num(s, "tcp_info.snd_wnd_bytes") for s in I.streams(view)]
    return max((w for w in wnds if w), default=None)


def pooled_loss(m: Mapping[str, Any]) -> tuple[float | None, int]:
    """Loss over every sample diagnose took, pooled: STAMP probes (lost / sent) and each
    direction's TCP test (bytes_retrans / bytes_sent in MSS-sized segments). One small sample
    (200 probes see no loss at 0.1 %) no longer hides what the others saw. Returns (ratio,
    samples)."""
    lost = sent = 0.0
    path = I.section(m, "path")
    n, ratio = (I.num(path, "loss.sent"), I.num(path, "loss.ratio")) if path else (None, None)
    if n and ratio is not None:
        lost, sent = lost + ratio * n, sent + n
    for name in SECTION.values():
        view = {"throughput": I.section(m, name) or {}}
        mss = float(I.mss_bytes(view))
        for s in I.streams(view):
            r, b = I.num(s, "tcp_info.bytes_retrans"), I.num(s, "tcp_info.bytes_sent")
            if r is not None and b:
                lost, sent = lost + r / mss, sent + b / mss
    return (lost / sent if sent else None), int(sent)


def transfers(m: Mapping[str, Any]) -> list[Transfer]:
    return [t for t in (transfer(m, d) for d in DIRECTIONS) if t is not None]


def hosts(m: Mapping[str, Any], host: Host | None) -> Hosts:
    """Both ends: this host (typed once by the engine) and the peer from
    ``measurements.peer_facts``."""
    peer = m.get("peer_facts") if isinstance(m, Mapping) else None
    errors = (m.get("errors") or {}) if isinstance(m, Mapping) else {}
    return Hosts(local=host, peer=Host.from_facts(facts_or_none(peer)),
                 peer_error=errors.get("peer_facts"),
                 legacy=not (isinstance(m, Mapping) and "peer_facts" in m))
