"""Limits of one probe run, checked before anything is sent (issue 14: absurd runs are refused
up front with the limit named, not started).

``check_run`` bounds the number and span of probes, ``check_timeout`` the reply timeout; both
raise a one-line UsageError. The sender of each method (STAMP, ICMP, TCP) calls them through its
option check, and the CLI parses with the same constants.
"""

from __future__ import annotations

from wanprobe.errors import UsageError

MAX_PROBES = 1_000_000        # one session's per-probe state stays under ~200 MB
MAX_PROBE_S = 24 * 3600.0     # one run; longer watching is the daemon's job
MAX_TIMEOUT_S = 60.0          # a reply later than a minute is lost on any path
MAX_DATAGRAM_BYTES = 65535    # an IP packet's total length field (RFC 791; IPv6 without jumbograms)


def check_run(count: int | None, duration_s: float | None, interval_s: float) -> None:
    """Refuse a count, duration or interval beyond the limits, and a run they make too long."""
    if not interval_s > 0 or interval_s > MAX_PROBE_S:
        raise UsageError(f"--interval must be > 0 and at most {MAX_PROBE_S / 3600:g}h")
    if count is not None and count > MAX_PROBES:
        raise UsageError(f"--count {count} is above the limit of {MAX_PROBES:,} probes")
    if duration_s is not None and duration_s > MAX_PROBE_S:
        raise UsageError(f"--duration {duration_s:g} s is above the limit of "
                         f"{MAX_PROBE_S / 3600:g}h (use the daemon to watch a path)")


def check_total(total: int, interval_s: float) -> None:
    """Refuse a run of ``total`` probes ``interval_s`` apart beyond the limits."""
    if total > MAX_PROBES:
        raise UsageError(f"{total:,} probes (duration / interval) is above the limit of "
                         f"{MAX_PROBES:,}; use a longer --interval")
    if total * interval_s > MAX_PROBE_S:
        raise UsageError(f"{total} probes {interval_s:g} s apart run longer than the limit of "
                         f"{MAX_PROBE_S / 3600:g}h")


def check_timeout(timeout_s: float) -> None:
    """Refuse a reply timeout that is not positive or beyond MAX_TIMEOUT_S."""
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise UsageError(f"timeout must be > 0 and at most the limit of {MAX_TIMEOUT_S:g} s "
                         f"(got {timeout_s:g} s)")
