"""The daemon's answer to a peer whose reflector answers fewer probes per second than its sessions
send (issue 20): one warning line per peer and limit, naming both rates.

The daemon does not pace on its own: its schedule (``count`` probes ``packet_interval`` apart)
is the operator's, and a session's deadline rests on it. What the reflector drops is counted apart
from the path's loss in any case (the Reflector Report TLV, probe/reflector_report.py:
``wanprobe_probe_reflector_drops_total``, never ``wanprobe_probe_packets_lost_total``), and the
line says what to change.
"""

from __future__ import annotations

import logging
from typing import Any

from wanprobe.daemon import logging as dlog


class LimitWarnings:
    """Remembers which (peer, limit) it has warned about."""

    def __init__(self) -> None:
        self._warned: dict[str, int] = {}

    def observe(self, peer: str, doc: dict[str, Any], packet_interval_s: float) -> bool:
        """Warn once when ``doc`` (a STAMP session's JSON) says the reflector's limit is below
        the session's rate, 1 / ``packet_interval_s``; True if it warned now."""
        limit = (doc.get("reflector") or {}).get("limit_pps")
        rate_pps = 1.0 / packet_interval_s if packet_interval_s > 0 else 0.0
        if not limit or rate_pps <= limit or self._warned.get(peer) == limit:
            return False
        self._warned[peer] = limit
        dropped = (doc.get("loss") or {}).get("reflector_rate_limited")
        dlog.log(logging.WARNING, "probe rate above the peer's reflector limit; its drops are "
                 "counted apart from path loss (raise probe.packet_interval to stay below it)",
                 peer=peer, probe_pps=round(rate_pps, 1), reflector_limit_pps=limit,
                 rate_limited=dropped)
        return True

    def forget(self, peer: str) -> None:
        self._warned.pop(peer, None)
