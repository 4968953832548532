"""``diagnose``: run the probes, a capped throughput test, the collectors and the host-config read,
then the rules, and assemble one report.

Each measurement is optional: a piece that fails (peer without a reflector, a module not built
yet, a collector error) is recorded in ``measurements.errors`` as "not measured: why" and the
rules that need it stay silent; the diagnosis itself never crashes on it.

Each measurement stays typed (``ProbeResult``, ``ThroughputResult``, ``Capacity``, ``HostFacts``)
until ``diagnose`` writes the report's ``measurements`` once, in one place: the path document is
the probe's plus the capacity keys, the MTU document the search's plus the route's; no function
edits another's document. The rules then read them through the one typed view (the report
codec, ``report/codec.py``), as every reader of a saved report does.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, TypeVar

from collectors.host_config import read_host_config
from wanprobe import __version__
from wanprobe.diagnose.engine import run_rules
from wanprobe.diagnose.inputs import ASSUMED_LINK_BPS, LOSS_SLO, OPERATOR_SOURCE, DiagnoseConfig
from wanprobe.diagnose.tcp_verdict import against_capacity
from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.errors import ProbeError, UsageError, WanprobeError
from wanprobe.models.tcp_ramp import TestTime, tcp_test_time
from wanprobe.probe.peer import check_peer
from wanprobe.probe.stats import Z95
from wanprobe.report.codec import host_of, measured_of
from wanprobe.report.document import SCHEMA_VERSION, Report

if TYPE_CHECKING:
    from collectors.host_facts import HostFacts
    from collectors.snapshot import Snapshot
    from wanprobe.probe.result import ProbeResult
    from wanprobe.throughput.capacity import Capacity
    from wanprobe.throughput.result import ThroughputResult

STAMP_PORT = 862
# wanprobe's reflector answers datagrams up to 9216 B (reflector.MAX_DATAGRAM) + IPv4/UDP headers
REFLECTOR_MAX_IP_BYTES = 9216 + 20 + 8
TRAINING_DSCP = 26  # AF31: the RoCE/NCCL convention (NCCL_IB_TC=106, roce-nccl.md §2.6)
PROBE_PPS = 1000.0  # probes/s: ~0.8 Mbit/s of 100-byte probes, a fifth of the reflector's limit


@dataclass(frozen=True)
class DiagnoseOptions:
    """What to measure. ``quick``: ~2 s of probes and a single-stream test of 2 s measured after
    its ramp-up; ``full``: 10 s of probes, 8 s measured and the 1/2/4/8 stream scan. The ramp-up
    left out is sized from the path (models/tcp_ramp.py)."""

    peer: str
    port: int = STAMP_PORT
    mode: str = "quick"
    link_rate_bps: float | None = None
    dscp: int = TRAINING_DSCP
    throughput: bool = True
    counters: bool = True
    hmac_key: bytes | None = field(default=None, repr=False)  # the reflector's shared key
    reverse: bool = True           # also measure peer → this host (issue 13: both ends)
    capacity: bool = True          # measure the path capacity with UDP bursts
    concurrent_flows: int = 16     # flows per host for the memory budget (NCCL sockets × peers)
    loss_slo: float = LOSS_SLO     # the loss the path may have (a finding above it)

    @property
    def probe_seconds(self) -> float:
        """How long the probes run: enough at PROBE_PPS to resolve the default 0.1 % SLO with
        no loss seen (z²/SLO ≈ 3,840 probes; diagnose/rules_loss.py), longer with --full."""
        return 4.0 if self.mode == "quick" else 10.0

    def probe_plan(self, limit_pps: int | None) -> tuple[int, float]:
        """(probes, interval): PROBE_PPS, or PACE_SHARE of the reflector's own limit when it
        answers fewer (a third-party reflector's 256 per second), for ``probe_seconds``."""
        from wanprobe.probe.rate_guard import PACE_SHARE

        pps = PROBE_PPS if not limit_pps else min(PROBE_PPS, PACE_SHARE * limit_pps)
        return max(int(pps * self.probe_seconds), 100), 1.0 / pps

    @property
    def throughput_s(self) -> float:
        """The least a TCP test measures after its ramp-up."""
        return 2.0 if self.mode == "quick" else 8.0

    @property
    def throughput_max_bytes(self) -> int:
        """Cap per test so a diagnosis cannot flood a production link (issue 4)."""
        return (1 if self.mode == "quick" else 4) * 2**30


Progress = Callable[[str], None]
T = TypeVar("T")


class RouteKeys(TypedDict, total=False):
    """The route to the peer (collectors.route), as the MTU document and the host's address
    read it; empty when there is none."""

    iface: str | None
    route_mtu: int | None           # the PMTU the kernel learned from ICMP, else None
    source_address: str | None


class ScanRow(TypedDict):
    """One row of the stream scan (``measurements.streams_scan``)."""

    streams: int
    bits_per_second: float
    per_stream_bits_per_second: float


class Documented(Protocol):
    """A typed measurement with its report document."""

    def to_json(self) -> dict[str, Any]: ...


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_route_get(text: str) -> RouteKeys:
    """``ip -j route get ADDR`` -> {"iface", "route_mtu"} (collectors.route parses it);
    route_mtu is the PMTU the kernel learned from ICMP "fragmentation needed", else None."""
    from collectors.route import parse_route_get as parse

    r = parse(text)
    return {} if r is None else {"iface": r.iface, "route_mtu": r.route_mtu_bytes}


def route_to(peer: str) -> RouteKeys:
    from collectors.route import route_get

    r = route_get(peer)
    return {} if r is None else {"iface": r.iface, "route_mtu": r.route_mtu_bytes,
                                 "source_address": r.source_address}


def _guard(errors: dict[str, str], part: str, fn: Callable[[], T]) -> T | None:
    """Run one measurement; on failure record why and return None (not measured)."""
    try:
        return fn()
    except WanprobeError as exc:
        errors[part] = str(exc)
    except ImportError as exc:
        errors[part] = f"not available in this build ({exc.name})"
    except Exception as exc:  # a measurement bug must not cost the rest of the diagnosis
        errors[part] = f"{type(exc).__name__}: {exc}"
    return None


def measure_path(opts: DiagnoseOptions, say: Progress) -> ProbeResult:
    """The STAMP probes: at the rate the reflector takes, long enough to resolve the loss SLO
    (DiagnoseOptions.probe_plan); ProbeError when nothing answered (exit 5)."""
    import asyncio

    from wanprobe.probe.api import run_probe
    from wanprobe.probe.peer import resolve_peer
    from wanprobe.probe.rate_guard import ask_limit_pps

    async def limit() -> int | None:
        _family, addr = await resolve_peer(opts.peer)
        return await ask_limit_pps(addr, opts.port, timeout_s=2.0, hmac_key=opts.hmac_key)

    count, interval_s = opts.probe_plan(asyncio.run(limit()))
    say(f"probing {opts.peer} (STAMP, {count} probes at {1 / interval_s:.0f}/s, DSCP "
        f"{opts.dscp}: loss resolved to about {Z95 ** 2 / count:.2%} with none seen)")
    key = {"hmac_key": opts.hmac_key} if opts.hmac_key is not None else {}
    res = run_probe(opts.peer, "stamp", port=opts.port, count=count, interval_s=interval_s,
                    dscp=opts.dscp, **key)
    if not res.loss.received:
        # no reply at all says nothing about the path, only that no reflector answers
        raise ProbeError(f"no STAMP reply from {opts.peer} port {opts.port}: is `wanprobe "
                         "reflect` running there? " + (
                             "(the key given may not be its key)" if opts.hmac_key else
                             "(a reflector run with --hmac-key-file drops unsigned probes: "
                             "pass its key with --hmac-key-file)"))
    return res


def measure_mtu(opts: DiagnoseOptions) -> dict[str, Any]:
    import asyncio

    from wanprobe.probe.mtu import probe_path_mtu

    res = asyncio.run(probe_path_mtu(opts.peer, port=opts.port, max_size=REFLECTOR_MAX_IP_BYTES,
                                     hmac_key=opts.hmac_key))
    local_mtu = res.local_mtu or 0
    route = route_to(opts.peer)
    route_mtu = route.get("route_mtu")
    # A PMTU the kernel learned means ICMP came back; a smaller path without one is a black hole.
    return {**res.to_json(), "search_max_bytes": min(REFLECTOR_MAX_IP_BYTES, local_mtu),
            "iface": route.get("iface"), "iface_mtu": res.local_mtu, "route_mtu": route_mtu,
            "icmp_seen": route_mtu is not None and route_mtu < local_mtu}


def measure_throughput(opts: DiagnoseOptions, time: TestTime,
                       reverse: bool = False) -> ThroughputResult:
    from wanprobe.throughput.client import MAX_TEST_S, run_throughput

    return run_throughput(opts.peer, port=opts.port, duration_s=time.measure_s, streams=1,
                          max_bytes=opts.throughput_max_bytes, reverse=reverse,
                          hmac_key=opts.hmac_key, omit_s=time.omit_s,
                          interval_s=time.interval_s, max_duration_s=MAX_TEST_S, judge=JUDGE)


SCAN_STREAMS = (1, 2, 4, 8)


def measure_streams_scan(opts: DiagnoseOptions, time: TestTime) -> list[ScanRow]:
    """Per-stream rates at 1, 2, 4 and 8 parallel streams (full mode), each after its ramp-up:
    the measured per-stream ceiling that nccl-env sizes NCCL's socket count from (nccl-tests#83:
    the slowest socket × the socket count)."""
    from wanprobe.throughput.client import MAX_TEST_S, run_throughput

    out: list[ScanRow] = []
    for n in SCAN_STREAMS:
        res = run_throughput(opts.peer, port=opts.port, duration_s=time.measure_s / 2,
                             streams=n, max_bytes=opts.throughput_max_bytes,
                             hmac_key=opts.hmac_key, omit_s=time.omit_s,
                             interval_s=time.interval_s, max_duration_s=MAX_TEST_S,
                             judge=JUDGE)
        out.append({"streams": n, "bits_per_second": res.bits_per_second,
                    "per_stream_bits_per_second": res.bits_per_second / n})
    return out


def measure_capacity(opts: DiagnoseOptions, nic_bps: float | None) -> Capacity:
    """UDP bursts up the ladder to the NIC speed (an upper bound only)."""
    from wanprobe.throughput.capacity import DEFAULT_MAX_BPS, DEFAULT_START_BPS
    from wanprobe.throughput.capacity import measure_capacity as bursts

    upper = nic_bps or DEFAULT_MAX_BPS
    return bursts(opts.peer, opts.port, start_bps=min(DEFAULT_START_BPS, upper), max_bps=upper,
                  max_bytes=opts.throughput_max_bytes, dscp=0, hmac_key=opts.hmac_key)


def fetch_peer_facts(opts: DiagnoseOptions) -> HostFacts:
    from wanprobe.throughput.host_facts_op import fetch

    return fetch(opts.peer, opts.port, hmac_key=opts.hmac_key)


def local_facts(opts: DiagnoseOptions, proc_root: Path) -> HostFacts:
    from collectors.host_facts import read_host_facts

    return read_host_facts(opts.peer, proc_root=proc_root)


def _capacity(opts: DiagnoseOptions, errors: dict[str, str], nic_bps: float | None,
              say: Progress) -> Capacity | None:
    """The UDP bursts' capacity, measured before the TCP tests so that they can be sized from
    it; None when the operator gave the rate or it was not measured (why, in ``errors``)."""
    if opts.link_rate_bps or not (opts.capacity and opts.throughput):
        return None
    say("measuring the path capacity (UDP bursts of 0.5 s, from 50 Mbit/s up by 4x)")
    return _guard(errors, "capacity", lambda: measure_capacity(opts, nic_bps))


def _capacity_keys(opts: DiagnoseOptions, errors: dict[str, str],
                   capacity: Capacity | None) -> dict[str, Any]:
    """The path's capacity keys: the operator's rate, the measured figure (a lower bound named
    so) or why it was not measured."""
    if opts.link_rate_bps:
        return {"capacity_bits_per_second": opts.link_rate_bps,
                "capacity_source": OPERATOR_SOURCE, "capacity_is_lower_bound": False}
    if capacity is not None:
        return {"capacity_bits_per_second": capacity.bits_per_second,
                "capacity_source": capacity.source,
                "capacity_is_lower_bound": capacity.lower_bound}
    return {"capacity_bits_per_second": None,
            "capacity_source": "not measured: " + errors.get("capacity", "skipped")}


def _test_time(opts: DiagnoseOptions, probe: ProbeResult, capacity: Capacity | None,
               nic_bps: float | None) -> TestTime:
    """The TCP tests' length from the path: its RTT and the rate to reach (the operator's, the
    measured capacity, the NIC speed, else the 10 Gbit/s tier)."""
    rtt_s = (probe.rtt.min if probe.rtt else 0.0) / 1e3 or 0.001
    rate = (opts.link_rate_bps or (capacity.bits_per_second if capacity else None) or nic_bps
            or ASSUMED_LINK_BPS)
    return tcp_test_time(rate, rtt_s, measure_min_s=opts.throughput_s)


def _json(result: Documented | None) -> dict[str, Any] | None:
    """A typed measurement's report document; None (not measured) stays None."""
    return None if result is None else result.to_json()


def snapshot(sys_root: Path, proc_root: Path) -> Snapshot:
    from collectors.snapshot import collect

    return collect(sys_root=sys_root, proc_root=proc_root)


def counters_json(first: Snapshot, second: Snapshot) -> dict[str, Any]:
    """The counters document between two snapshots (services/counters.py)."""
    from wanprobe.services.counters import document, judge

    return document(*judge(first, second))


def _before_the_tests(opts: DiagnoseOptions, errors: dict[str, str], probe: ProbeResult | None,
                      host: dict[str, Any], route: RouteKeys, say: Progress
                      ) -> tuple[HostFacts | None, Capacity | None, TestTime | None]:
    """The peer's host facts, the path's capacity and the TCP tests' length from both; none
    when the peer's reflector did not answer the probe."""
    if probe is None:
        errors.setdefault("peer_facts", "skipped: the peer's reflector did not answer")
        return None, None, None
    say("asking the peer for its host facts")
    peer_facts = _guard(errors, "peer_facts", lambda: fetch_peer_facts(opts))
    local = host_of(host)
    nic = local.iface(route.get("iface")) if local is not None else None
    nic_bps = nic.speed_mbps * 1e6 if nic and nic.speed_mbps else None
    capacity = _capacity(opts, errors, nic_bps, say)
    return peer_facts, capacity, _test_time(opts, probe, capacity, nic_bps)


def _transfers(opts: DiagnoseOptions, errors: dict[str, str], time: TestTime | None,
               say: Progress) -> tuple[ThroughputResult | None, ThroughputResult | None,
                                       list[ScanRow] | None]:
    """The TCP tests, each ``time`` long with its ramp-up left out: forward, reverse and
    (--full) the 1/2/4/8 stream scan; each None where not measured (the reason in ``errors``);
    none when the peer's reflector did not answer the probe (``time`` None)."""
    tput = tput_rev = scan = None
    if opts.throughput and time is not None:
        say(f"throughput test, {time.said()} (capped)")
        tput = _guard(errors, "throughput", lambda: measure_throughput(opts, time))
        if opts.reverse:
            say(f"reverse throughput test, {time.total_s:.1f} s (capped)")
            tput_rev = _guard(errors, "throughput_reverse",
                              lambda: measure_throughput(opts, time, reverse=True))
    elif opts.throughput:
        errors.setdefault("throughput", "skipped: the peer's reflector did not answer")
    if opts.throughput and time is not None and opts.mode == "full":
        say(f"per-stream rates at 1, 2, 4, 8 streams ({len(SCAN_STREAMS)} x "
            f"{time.omit_s + time.measure_s / 2:.1f} s)")
        scan = _guard(errors, "streams_scan", lambda: measure_streams_scan(opts, time))
    return tput, tput_rev, scan


def _checked(opts: DiagnoseOptions, capacity: Capacity | None,
             tputs: tuple[ThroughputResult | None, ...]
             ) -> tuple[Capacity | None, tuple[ThroughputResult | None, ...]]:
    """The capacity never below what TCP delivered in the same run, and each TCP verdict
    checked against it (diagnose/tcp_verdict.py)."""
    if capacity is not None:
        done = [t for t in tputs if t is not None]
        capacity = capacity.at_least(max((t.bits_per_second for t in done), default=None),
                                     max((b for t in done if (b := t.bbr_bandwidth_max_bps())),
                                         default=None))
    if opts.link_rate_bps:
        bps, source, trusted, why = opts.link_rate_bps, OPERATOR_SOURCE, True, ""
    elif capacity is not None:
        bps, source, trusted = capacity.bits_per_second, capacity.source, not capacity.lower_bound
        why = capacity.reason
    else:
        bps, source, trusted, why = None, "not measured", False, "the capacity was not measured"
    return capacity, tuple(against_capacity(t, bps, source, trusted, why) for t in tputs)


def diagnose(opts: DiagnoseOptions, *, proc_root: Path = Path("/proc"),
             sys_root: Path = Path("/sys"), progress: Progress | None = None) -> Report:
    """Measure the path to ``opts.peer`` and this host, run the rules, return the report."""
    if opts.mode not in ("quick", "full"):
        raise UsageError(f"mode must be quick or full, got {opts.mode!r}")
    check_peer(opts.peer)
    try:
        socket.getaddrinfo(opts.peer, opts.port)
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"cannot resolve peer {opts.peer!r}: {getattr(exc, 'strerror', exc)}"
                         ) from None
    say = progress or (lambda _msg: None)
    started = now_iso()
    errors: dict[str, str] = {}
    say("reading host configuration")
    route = route_to(opts.peer)
    facts = _guard(errors, "host_facts", lambda: local_facts(opts, proc_root))
    host = replace(read_host_config(proc_root, sys_root), address=route.get("source_address"),
                   facts=facts).to_json()
    before = None
    if opts.counters:
        say("sampling counters")
        before = _guard(errors, "counters", lambda: snapshot(sys_root, proc_root))
    probe = _guard(errors, "path", lambda: measure_path(opts, say))
    say("searching the path MTU")
    mtu = _guard(errors, "mtu", lambda: measure_mtu(opts)) if probe is not None else None
    if probe is None:
        errors.setdefault("mtu", "skipped: the peer's reflector did not answer")
    peer_facts, capacity, time_ = _before_the_tests(opts, errors, probe, host, route, say)
    tput, tput_rev, scan = _transfers(opts, errors, time_, say)
    capacity, (tput, tput_rev) = _checked(opts, capacity, (tput, tput_rev))
    # the RTT samples go with it: the distribution of `report show --format html`
    path = (None if probe is None else
            {**probe.to_json(samples=True), **_capacity_keys(opts, errors, capacity)})
    counters = None
    if before is not None:
        if tput is None:
            time.sleep(1.0)  # rates need two samples some time apart
        after = _guard(errors, "counters", lambda: snapshot(sys_root, proc_root))
        if after is not None:
            counters = _guard(errors, "counters", lambda: counters_json(before, after))
    # each measurement written once, here: no function edits another's document
    measurements = {"path": path, "mtu": mtu, "throughput": _json(tput),
                    "throughput_reverse": _json(tput_rev), "capacity": _json(capacity),
                    "streams_scan": scan, "peer_facts": _json(peer_facts), "counters": counters,
                    "errors": errors}
    say("evaluating rules")
    findings = run_rules(measured_of(measurements), host_of(host), DiagnoseConfig(
        link_rate_bps=opts.link_rate_bps, dscp=opts.dscp, concurrent_flows=opts.concurrent_flows,
        loss_slo=opts.loss_slo))
    return Report(
        id=uuid.uuid4().hex[:16], created_at=started,
        tool={"name": "wanprobe", "version": __version__}, host=host,
        peer={"address": opts.peer, "port": opts.port}, measurements=measurements,
        findings=tuple(findings), timestamps={"started": started, "finished": now_iso()},
        schema_version=SCHEMA_VERSION)
