"""The daemon's answer to a peer whose reflector answers fewer probes per second than its sessions
send (issue 20): pace that peer's STAMP sessions below the limit, with one line naming both rates.

A wanprobe reflector advertises its limit (probes/s per source address) in the Reflector Report TLV
of every reply (probe/reflector_report.py). Once a session's result says the limit is below
1 / ``probe.packet_interval``, the peer's next sessions send their ``count`` probes at
``PACE_SHARE`` of the limit instead (as ``probe --above-limit pace`` does), provided a session
still fits in ``probe.interval``; otherwise they keep the configured rate and the line says so.
Either way what the reflector drops is counted apart from the path's loss
(``wanprobe_probe_reflector_drops_total``, never ``wanprobe_probe_packets_lost_total``). A limit
that no longer binds (the reflector was reconfigured) ends the pacing.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from wanprobe.daemon import logging as dlog
from wanprobe.daemon.config import ProbeSettings
from wanprobe.probe.rate_guard import PACE_SHARE


class ReflectorPacing:
    """Per peer: the packet interval its sessions use instead of the configured one."""

    def __init__(self) -> None:
        self._interval_s: dict[str, float] = {}
        self._told: dict[str, int] = {}

    def observe(self, peer: str, doc: dict[str, Any], s: ProbeSettings) -> None:
        """Learn from one STAMP session's JSON (``s``: the configured settings)."""
        limit = (doc.get("reflector") or {}).get("limit_pps")
        if not limit:
            return
        rate_pps = 1.0 / s.packet_interval_s
        if rate_pps <= limit:
            self._interval_s.pop(peer, None)
            self._told.pop(peer, None)
            return
        paced_s = 1.0 / (PACE_SHARE * limit)
        fits = s.count * paced_s + s.timeout_s <= s.interval_s
        if fits:
            self._interval_s[peer] = paced_s
        if self._told.get(peer) != limit:
            self._told[peer] = limit
            dlog.log(logging.WARNING,
                     "probe rate above the peer's reflector limit: " + (
                         "pacing its sessions" if fits else "cannot pace them within "
                         "probe.interval; its drops are counted apart from path loss"),
                     peer=peer, probe_pps=round(rate_pps, 1), reflector_limit_pps=limit,
                     paced_pps=round(1.0 / paced_s, 1) if fits else None,
                     rate_limited=(doc.get("loss") or {}).get("reflector_rate_limited"))

    def settings_for(self, peer: str, s: ProbeSettings) -> ProbeSettings:
        """``s`` with the peer's paced packet interval, if it has one."""
        paced_s = self._interval_s.get(peer)
        return s if paced_s is None or paced_s <= s.packet_interval_s \
            else replace(s, packet_interval_s=paced_s)

    def forget(self, peer: str) -> None:
        self._interval_s.pop(peer, None)
        self._told.pop(peer, None)
