"""The ``[ring]`` table: a ring test (``wanprobe ring``, services/ring.py) the daemon runs on a
schedule (daemon/ring_schedule.py, issue 39).

A ring test loads every WAN link of a job at once, so it is rare: ``interval`` is at least an
hour (default a day) and, like ``[throughput]``, it runs only inside ``windows``. The hosts are
given in ring order (this daemon's own host may be one of them); each runs a reflector with the
fleet's key (``daemon.hmac_key_file`` here) and an allow list naming the others
(throughput/ring_op.py), so ``enabled = true`` without a key is refused here, not at 3 a.m.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from wanprobe.daemon.config_fields import FieldReader, TimeWindow
from wanprobe.errors import UsageError
from wanprobe.probe.peer import check_peer
from wanprobe.services.ring import MAX_EDGE_S, MAX_RING_HOSTS, MAX_STREAMS
from wanprobe.throughput.limits import ServerLimits
from wanprobe.throughput.ring_op import MAX_OMIT_S

RING_KEYS = {"enabled", "hosts", "port", "interval", "duration", "omit", "streams", "site_rtt",
             "measure_best", "windows"}
MIN_INTERVAL_S = 3600.0


@dataclass(frozen=True)
class RingSettings:
    """A ring test of ``hosts`` (in ring order, as configured) every ``interval_s`` inside
    ``windows`` (empty = any time); the rest are ``wanprobe ring``'s options."""

    enabled: bool = False
    hosts: tuple[str, ...] = ()
    port: int = 862
    interval_s: float = 86400.0
    duration_s: float = 5.0
    omit_s: float = 1.0
    streams: int = 4
    site_rtt_ms: float = 5.0
    measure_best: bool = True
    windows: tuple[TimeWindow, ...] = ()


def ring_settings(v: FieldReader, t: dict[str, Any], *, hmac_key: bytes | None,
                  server: ServerLimits) -> RingSettings:
    """The ``[ring]`` table; ``hmac_key`` is the daemon's (None: none configured or a bad one),
    ``server`` the ``[throughput]`` limits, which a fleet sharing this config puts on the ring
    hosts' reflectors too."""
    v.known(t, "ring", RING_KEYS)
    d = RingSettings()
    windows = tuple(w for w in (v.window(f"ring.windows[{i}]", s) for i, s in
                                enumerate(v.str_list(t, "ring.windows", []))) if w)
    s = RingSettings(
        enabled=v.boolean(t, "ring.enabled", False),
        hosts=_hosts(v, t),
        port=v.port(t, "ring.port", d.port),
        interval_s=v.duration(t, "ring.interval", d.interval_s, positive=True),
        duration_s=v.duration(t, "ring.duration", d.duration_s, positive=True),
        omit_s=v.duration(t, "ring.omit", d.omit_s),
        streams=v.integer(t, "ring.streams", d.streams, lo=1, hi=MAX_STREAMS),
        site_rtt_ms=v.duration(t, "ring.site_rtt", d.site_rtt_ms / 1e3, positive=True) * 1e3,
        measure_best=v.boolean(t, "ring.measure_best", d.measure_best),
        windows=windows,
    )
    if s.interval_s < MIN_INTERVAL_S and "ring.interval" not in v.bad:
        v.problem("ring.interval", f"{s.interval_s:g} s is too often: at least 1h (a ring test "
                  "loads every WAN link of the job at once)")
    if s.duration_s > MAX_EDGE_S:
        v.problem("ring.duration", f"{s.duration_s:g} s is over the {MAX_EDGE_S:g} s a ring run may take")
    if s.omit_s > MAX_OMIT_S:
        v.problem("ring.omit", f"{s.omit_s:g} s is over the {MAX_OMIT_S:g} s a reflector accepts")
    if s.enabled:
        _enabled(v, s, hmac_key, server)
    return s


def _enabled(v: FieldReader, s: RingSettings, hmac_key: bytes | None,
             server: ServerLimits) -> None:
    """What a ring that is on needs: two hosts, the key, and runs the far ends accept."""
    if len(s.hosts) < 2 and not any(k.startswith("ring.hosts") for k in v.bad):
        v.problem("ring.hosts", f"a ring needs at least two hosts when ring.enabled = true, "
                  f"got {len(s.hosts)}")
    if hmac_key is None and not {"daemon.hmac_key", "daemon.hmac_key_file"} & v.bad:
        v.problem("ring.enabled", "needs daemon.hmac_key_file: the ring hosts' reflectors run "
                  "ring tests for an authenticated request only")
    if s.duration_s + s.omit_s > server.max_duration_s and not {"ring.duration", "ring.omit"} & v.bad:
        v.problem("ring.duration", f"with ring.omit, {s.duration_s + s.omit_s:g} s exceeds what a "
                  f"far end with this config accepts (throughput.max_duration = "
                  f"{server.max_duration_s:g})")
    if s.streams > server.max_streams:
        v.problem("ring.streams", f"exceeds what a far end with this config accepts "
                  f"(throughput.max_streams = {server.max_streams})")


def _hosts(v: FieldReader, t: dict[str, Any]) -> tuple[str, ...]:
    """``ring.hosts``: addresses or names in ring order, each once (an address however
    written, a name in any case)."""
    raw = v.str_list(t, "ring.hosts", [])
    if len(raw) > MAX_RING_HOSTS:
        v.problem("ring.hosts", f"a ring of at most {MAX_RING_HOSTS} hosts, got {len(raw)}")
        return ()
    out: list[str] = []
    seen: dict[str, int] = {}
    for i, host in enumerate(raw):
        key = f"ring.hosts[{i}]"
        try:
            canon = str(ipaddress.ip_address(host))
        except ValueError:
            try:  # a name (RFC 1123; the last label not all digits: 198.18.0.01 is a typo)
                if check_peer(host) != host:  # nothing around it either
                    raise UsageError(host)
            except UsageError:
                v.problem(key, f"{host!r} is not an IP address or a host name")
                continue
            canon = host.lower().rstrip(".")
        if canon in seen:
            v.problem(key, f"{host!r} is listed twice (also ring.hosts[{seen[canon]}])")
            continue
        seen[canon] = i
        out.append(host)
    return tuple(out)
