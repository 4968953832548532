"""The reflect service: a STAMP reflector (RFC 8762/8972) and the throughput server on the same
(address, port), under one policy — who may use them (``allow``), which DSCP a Class-of-Service
TLV or a test may ask for, the shared key (authenticated mode, RFC 8762 §4.4; the same key is
asked of throughput clients), the reply rate per source and the throughput limits. ``wanprobe
reflect`` runs it on one address; the daemon on each of its listen addresses."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from dataclasses import dataclass
from typing import Any

from wanprobe.probe.access import DEFAULT_COS_DSCP
from wanprobe.probe.reflector import DEFAULT_RATE_PPS
from wanprobe.probe.session_table import PER_SOURCE

CLOSE_BUDGET_S = 1.0          # per part: closing must never block a stop path


@dataclass(frozen=True)
class ReflectPolicy:
    """Who may use the service (CIDRs, empty = everyone), which DSCP replies and tests may carry,
    how many STAMP sessions one source may hold and how many replies per second it gets."""

    allow: tuple[str, ...] = ()
    cos_dscp: frozenset[int] = DEFAULT_COS_DSCP
    sessions_per_source: int = PER_SOURCE
    rate_pps: float = DEFAULT_RATE_PPS

    @property
    def burst(self) -> int:
        """The token bucket's depth: a fifth of a second of replies, at least 100."""
        return max(100, int(self.rate_pps / 5))


class ReflectService:
    """Start with :meth:`start` on one or more (address, port); :meth:`close` stops every part.
    ``limits`` is the throughput server's :class:`~wanprobe.throughput.limits.ServerLimits`
    (None: its defaults)."""

    def __init__(self, hmac_key: bytes | None = None, policy: ReflectPolicy | None = None,
                 limits: Any = None) -> None:
        self.hmac_key = hmac_key
        self.policy = policy or ReflectPolicy()
        self.limits = limits
        self._servers: list[Any] = []
        self._reflectors: list[Any] = []

    @classmethod
    def from_config(cls, cfg: Any) -> ReflectService:
        """The daemon's: ``daemon.hmac_key``, ``daemon.allow``, ``daemon.cos_dscp`` and the
        ``[throughput]`` limits (config_reflector.py)."""
        return cls(cfg.hmac_key, ReflectPolicy(
            allow=cfg.allow, cos_dscp=DEFAULT_COS_DSCP if cfg.cos_dscp is None else cfg.cos_dscp),
            limits=cfg.throughput_server)

    async def start(self, listen: tuple[tuple[str, int], ...]) -> None:
        """Listen on each (address, port): UDP for STAMP, TCP for throughput. On an error the
        parts already started stay registered, so :meth:`close` stops them."""
        from wanprobe.diagnose.throughput_verdict import JUDGE
        from wanprobe.probe.access import DscpPolicy
        from wanprobe.probe.reflector import Reflector
        from wanprobe.throughput.client import run_throughput
        from wanprobe.throughput.server import ThroughputServer

        p = self.policy
        for host, port in listen:
            server = ThroughputServer(limits=self.limits, hmac_key=self.hmac_key, allow=p.allow,
                                      dscp_permitted=DscpPolicy(p.cos_dscp),
                                      edge_runner=functools.partial(run_throughput, judge=JUDGE))
            await server.start(host, port)
            self._servers.append(server)
            reflector = Reflector(udp_tap=server.udp_tap, rate_pps=p.rate_pps, burst=p.burst,
                                  hmac_key=self.hmac_key, allow=p.allow,
                                  dscp_permitted=DscpPolicy(p.cos_dscp),
                                  sessions_per_source=p.sessions_per_source)
            await reflector.start(host, port)
            self._reflectors.append(reflector)

    @property
    def throughput_ports(self) -> list[int]:
        """The TCP port of each throughput server (port 0 in ``listen``: the one bound)."""
        return [server.port for server in self._servers]

    def refusals(self) -> dict[str, int]:
        """Refusals by reason, summed over every socket (wanprobe_reflector_refusals_total)."""
        return _summed(self._servers + self._reflectors)

    def throughput_refusals(self) -> dict[str, int]:
        """The throughput servers' refusals alone, by reason."""
        return _summed(self._servers)

    def stats(self) -> list[Any]:
        """Each reflector's :class:`~wanprobe.probe.reflector.ReflectorStats`."""
        return [r.stats() for r in self._reflectors]

    def set_limits(self, limits: Any) -> None:
        """New ``[throughput]`` limits (a reload); the next test is held to them."""
        self.limits = limits
        for server in self._servers:
            server.limits = limits

    async def close(self) -> None:
        """Stop the reflectors, then the servers; each part within CLOSE_BUDGET_S. The service
        can be started again."""
        for part in reversed(self._servers + self._reflectors):
            with contextlib.suppress(Exception):   # closing must never block the stop path
                async with asyncio.timeout(CLOSE_BUDGET_S):
                    await part.close()
        self._servers.clear()
        self._reflectors.clear()


def _summed(parts: list[Any]) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in parts:
        for reason, n in part.refusals().items():
            total[reason] = total.get(reason, 0) + n
    return total
