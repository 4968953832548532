"""Typed inputs of the path rules: one measured transfer per direction and the two hosts.

A diagnose measures both directions: ``forward`` (this host sends, the peer receives) and
``reverse`` (the peer sends, this host receives). Each :class:`Transfer` is built once from the
typed throughput measurement of that direction (:class:`~wanprobe.diagnose.measured.Measured`),
so a rule knows which host sent and which received.
"""

from __future__ import annotations

from dataclasses import dataclass

from collectors.host_facts import HostFacts
from wanprobe.diagnose.host_inputs import Host
from wanprobe.diagnose.measured import Measured

DIRECTIONS = {"forward": ("local", "peer"), "reverse": ("peer", "local")}  # (sender, receiver)
SECTION = {"forward": "throughput", "reverse": "throughput_reverse"}  # Measured fields


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


def transfer(m: Measured, direction: str) -> Transfer | None:
    """The measured transfer of ``direction``, None when that direction was not measured."""
    tput = getattr(m, SECTION[direction])
    if tput is None:
        return None
    sender, receiver = DIRECTIONS[direction]
    return Transfer(
        direction=direction, sender=sender, receiver=receiver,
        bits_per_second=tput.bits_per_second, verdict=tput.verdict,
        rwnd_limited_share=tput.rwnd_limited_share,
        sndbuf_limited_share=tput.sndbuf_limited_share,
        peer_window_max_bytes=tput.peer_window_max_bytes,
        streams=max(1, len(tput.streams)), cc=tput.cc)


def pooled_loss(m: Measured) -> tuple[float | None, int]:
    """Loss over every sample diagnose took, pooled: STAMP probes (lost / sent) and each
    direction's TCP test (bytes_retrans / bytes_sent in MSS-sized segments). One small sample
    (200 probes see no loss at 0.1 %) no longer hides what the others saw. Returns (ratio,
    samples)."""
    lost = sent = 0.0
    path = m.path
    n, ratio = (path.loss_sent_probes, path.loss_ratio) if path else (None, None)
    if n and ratio is not None:
        lost, sent = lost + ratio * n, sent + n
    for tput in (m.throughput, m.throughput_reverse):
        if tput is None:
            continue
        mss = float(tput.mss_bytes)
        for r, b in tput.retrans_sent_bytes():
            lost, sent = lost + r / mss, sent + b / mss
    return (lost / sent if sent else None), int(sent)


def transfers(m: Measured) -> list[Transfer]:
    return [t for t in (transfer(m, d) for d in DIRECTIONS) if t is not None]


def hosts(m: Measured, host: Host | None) -> Hosts:
    """Both ends: this host (typed once by the engine) and the peer from the facts it sent."""
    return Hosts(local=host, peer=Host.from_facts(m.peer_facts), peer_error=m.peer_facts_error,
                 legacy=m.legacy)
