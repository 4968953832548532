"""Who may use the reflector, and which DSCP wanprobe may put on packets.

``AllowList`` is the ``reflect --allow CIDR`` / ``daemon.allow`` check that the STAMP reflector
and the throughput server make on the source address before they parse anything.

``DscpPolicy`` is the one DSCP policy (issue 19): what a Class-of-Service TLV (RFC 8972 §4.4) may
ask the reflector to mark its reply with, what a throughput client may ask the server's streams
to carry, and what a DSCP plan may mark. By default every code point except the network-control
range 48-63, so neither a remote client nor a plan can put bulk traffic in the class routers
protect for their own control plane; an operator allows them explicitly (``--cos-dscp``,
``daemon.cos_dscp``, ``tune --allow-network-control-dscp``). ``check_sent_dscp`` is the same
line for what this host's own probes and tests send (``probe``/``throughput``/``diagnose
--dscp``, ``probe.dscp``): no opt-in there.

Why 48-63 and not just CS6/CS7: RFC 4594 §3.1 reserves CS6 for network control and CS7 for
future network control, but a device that still classifies by IP precedence (RFC 791, the top
three TOS bits) reads the whole of 48-55 as precedence 6 (Internetwork Control) and 56-63 as
precedence 7 (Network Control) — RFC 2474 §4.2.2.2 keeps that mapping for compatibility — so
DSCP 49 or 62 lands in the same protected queue as CS6/CS7.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from wanprobe.errors import UsageError
from wanprobe.units import dscp_name, parse_dscp

NETWORK_CONTROL_DSCP = frozenset(range(48, 64))  # IP precedence 6 and 7 (RFC 791, RFC 2474 §4.2.2.2)
NETWORK_CONTROL_WHY = ("DSCP 48-63 are network control: IP precedence 6/7, RFC 791 and RFC 2474 "
                       "§4.2.2.2; CS6/CS7 in RFC 4594 §3.1")
DEFAULT_COS_DSCP = frozenset(range(64)) - NETWORK_CONTROL_DSCP
_CACHE_MAX = 65536


def parse_cidrs(texts: Iterable[str], option: str = "--allow") -> tuple[str, ...]:
    """Validate CIDRs (``198.18.0.0/15``, ``2001:db8::/32``, a bare address = one host); returns
    them normalised. One bad entry raises UsageError naming it."""
    out = []
    for text in texts:
        try:
            out.append(str(ipaddress.ip_network(str(text).strip(), strict=False)))
        except ValueError:
            shown = str(text)[:60]
            raise UsageError(f"{option} {shown!r} is not an IPv4/IPv6 network (e.g. "
                             "198.18.0.0/15)") from None
    return tuple(out)


def parse_dscp_set(texts: Iterable[str | int], option: str = "--cos-dscp") -> frozenset[int]:
    """DSCP names or numbers → a set of code points; one bad entry raises UsageError."""
    out = set()
    for text in texts:
        try:
            out.add(parse_dscp(text))
        except UsageError as exc:
            raise UsageError(f"{option}: {exc}") from None
    return frozenset(out)


class AllowList:
    """Source-address check; empty = everyone. IPv4-mapped IPv6 sources match IPv4 networks.
    Answers are cached per address string (bounded), so the per-packet cost is one dict lookup."""

    def __init__(self, cidrs: Iterable[str] = ()) -> None:
        self.networks = tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)
        self._cache: dict[str, bool] = {}

    def __bool__(self) -> bool:
        return bool(self.networks)

    def permits(self, address: str) -> bool:
        if not self.networks:
            return True
        hit = self._cache.get(address)
        if hit is not None:
            return hit
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        ok = any(ip.version == n.version and ip in n for n in self.networks)
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        self._cache[address] = ok
        return ok


class DscpPolicy:
    """The DSCP policy as a ``dscp_permitted`` callable (reflector, throughput server, tuner)."""

    def __init__(self, permitted: frozenset[int] = DEFAULT_COS_DSCP) -> None:
        self.permitted = frozenset(permitted)

    def __call__(self, dscp: int) -> bool:
        return dscp in self.permitted

    def refusal(self, dscp: int, what: str) -> str | None:
        """One line saying why ``dscp`` may not be used for ``what``, or None."""
        if dscp in self.permitted:
            return None
        why = f" ({NETWORK_CONTROL_WHY})" if dscp in NETWORK_CONTROL_DSCP else ""
        return f"{what}: DSCP {dscp_text(dscp)} is not permitted by this host's policy{why}"


def dscp_text(dscp: int) -> str:
    """``CS7 (56)`` for a named code point, ``62`` for one without a name."""
    name = dscp_name(dscp)
    return name if name == str(dscp) else f"{name} ({dscp})"


def check_sent_dscp(dscp: int, option: str = "--dscp") -> int:
    """``dscp`` if this host may send it on its own probes and tests, else one-line UsageError:
    never network control (48-63), whatever the far end would accept. Returns ``dscp``."""
    if dscp in NETWORK_CONTROL_DSCP:
        raise UsageError(f"{option} {dscp_text(dscp)} is refused: wanprobe does not "
                         f"send network-control DSCP ({NETWORK_CONTROL_WHY})")
    return dscp
