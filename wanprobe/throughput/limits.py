"""What a throughput client may ask of the server, and how often: limits a security team can read.

``ServerLimits`` is set by ``wanprobe reflect`` options or the daemon's ``[throughput]`` table.
``request_refusal`` range-checks every numeric field of a test request and returns one line naming
the limit it broke; ``Quota`` counts tests per hour and bytes per day, per client and in total.
Ranges that are not configurable are properties of the protocol and the kernel:

- ``window_bytes`` 1 KiB-1 GiB: SO_SNDBUF/SO_RCVBUF are ints the kernel doubles (socket(7));
- ``pacing_rate_bps`` 8 kbit/s-1 Tbit/s: SO_MAX_PACING_RATE is bytes per second (socket(7));
- ``udp_rate_bps`` 8 kbit/s-100 Gbit/s and ``interval_s`` 0.1-60 s: the server writes one
  report line per interval, so a tiny interval would be a loop writing to a client that may not read.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass

from wanprobe.throughput.protocol import UDP_HEADER_BYTES, TestRequest

WINDOW_RANGE_BYTES = (1024, 2**30)
PACING_RANGE_BPS = (8e3, 1e12)
UDP_RATE_RANGE_BPS = (8e3, 1e11)
INTERVAL_RANGE_S = (0.1, 60.0)
MIN_DURATION_S = 0.1  # one report interval: a 1e-300 s test is not a measurement
MAX_CC_CHARS = 16  # TCP_CA_NAME_MAX (include/net/tcp.h)
_MAX_CLIENTS = 4096


@dataclass(frozen=True)
class ServerLimits:
    """Bounds on what clients may run; the defaults suit an ad-hoc ``wanprobe reflect``."""

    enabled: bool = True
    max_duration_s: float = 60.0
    max_bytes_per_test: int = 10 * 2**30
    max_streams: int = 128
    max_concurrent_tests: int = 1
    tests_per_hour: int = 600
    tests_per_hour_per_client: int = 120
    bytes_per_day: int = 2**50
    bytes_per_day_per_client: int = 2**50
    handshake_timeout_s: float = 5.0
    max_connections: int = 1024

    def to_json(self) -> dict:
        return {"max_duration_s": self.max_duration_s, "max_bytes": self.max_bytes_per_test,
                "max_streams": self.max_streams}


def _show(value: float) -> str:
    if isinstance(value, int) and abs(value) >= 10**18:
        return f"{str(value)[:12]}... ({len(str(abs(value)))} digits)"
    return f"{value:g}"


def _outside(name: str, value: float, lo: float, hi: float, unit: str) -> str | None:
    if not lo <= value <= hi:  # NaN fails every comparison
        return f"{name} {_show(value)} is outside this server's range {lo:g}-{hi:g} {unit}".rstrip()
    return None


def request_refusal(req: TestRequest, limits: ServerLimits) -> str | None:
    """One line naming the limit ``req`` breaks, or None when it is within every limit."""
    if not req.duration_s <= limits.max_duration_s:
        return (f"test duration {_show(req.duration_s)} s exceeds this server's limit of "
                f"{limits.max_duration_s:g} s (max_duration)")
    if not req.duration_s >= MIN_DURATION_S:
        return (f"test duration {_show(req.duration_s)} s is below this server's minimum of "
                f"{MIN_DURATION_S:g} s")
    if not 0 < req.max_bytes <= limits.max_bytes_per_test:
        return (f"test byte cap {_show(req.max_bytes)} B exceeds this server's limit of "
                f"{limits.max_bytes_per_test} B (max_bytes_per_test)")
    if not 1 <= req.streams <= limits.max_streams:
        return (f"{_show(req.streams)} streams is outside this server's limit of "
                f"1-{limits.max_streams} (max_streams)")
    checks = [
        _outside("interval_s", req.interval_s, *INTERVAL_RANGE_S, "s"),
        _outside("dscp", req.dscp, 0, 63, ""),
        _outside("udp_packet_bytes", req.udp_packet_bytes, UDP_HEADER_BYTES, 65000, "B"),
    ]
    if req.udp_port is not None:
        checks.append(_outside("udp_port", req.udp_port, 1, 65535, ""))
    if req.window_bytes is not None:
        checks.append(_outside("window_bytes", req.window_bytes, *WINDOW_RANGE_BYTES, "B"))
    if req.pacing_rate_bps is not None:
        checks.append(_outside("pacing_rate_bps", req.pacing_rate_bps, *PACING_RANGE_BPS, "bit/s"))
    if req.udp:
        if req.udp_rate_bps is None:
            checks.append("udp_rate_bps is required for a UDP test")
        else:
            checks.append(_outside("udp_rate_bps", req.udp_rate_bps, *UDP_RATE_RANGE_BPS, "bit/s"))
    if req.cc is not None and not (len(req.cc) <= MAX_CC_CHARS and req.cc.isascii()
                                   and req.cc.replace("_", "").isalnum()):
        checks.append(f"cc {req.cc[:20]!r} is not a congestion control name")
    return next((c for c in checks if c), None)


class Quota:
    """Tests per hour and bytes per day, per client address and in total (sliding windows).
    A test reserves its byte cap when accepted; ``settle`` replaces it with the bytes moved."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self._clients: OrderedDict[str, deque] = OrderedDict()  # ip -> deque of [t, bytes]
        self._all: deque = deque()

    def _trim(self, q: deque, now: float) -> None:
        while q and now - q[0][0] > 86400.0:
            q.popleft()

    def refusal(self, client: str, limits: ServerLimits) -> str | None:
        now = self.clock()
        mine = self._clients.get(client, deque())
        self._trim(mine, now)
        self._trim(self._all, now)
        hour = lambda q: sum(1 for e in q if now - e[0] <= 3600.0)  # noqa: E731
        if hour(mine) >= limits.tests_per_hour_per_client:
            return (f"this client already ran {limits.tests_per_hour_per_client} tests in the "
                    "last hour (tests_per_hour_per_client)")
        if hour(self._all) >= limits.tests_per_hour:
            return f"this server already ran {limits.tests_per_hour} tests in the last hour (tests_per_hour)"
        if sum(e[1] for e in mine) >= limits.bytes_per_day_per_client:
            return (f"this client used its {limits.bytes_per_day_per_client} B of the last 24 h "
                    "(bytes_per_day_per_client)")
        if sum(e[1] for e in self._all) >= limits.bytes_per_day:
            return f"this server moved its {limits.bytes_per_day} B of the last 24 h (bytes_per_day)"
        return None

    def remaining_bytes(self, client: str, limits: ServerLimits) -> int:
        mine = sum(e[1] for e in self._clients.get(client, ()))
        total = sum(e[1] for e in self._all)
        return max(0, min(limits.bytes_per_day_per_client - mine, limits.bytes_per_day - total))

    def reserve(self, client: str, nbytes: int) -> list:
        entry = [self.clock(), nbytes]
        mine = self._clients.pop(client, None) or deque()
        mine.append(entry)
        self._clients[client] = mine
        while len(self._clients) > _MAX_CLIENTS:
            self._clients.popitem(last=False)
        self._all.append(entry)
        return entry

    @staticmethod
    def settle(entry: list, moved_bytes: int) -> None:
        entry[1] = moved_bytes
