"""A generated history of site pairs whose link changes with the hour of the week, written two
ways: as the OpenMetrics text Prometheus would have scraped from the daemons (for ``promtool tsdb
create-blocks-from openmetrics``) and as rows of one daemon's store. Used by
tests/test_windows_sources.py and bench/windows_query_cost.py.

Each host pair runs one throughput test per hour (at a random minute, as a daemon spacing its
tests an hour apart would) in the hours its shape allows, and a probe session every
``session_s``; every figure follows the pair's shape for that hour, with a little noise.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from wanprobe.history.store import ProbeRow, Store
from wanprobe.probe.stats import percentiles_sorted
from wanprobe.windows.profile import HOUR_S, hour_of_week

METHOD = "stamp"


@dataclass(frozen=True)
class HostPair:
    src_site: str
    src_host: str
    dst_site: str
    dst_host: str

    def labels(self) -> str:
        return (f'peer="{self.dst_host}",src_site="{self.src_site}",src_host="{self.src_host}",'
                f'dst_site="{self.dst_site}",dst_host="{self.dst_host}"')


@dataclass(frozen=True)
class Shape:
    """What the link of a pair gives in each hour of the week (true values, before noise)."""

    fast_hours: frozenset[int]
    fast_bps: float = 900e6
    slow_bps: float = 150e6
    fast_rtt_s: float = 0.080
    slow_rtt_s: float = 0.095
    fast_loss_forward: float = 0.0001
    slow_loss_forward: float = 0.005
    loss_reverse: float = 0.001
    test_hours: frozenset[int] = frozenset(range(168))   # hours the daemon may test in

    def fast(self, hour: int) -> bool:
        return hour in self.fast_hours

    def bps(self, hour: int) -> float:
        return self.fast_bps if self.fast(hour) else self.slow_bps

    def rtt_s(self, hour: int) -> float:
        return self.fast_rtt_s if self.fast(hour) else self.slow_rtt_s

    def loss_forward(self, hour: int) -> float:
        return self.fast_loss_forward if self.fast(hour) else self.slow_loss_forward


def weekday_nights() -> frozenset[int]:
    """Fast 00:00-07:59 UTC on weekdays and all weekend: 64 of 168 hours."""
    return frozenset([d * 24 + h for d in range(5) for h in range(8)] + list(range(120, 168)))


@dataclass
class History:
    start_ts: float
    end_ts: float
    session_s: float
    tests: list[tuple[HostPair, float, float]] = field(default_factory=list)   # pair, ts, bps
    # pair, ts, rtt p50 s, sent, lost forward, lost reverse
    sessions: list[tuple[HostPair, float, float, int, int, int]] = field(default_factory=list)


def generate(shapes: dict[HostPair, Shape], *, end_ts: float, days: float = 14.0,
             session_s: float = 120.0, packets: int = 120, seed: int = 23,
             noise: float = 0.04) -> History:
    """Tests and sessions of every pair over ``days`` up to ``end_ts``."""
    rng = random.Random(seed)
    start = end_ts - days * 86400
    h = History(start, end_ts, session_s)
    for pair, shape in shapes.items():
        hour = math.floor(start / HOUR_S) * HOUR_S
        while hour < end_ts:
            ts = hour + rng.uniform(180, 3300)
            how = hour_of_week(hour)
            if start <= ts < end_ts and how in shape.test_hours:
                h.tests.append((pair, ts, shape.bps(how) * (1 + rng.uniform(-noise, noise))))
            hour += HOUR_S
        owed_fwd = owed_rev = 0.0
        t = start
        while t < end_ts:
            how = hour_of_week(t)
            owed_fwd += packets * shape.loss_forward(how)
            fwd = int(owed_fwd)
            owed_fwd -= fwd
            owed_rev += (packets - fwd) * shape.loss_reverse
            rev = int(owed_rev)
            owed_rev -= rev
            rtt = shape.rtt_s(how) * (1 + rng.uniform(-noise / 2, noise / 2))
            h.sessions.append((pair, t, rtt, packets, fwd, rev))
            t += session_s
    return h


def openmetrics(h: History, *, scrape_s: float | None = None, offset_s: float = 7.0,
                recorded_eval_s: float | None = None,
                upgraded_ts: float | None = None) -> Iterator[str]:
    """The daemon series as Prometheus would have scraped them every ``scrape_s`` (default: the
    session interval), family by family, each series in time order, ending in ``# EOF``; with
    ``recorded_eval_s`` also the profile's recording rules as evaluated that often. With
    ``upgraded_ts`` the daemons ran a wanprobe from before issue 36 until then: RTT with a
    ``quantile`` label and goodput in ``wanprobe_throughput_bits_per_second``, series that end
    there, the new ones beginning with the first session or test after it."""
    scrape_s = scrape_s or h.session_s
    pairs = sorted({p for p, *_ in h.sessions} | {p for p, *_ in h.tests},
                   key=lambda p: p.labels())
    scrapes = [h.start_ts + offset_s + k * scrape_s
               for k in range(int((h.end_ts - h.start_ts - offset_s) // scrape_s) + 1)]

    def gauge_lines(name: str, extra: str, events: dict[HostPair, list[tuple[float, float]]],
                    since: float = -math.inf, until: float = math.inf, head: bool = True):
        if head:
            yield f"# TYPE {name} gauge\n"
        for p in pairs:
            ev, i, last = [e for e in events.get(p, []) if since <= e[0] < until], 0, None
            for t in (t for t in scrapes if t < until):
                while i < len(ev) and ev[i][0] <= t:
                    last, i = ev[i][1], i + 1
                if last is not None:
                    yield f"{name}{{{p.labels()}{extra}}} {last!r} {t:.3f}\n"

    def counter_lines(family: str, extra: str, index: int):
        yield f"# TYPE {family} counter\n"
        for p in pairs:
            ev, i, total = by_pair_sessions.get(p, []), 0, 0
            for t in scrapes:
                while i < len(ev) and ev[i][1] <= t:
                    total, i = total + (1 if index < 0 else ev[i][index]), i + 1
                yield f"{family}_total{{{p.labels()}{extra}}} {total} {t:.3f}\n"

    by_pair_sessions: dict[HostPair, list] = {}
    for s in h.sessions:
        by_pair_sessions.setdefault(s[0], []).append(s)
    tests: dict[HostPair, list[tuple[float, float]]] = {}
    for p, ts, bps in sorted(h.tests, key=lambda x: x[1]):
        tests.setdefault(p, []).append((ts, bps))
    rtts = {p: [(s[1], s[2]) for s in ev] for p, ev in by_pair_sessions.items()}
    m = f',method="{METHOD}"'
    cut = -math.inf if upgraded_ts is None else upgraded_ts
    if upgraded_ts is not None:  # the bit/s gauge of daemons before issue 36
        yield from gauge_lines("wanprobe_throughput_bits_per_second", "", tests, until=cut)
    yield from gauge_lines("wanprobe_throughput_bytes_per_second", "",  # the daemon's: bytes/s
                           {p: [(t, v / 8) for t, v in ev] for p, ev in tests.items()}, since=cut)
    yield "# TYPE wanprobe_rtt_seconds gauge\n"
    if upgraded_ts is not None:
        yield from gauge_lines("wanprobe_rtt_seconds", f',quantile="0.5"{m}', rtts, until=cut,
                               head=False)
    yield from gauge_lines("wanprobe_rtt_seconds", f',stat="p50"{m}', rtts, since=cut, head=False)
    yield from counter_lines("wanprobe_probe_sessions", m, -1)
    yield from counter_lines("wanprobe_probe_packets_sent", m, 3)
    yield from counter_lines("wanprobe_probe_packets_lost", f',direction="forward"{m}', 4)
    # one family, two directions: OpenMetrics wants a family's samples together
    yield from (line for line in counter_lines("wanprobe_probe_packets_lost",
                                               f',direction="reverse"{m}', 5)
                if not line.startswith("#"))
    yield from gauge_lines("wanprobe_peer_info", f',address="198.18.0.1",methods="{METHOD}"',
                           {p: [(h.start_ts, 1.0)] for p in pairs})
    if recorded_eval_s:
        yield from recorded(by_pair_sessions, h, recorded_eval_s)
    yield "# EOF\n"


def recorded(sessions: dict[HostPair, list], h: History, eval_s: float,
             window_s: float = 300.0) -> Iterator[str]:
    """What ``fleet rules`` records for each site pair, evaluated every ``eval_s``: the median
    over host pairs of the last session's RTT median, and per-second rates over ``window_s``
    summed over host pairs (rules.py site_pair_queries, profile_queries). The rate is the
    count in the window over its length, without Prometheus's extrapolation: keep ``eval_s``
    off a multiple of the session interval, or every window sees the same phase."""
    by_site: dict[tuple[str, str], list[HostPair]] = {}
    for p in sorted(sessions, key=lambda p: p.labels()):
        by_site.setdefault((p.src_site, p.dst_site), []).append(p)
    times = {p: [s[1] for s in ev] for p, ev in sessions.items()}
    cums = {p: [list(itertools.accumulate(((1 if i < 0 else s[i]) for s in ev), initial=0))
                for i in (-1, 3, 4, 5)] for p, ev in sessions.items()}
    evals = [h.start_ts + window_s + k * eval_s
             for k in range(int((h.end_ts - h.start_ts - window_s) // eval_s) + 1)]

    def count(p: HostPair, which: int, t: float) -> int:
        return cums[p][which][bisect.bisect_right(times[p], t)]

    def rtt(p: HostPair, t: float) -> float | None:
        i = bisect.bisect_right(times[p], t)
        return sessions[p][i - 1][2] if i else None

    def rate(which: int):
        return lambda hosts, t: sum(count(p, which, t) - count(p, which, t - window_s)
                                    for p in hosts) / window_s

    def median_rtt(hosts, t):
        known = sorted(v for p in hosts if (v := rtt(p, t)) is not None)
        return percentiles_sorted(known, (50,))[0] if known else None

    for name, fn in (("site_pair:wanprobe_rtt_p50:seconds", median_rtt),
                     ("site_pair:wanprobe_probe_sessions:rate", rate(0)),
                     ("site_pair:wanprobe_probe_packets_sent:rate", rate(1)),
                     ("site_pair:wanprobe_probe_packets_lost_forward:rate", rate(2)),
                     ("site_pair:wanprobe_probe_packets_lost_reverse:rate", rate(3))):
        yield f"# TYPE {name} gauge\n"
        for (src, dst), hosts in by_site.items():
            for t in evals:
                v = fn(hosts, t)
                if v is not None:
                    yield f'{name}{{src_site="{src}",dst_site="{dst}"}} {v!r} {t:.3f}\n'


def fill_store(store: Store, h: History, src_host: str) -> int:
    """Write the sessions and tests of ``src_host``'s pairs as its daemon would have (peer =
    the far host's name); returns the rows written."""
    n = 0
    for p, ts, rtt, sent, fwd, rev in h.sessions:
        if p.src_host == src_host:
            store.add_probe(ProbeRow(
                ts=ts, peer=p.dst_host, method=METHOD, sent=sent, received=sent - fwd - rev,
                loss_ratio=(fwd + rev) / sent, loss_forward_ratio=fwd / sent,
                loss_reverse_ratio=rev / (sent - fwd), rtt_p50_ms=rtt * 1e3))
            n += 1
    for p, ts, bps in h.tests:
        if p.src_host == src_host:
            moved = int(bps * 5 / 8)
            store.add_throughput(ts, p.dst_host, {"bits_per_second": bps, "bytes_sent": moved,
                                                  "bytes_received": moved, "duration_s": 5.0})
            n += 1
    store.flush()
    return n


def load_prometheus(lines: Iterable[str], workdir: Path, *, prometheus: str = "prometheus",
                    promtool: str = "promtool", timeout_s: float = 120.0
                    ) -> tuple[str, subprocess.Popen]:
    """Write ``lines`` (OpenMetrics) to ``workdir``, turn them into TSDB blocks with promtool,
    start a Prometheus on a free loopback port over them and wait until it is ready. Returns
    its URL and process (stop it with :func:`stop`)."""
    with open(workdir / "history.om", "w") as f:
        f.writelines(lines)
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics",
                    "--max-block-duration=400h", str(workdir / "history.om"),
                    str(workdir / "tsdb")], check=True, capture_output=True, timeout=3600)
    (workdir / "history.om").unlink()
    (workdir / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with open(workdir / "prometheus.log", "w") as log:
        proc = subprocess.Popen([prometheus, f"--config.file={workdir / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={workdir / 'tsdb'}",
                                 "--storage.tsdb.retention.time=60d",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                if r.status == 200:
                    return url, proc
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError("Prometheus did not start: "
                               + (workdir / "prometheus.log").read_text()[-1000:])
        time.sleep(0.2)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
