"""Where ``wanprobe impact`` takes its measured inputs from, besides diagnose reports: a ring
test's result (``--ring``), and the per-hour-of-week capacity of a site pair from Prometheus
(``--prometheus --from-site --to-site``) or of one peer from the daemon's history
(``--state-dir --peer``): the data behind transfer windows (wanprobe/windows)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any, NamedTuple

from wanprobe.commands.options import http_url
from wanprobe.errors import ConfigError, UsageError, shown
from wanprobe.models.impact import Path
from wanprobe.models.plan_hours import HourCapacity

MAX_LOOKBACK_S = 90 * 86400.0


@dataclass(frozen=True)
class HourSource:
    """The options naming one source of hour-of-week capacity (at most one kind given)."""

    prometheus: str | None = None
    from_site: str | None = None
    to_site: str | None = None
    state_dir: FsPath | None = None
    peer: str | None = None
    lookback_s: float = 14 * 86400.0
    timeout_s: float = 30.0

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.prometheus, self.from_site, self.to_site,
                                           self.state_dir, self.peer))


class RingInput(NamedTuple):
    """A ring test as the planner's input: its WAN path, its number of sites, what it was."""

    path: Path
    sites: int
    described: dict[str, Any]


def ring_input(path: FsPath) -> RingInput:
    """The ring test's JSON (``wanprobe ring --json``, or a report holding one in
    ``measurements.ring``) as the planner's input."""
    from wanprobe.report.codec import ring_part
    from wanprobe.report.document import load_json
    from wanprobe.ring.model import RingResult
    from wanprobe.ring.network import path_of

    doc = ring_part(load_json(path, strict=False))
    if not isinstance(doc, Mapping) or "edges" not in doc:
        raise ConfigError(f"--ring {shown(str(path))}: not a ring test's result (wanprobe ring "
                          "--json) nor a report holding one")
    result = RingResult.from_json(doc)
    wan_path = path_of(result)
    return RingInput(wan_path, len(result.sites), {
        "source": str(path), "order": list(result.order),
        "ring_bits_per_second": result.ring_bits_per_second,
        "note": "the ring's RTTs are TCP handshakes (medians), standing in for the p99"})


def hour_capacities(src: HourSource) -> tuple[list[HourCapacity], dict]:
    """Every hour of the week as the source measured it, and the profile's source."""
    from wanprobe.windows.profile import hour_label, require_goodput

    if src.prometheus is not None or src.from_site is not None or src.to_site is not None:
        if src.state_dir is not None or src.peer is not None:
            raise UsageError("give either --prometheus/--from-site/--to-site or "
                             "--state-dir/--peer, not both")
        profile, what = _from_prometheus(src)
    else:
        profile, what = _from_store(src)
    require_goodput(profile, what)
    hours = [HourCapacity(b.hour_of_week, hour_label(b.hour_of_week), b.samples,
                          b.p10_bits_per_second, b.p50_bits_per_second, b.rtt_p50_seconds,
                          b.loss_forward_ratio) for b in profile.hours]
    return hours, {**profile.source, "lookback_s": profile.end_ts - profile.start_ts}


def _from_prometheus(src: HourSource):
    from wanprobe.windows.from_prometheus import check_site, prometheus_profile

    if src.prometheus is None or src.from_site is None or src.to_site is None:
        raise UsageError("the fleet's capacity needs --prometheus URL, --from-site and --to-site")
    http_url("--prometheus", src.prometheus)
    a, b = check_site("--from-site", src.from_site), check_site("--to-site", src.to_site)
    return prometheus_profile(src.prometheus, a, b, lookback_s=src.lookback_s,
                              now_ts=time.time(), timeout_s=src.timeout_s), f"{a} -> {b}"


def _from_store(src: HourSource):
    from wanprobe.windows.from_store import state_dir_profile

    if src.state_dir is None or src.peer is None:
        raise UsageError("the daemon's history needs --state-dir DIR and --peer NAME")
    return (state_dir_profile(src.state_dir, src.peer, lookback_s=src.lookback_s,
                              now_ts=time.time()), f"this host -> {shown(src.peer)}")
