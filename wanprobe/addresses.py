"""Which addresses count as one source: the unit the STAMP reflector's session shares
(probe/session_table.py) and the HTTP listener's per-source connection limit (httpd/server.py)
are kept per."""

from __future__ import annotations

import socket


def source_group(address: str) -> str | bytes:
    """The share ``address`` counts against: an IPv4 address itself (a v4-mapped IPv6 address,
    from a dual-stack socket, as its IPv4 address); an IPv6 address's /64. One host may use any
    address of its /64 (RFC 4291 §2.5.4 64-bit interface identifiers; RFC 8981 temporary
    addresses), so per IPv6 address one host could hold a whole table."""
    if ":" not in address:
        return address
    if address.startswith("::ffff:") and "." in address:
        return address[7:]
    try:
        return socket.inet_pton(socket.AF_INET6, address.split("%", 1)[0])[:8]
    except OSError:
        return address
