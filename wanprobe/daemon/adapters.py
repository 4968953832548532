"""The daemon's only contact points with the measuring and reporting code.

Each adapter is one small function, so the scheduler can be driven by fakes in tests (dependency
injection) and by the real probes, throughput client, collectors and report builder here. A piece
that is missing or fails raises :class:`wanprobe.errors.ProbeError` with one line; the scheduler
records it as a probe error and carries on.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from wanprobe.daemon.config import Peer, ProbeSettings, ThroughputSettings
from wanprobe.errors import ProbeError, WanprobeError


async def probe(peer: Peer, method: str, s: ProbeSettings, *,
                hmac_key: bytes | None = None) -> dict[str, Any]:
    """Run one probe session of ``method`` against ``peer``; return its ``to_json()``. With
    ``hmac_key`` (the config's ``daemon.hmac_key``) STAMP runs in authenticated mode
    (RFC 8762 §4.4), as the peers' reflectors do when they share the key."""
    if method == "stamp" and peer.flows > 1:
        from wanprobe.daemon import flow_probe
        return await flow_probe.probe(peer, s, hmac_key=hmac_key)
    from wanprobe.probe.api import METHODS

    fn = METHODS.get(method)
    if fn is None:
        raise ProbeError(f"unknown probe method {method!r} (use {', '.join(METHODS)})")
    kwargs: dict[str, Any] = {"count": s.count, "interval_s": s.packet_interval_s,
                              "timeout_s": s.timeout_s}
    if method == "stamp":
        kwargs.update(port=peer.port, dscp=s.dscp)
        if hmac_key is not None:
            kwargs["hmac_key"] = hmac_key
    elif method == "tcp":
        kwargs.update(port=peer.port)
    result = await fn(peer.address, **kwargs)
    return result.to_json() if hasattr(result, "to_json") else dict(result)


def throughput(peer: Peer, s: ThroughputSettings, *,
               hmac_key: bytes | None = None) -> dict[str, Any]:
    """Run one capped throughput test against the server beside ``peer``'s reflector (same
    port); blocking, the scheduler runs it in a worker thread. With ``hmac_key`` (the config's
    ``daemon.hmac_key``) the control channel is authenticated (throughput/gate.py)."""
    from wanprobe.throughput.client import run_throughput

    result = run_throughput(peer.address, port=peer.port, duration_s=s.duration_s,
                            streams=s.streams, max_bytes=s.max_bytes_per_test, hmac_key=hmac_key)
    return result.to_json() if hasattr(result, "to_json") else dict(result)


def throughput_for(hmac_key: bytes | None):
    """The throughput adapter bound to the daemon's HMAC key (``throughput`` when there is none)."""
    if hmac_key is None:
        return throughput

    def keyed_throughput(peer: Peer, s: ThroughputSettings) -> dict[str, Any]:
        return throughput(peer, s, hmac_key=hmac_key)

    return keyed_throughput


def prober_for(hmac_key: bytes | None):
    """The probe adapter bound to the daemon's HMAC key (``probe`` itself when there is none)."""
    if hmac_key is None:
        return probe

    async def keyed_probe(peer: Peer, method: str, s: ProbeSettings) -> dict[str, Any]:
        return await probe(peer, method, s, hmac_key=hmac_key)

    return keyed_probe


class Reflector:
    """The STAMP reflector (and the throughput server on the same port) for the daemon's loop;
    with ``hmac_key`` in authenticated mode only (RFC 8762 §4.4) and the same key required of
    throughput clients; ``allow``, ``cos_dscp`` and ``limits`` as in the config's
    ``daemon.allow``, ``daemon.cos_dscp`` and ``[throughput]`` (config_reflector.py)."""

    def __init__(self, hmac_key: bytes | None = None, *, allow: tuple[str, ...] = (),
                 cos_dscp: frozenset[int] | None = None, limits: Any = None) -> None:
        self.hmac_key = hmac_key
        self.allow, self.cos_dscp, self.limits = allow, cos_dscp, limits
        self._parts: list[Any] = []

    @classmethod
    def from_config(cls, cfg: Any) -> Reflector:
        return cls(cfg.hmac_key, allow=cfg.allow, cos_dscp=cfg.cos_dscp,
                   limits=cfg.throughput_server)

    def refusals(self) -> dict[str, int]:
        """Refusals by reason, summed over every socket (wanprobe_reflector_refusals_total)."""
        total: dict[str, int] = {}
        for part in self._parts:
            for reason, n in part.refusals().items():
                total[reason] = total.get(reason, 0) + n
        return total

    def set_limits(self, limits: Any) -> None:
        """New ``[throughput]`` limits (a reload); the next test is held to them."""
        self.limits = limits
        for part in self._parts:
            if hasattr(part, "limits"):
                part.limits = limits

    async def start(self, listen: tuple[tuple[str, int], ...]) -> None:
        from wanprobe.probe.access import DEFAULT_COS_DSCP, DscpPolicy
        from wanprobe.probe.reflector import Reflector as StampReflector
        from wanprobe.throughput.server import ThroughputServer

        for host, port in listen:
            server = ThroughputServer(limits=self.limits, hmac_key=self.hmac_key,
                                      allow=self.allow, dscp_permitted=DscpPolicy(
                                          DEFAULT_COS_DSCP if self.cos_dscp is None
                                          else self.cos_dscp))
            await server.start(host, port)
            self._parts.append(server)
            kwargs: dict[str, Any] = {"udp_tap": server.udp_tap, "allow": self.allow}
            if self.cos_dscp is not None:
                kwargs["dscp_permitted"] = DscpPolicy(self.cos_dscp)
            if self.hmac_key is not None:
                kwargs["hmac_key"] = self.hmac_key
            try:
                reflector = StampReflector(**kwargs)
            except TypeError as exc:
                raise ProbeError(f"reflector does not support this option: {exc}") from None
            await reflector.start(host, port)
            self._parts.append(reflector)

    async def close(self) -> None:
        for part in reversed(self._parts):
            try:
                async with asyncio.timeout(1.0):
                    await part.close()
            except (TimeoutError, Exception):  # closing must never block the stop path
                pass
        self._parts.clear()


class Counters:
    """Counter snapshots → rates → health findings through ``collectors/``."""

    def __init__(self, sys_root: Path, proc_root: Path) -> None:
        self.sys_root, self.proc_root = sys_root, proc_root
        self._prev: Any = None
        self.raw: dict[tuple[str, str], int] = {}  # the last snapshot's counters, as read

    def sample(self) -> tuple[dict[str, Any] | None, dict[tuple[str, str], float], list[dict]]:
        """Take a snapshot; return (rates JSON, {(source, counter): per-second rate}, findings
        JSON). The first call has no previous snapshot: (None, {}, [])."""
        from collectors.rates import rates as counter_rates
        from collectors.snapshot import collect
        from wanprobe.diagnose.rules_fabric import evaluate

        cur = collect(sys_root=self.sys_root, proc_root=self.proc_root)
        prev, self._prev = self._prev, cur
        self.raw = {(".".join(key), name): value for key, cs in cur.counter_sets().items()
                    for name, value in cs.values.items() if name not in cs.gauges}
        if prev is None:
            return None, {}, []
        rates = counter_rates(prev, cur)
        findings = evaluate(cur, rates)
        flat = {(".".join(key), name): r.per_s for key, group in rates.groups.items()
                for name, r in group.items() if r.per_s is not None}
        return _json(rates), flat, [_json(f) for f in findings or ()]


def _json(obj: Any) -> Any:
    return obj.to_json() if hasattr(obj, "to_json") else obj


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _host_json() -> dict[str, Any]:
    try:
        from wanprobe.diagnose.host_config import read_host_config

        return read_host_config(live=False).to_json()
    except (ImportError, OSError, WanprobeError):
        return {"hostname": socket.gethostname(), "kernel": os.uname().release, "sysctls": {},
                "available_cc": [], "allowed_cc": [], "ifaces": {}}


def regression_report(peer: Peer, transitions: list[dict[str, Any]], last_probe: dict | None,
                      baseline: dict[str, Any], *, started: float, finished: float,
                      findings: list[dict[str, Any]] | None = None) -> dict:
    """A ticket-ready report document (the ``diagnose`` schema) for a path regression; the
    findings are made from ``transitions`` unless given."""
    from wanprobe import __version__

    findings = findings if findings is not None else [_finding(peer, t) for t in transitions]
    doc = {
        "schema_version": "1.0", "id": f"regression-{peer.name}-{uuid.uuid4().hex[:12]}",
        "created_at": _iso(finished), "tool": {"name": "wanprobe daemon", "version": __version__},
        "host": _host_json(), "peer": {"address": peer.address, "port": peer.port,
                                       "name": peer.name, "site": peer.site},
        "measurements": {"path": last_probe, "mtu": None, "throughput": None, "counters": None,
                         "baseline": baseline, "regressions": transitions},
        "findings": findings, "plan": None,
        "timestamps": {"started": _iso(started), "finished": _iso(finished)},
    }
    try:
        from wanprobe.report.document import SCHEMA_VERSION, validate
    except ImportError:
        return doc
    doc["schema_version"] = SCHEMA_VERSION
    try:
        validate(doc)
    except WanprobeError as exc:  # still a useful ticket: write it, say what is off
        doc["measurements"]["errors"] = {"schema": str(exc)}
    return doc


_TITLES = {
    "loss": ("path.loss_regression", "Loss to {peer} rose from {base} to {cur}",
             "Check the path for congestion or a failing link/optic; compare forward and reverse "
             "loss to find the direction; open a ticket with the carrier if it persists.",
             "Loss-based congestion control (cubic/reno) slows down sharply with loss; restoring "
             "the baseline loss restores the baseline throughput."),
    "rtt_p50": ("path.rtt_regression", "Median RTT to {peer} rose from {base} to {cur}",
                "Look for a route change (traceroute), queueing on the path or a failover.",
                "Collective time grows with RTT per step; the BDP and needed buffers grow too."),
    "rtt_p99": ("path.rtt_tail_regression", "p99 RTT to {peer} rose from {base} to {cur}",
                "Look for queueing (bufferbloat), microbursts or congestion on the path.",
                "Tail latency stalls synchronous collectives at their slowest step."),
    "throughput": ("path.throughput_regression", "Throughput to {peer} fell from {base} to {cur}",
                   "Run `wanprobe diagnose` against the peer to see what limits the transfer.",
                   "Gradient exchange time grows in proportion to the lost throughput."),
}


def _fmt(value: float, unit: str) -> str:
    if unit == "ratio":
        return f"{value * 100:.2f} %"
    if unit == "ms":
        return f"{value:.2f} ms"
    from wanprobe.units import format_rate

    return format_rate(value)


def _finding(peer: Peer, t: dict[str, Any]) -> dict[str, Any]:
    fid, title, rec, effect = _TITLES[t["metric"]]
    severity = "critical" if t["metric"] in ("loss", "throughput") else "warning"
    return {"id": fid, "severity": severity,
            "title": title.format(peer=peer.name, base=_fmt(t["baseline"], t["unit"]),
                                  cur=_fmt(t["current"], t["unit"])),
            "evidence": {"peer": peer.name, "address": peer.address, "metric": t["metric"],
                         "baseline": t["baseline"], "current": t["current"],
                         "threshold": t["threshold"], "unit": t["unit"], **t["evidence"]},
            "recommendation": rec, "expected_effect": effect, "knobs": [], "impact": None}
