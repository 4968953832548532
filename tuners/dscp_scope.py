"""How much of this host's egress a DSCP plan marks, judged over the union of its classifiers
(issue 37), so that no plan marks "everything" one harmless-looking classifier at a time.

A classifier narrowed by its owner (a cgroup, or a uid other than 0) marks one job's traffic and
is left out. Every other one marks a box in (destination address × destination port) per family
and protocol: its ``daddr`` prefixes (none: the whole family) times its ``dport`` range (none:
every port). ``uid 0`` narrows nothing: root owns the system's own traffic. A classifier without
``proto`` and ``dport`` matches every protocol, so it lies in the TCP and the UDP space both.

For each of IPv4/IPv6 × TCP/UDP the area of the union of those boxes is computed exactly (a sweep
over the address boundaries, integers only). A plan whose union covers more than MAX_SHARE of one
such space marks effectively everything and is refused, naming the classifiers involved:
``0.0.0.0/1`` + ``128.0.0.0/1``, ``0.0.0.0/0`` and ``::/0`` with ``dport 1-65535``, a port range
with no ``daddr``, all-but-one prefixes. The largest private blocks stay far below it: RFC 1918's
three (10/8, 172.16/12, 192.168/16) are about 1/215 of IPv4, RFC 6598's 100.64/10 1/1024, and
RFC 4193's fc00::/7 1/128 of IPv6.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from fractions import Fraction

from tuners.dscp_classifier import Classifier
from wanprobe.errors import ConfigError

MAX_SHARE = Fraction(1, 16)  # of one family's (address × port) space for TCP or UDP
PORTS = (1, 65535)           # destination ports a TCP/UDP rule can match (port 0 is reserved)
MAX_CLASSIFIERS = 256        # bounds the sweep below (and the rules one plan installs)
MAX_PREFIXES = 4096
FAMILIES = ((4, "IPv4", 32), (6, "IPv6", 128))
SHOWN = 4                    # classifiers named in a refusal before "and N more"


def owner_narrowed(c: Classifier) -> bool:
    """A cgroup, or a uid other than root's: one job's traffic, not the host's."""
    return c["cgroup"] is not None or c["uid"] not in (None, 0)


def _ports(c: Classifier) -> tuple[int, int]:
    """The destination ports as a half-open interval [lo, hi + 1)."""
    if c["dport"] is None:
        return PORTS[0], PORTS[1] + 1
    lo, _, hi = c["dport"].partition("-")
    return int(lo), int(hi) + 1


def _boxes(spec: list[Classifier], version: int, bits: int,
           proto: str) -> list[tuple[int, int, tuple[int, int], int]]:
    """(first address, last address + 1, port interval, classifier index) per prefix of every
    classifier that marks ``proto`` traffic of this family and is not owner-narrowed."""
    out = []
    for i, c in enumerate(spec):
        if owner_narrowed(c) or c["proto"] not in (None, proto):
            continue
        nets = [ipaddress.ip_network(d) for d in c["daddr"]]
        mine = [n for n in nets if n.version == version]
        if nets and not mine:
            continue
        spans = [(int(n.network_address), int(n.broadcast_address) + 1) for n in mine] \
            or [(0, 1 << bits)]
        out += [(lo, hi, _ports(c), i) for lo, hi in spans]
    return out


def _union_length(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for lo, hi in sorted(intervals):
        if end is None or lo > end:
            total, end = total + hi - lo, hi
        elif hi > end:
            total, end = total + hi - end, hi
    return total


def covered(boxes: list[tuple[int, int, tuple[int, int], int]]) -> int:
    """Area of the union of the boxes (addresses × ports): a sweep over the address boundaries
    keeping a count per port interval, so overlapping classifiers are counted once."""
    events = sorted([(lo, 1, ports) for lo, _hi, ports, _i in boxes]
                    + [(hi, -1, ports) for _lo, hi, ports, _i in boxes])
    active: Counter[tuple[int, int]] = Counter()
    area, prev = 0, 0
    for x, delta, ports in events:
        if x > prev and active:
            area += (x - prev) * _union_length(list(active))
        prev = x
        active[ports] += delta
        if not active[ports]:
            del active[ports]
    return area


def describe(c: Classifier) -> str:
    """A classifier in a few words, as a refusal names it."""
    nets = c["daddr"]
    parts = [",".join(nets[:SHOWN]) + (f",+{len(nets) - SHOWN} more" if len(nets) > SHOWN else "")
             if nets else "any address"]
    parts.append(c["proto"] or ("tcp/udp" if c["dport"] else "any protocol"))
    parts.append(f"dport {c['dport']}" if c["dport"] else "any port")
    if c["uid"] == 0:
        parts.append("uid 0 (root: all system traffic)")
    return " ".join(parts)


def _named(spec: list[Classifier], indices: list[int]) -> str:
    shown = [f"#{i + 1} ({describe(spec[i])})" for i in indices[:SHOWN]]
    more = len(indices) - SHOWN
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def check_scope(spec: list[Classifier]) -> None:
    """Refuse (ConfigError, one line) a plan whose classifiers together mark more than MAX_SHARE
    of one family's TCP or UDP egress; also more classifiers or prefixes than the sweep takes."""
    if len(spec) > MAX_CLASSIFIERS:
        raise ConfigError(f"a dscp plan has at most {MAX_CLASSIFIERS} classifiers, got {len(spec)}")
    prefixes = sum(len(c["daddr"]) for c in spec)
    if prefixes > MAX_PREFIXES:
        raise ConfigError(f"a dscp plan has at most {MAX_PREFIXES} daddr prefixes, got {prefixes}")
    for version, family, bits in FAMILIES:
        for proto in ("tcp", "udp"):
            boxes = _boxes(spec, version, bits, proto)
            share = Fraction(covered(boxes), (1 << bits) * (PORTS[1] - PORTS[0] + 1))
            if share > MAX_SHARE:
                who = sorted({i for *_b, i in boxes})
                raise ConfigError(
                    f"dscp classifier{'s' if len(who) > 1 else ''} {_named(spec, who)} "
                    f"{'together mark' if len(who) > 1 else 'marks'} {float(share):.2%} of all "
                    f"{family} {proto.upper()} egress (never mark everything: at most "
                    f"{float(MAX_SHARE):.2%}); narrow by daddr, dport, a uid other than 0, or "
                    "cgroup")
