"""The daemon config keys that bound its reflector: who may use it, and what a client may run.

``daemon.allow`` (CIDRs; empty = everyone) and ``daemon.cos_dscp`` (the DSCP a Class-of-Service
TLV may ask for, RFC 8972 §4.4, and any reply may carry; default any but network control, 48-63)
apply to STAMP and throughput alike.
The ``[throughput]`` table binds the daemon's throughput server as well as its own scheduled
tests: ``enabled = false`` refuses every client, ``max_bytes_per_test`` caps what one may request,
and the keys below bound duration, streams, concurrency and the hourly and daily quotas.
"""

from __future__ import annotations

from wanprobe.daemon.config_fields import FieldReader
from wanprobe.errors import UsageError
from wanprobe.probe.access import DEFAULT_COS_DSCP, parse_cidrs, parse_dscp_set
from wanprobe.throughput.limits import ServerLimits

SERVER_KEYS = {"max_duration", "max_streams", "max_concurrent", "tests_per_hour",
               "tests_per_hour_per_client", "bytes_per_day", "bytes_per_day_per_client"}
DAEMON_KEYS = {"allow", "cos_dscp"}
DAEMON_SERVER = ServerLimits(enabled=False, max_duration_s=60.0, max_bytes_per_test=2 * 2**30,
                             max_streams=64, max_concurrent_tests=1, tests_per_hour=60,
                             tests_per_hour_per_client=12, bytes_per_day=100 * 2**30,
                             bytes_per_day_per_client=50 * 2**30)


def reflector_access(v: FieldReader, d: dict) -> tuple[tuple[str, ...], frozenset[int]]:
    """(allowed CIDRs, permitted CoS DSCP) from the ``[daemon]`` table."""
    allow: tuple[str, ...] = ()
    try:
        allow = parse_cidrs(v.str_list(d, "daemon.allow", []), "daemon.allow")
    except UsageError as exc:
        v.problem("daemon.allow", str(exc).removeprefix("daemon.allow "))
    cos = DEFAULT_COS_DSCP
    if "cos_dscp" in d:
        raw = d["cos_dscp"]
        if not isinstance(raw, list) or not all(isinstance(x, (str, int)) and
                                                not isinstance(x, bool) for x in raw):
            v.problem("daemon.cos_dscp", "must be a list of DSCP names or numbers, e.g. "
                      "[\"AF31\", \"EF\", 0]")
        else:
            try:
                cos = parse_dscp_set(raw, "daemon.cos_dscp")
            except UsageError as exc:
                v.problem("daemon.cos_dscp", str(exc).removeprefix("daemon.cos_dscp: "))
    return allow, cos


def server_limits(v: FieldReader, t: dict, *, enabled: bool, max_bytes_per_test: int) -> ServerLimits:
    """The daemon's throughput-server limits from the ``[throughput]`` table."""
    dflt = DAEMON_SERVER
    return ServerLimits(
        enabled=enabled,
        max_bytes_per_test=max_bytes_per_test,
        max_duration_s=v.duration(t, "throughput.max_duration", dflt.max_duration_s, positive=True),
        max_streams=v.integer(t, "throughput.max_streams", dflt.max_streams, lo=1, hi=128),
        max_concurrent_tests=v.integer(t, "throughput.max_concurrent",
                                       dflt.max_concurrent_tests, lo=1, hi=16),
        tests_per_hour=v.integer(t, "throughput.tests_per_hour", dflt.tests_per_hour,
                                 lo=1, hi=100000),
        tests_per_hour_per_client=v.integer(t, "throughput.tests_per_hour_per_client",
                                            dflt.tests_per_hour_per_client, lo=1, hi=100000),
        bytes_per_day=v.size(t, "throughput.bytes_per_day", dflt.bytes_per_day),
        bytes_per_day_per_client=v.size(t, "throughput.bytes_per_day_per_client",
                                        dflt.bytes_per_day_per_client),
    )
