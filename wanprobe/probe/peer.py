"""Resolve a probe target to one address (numeric hosts never touch DNS)."""

from __future__ import annotations

import asyncio
import re
import socket

from wanprobe.errors import UsageError, shown

IP_HEADER_BYTES = {socket.AF_INET: 20, socket.AF_INET6: 40}


_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


def numeric_family(text: str) -> int | None:
    """AF_INET / AF_INET6 when ``text`` is an address in standard notation (inet_pton), else None."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, text)
            return family
        except (OSError, ValueError):  # ValueError: an embedded NUL
            pass
    return None


def check_peer(peer: str) -> str:
    """``peer`` stripped, if it is an address (inet_pton) or a DNS name (RFC 1123 §2.1: labels
    of 1-63 letters, digits and hyphens, 253 characters in all, the last label not all-numeric);
    else UsageError. glibc would otherwise read "65536" as the address 0.1.0.0 (inet_aton's
    shorthand) and a 200 kB name would fail deep in the IDNA codec."""
    text = str(peer).strip().strip("[]")
    if not text:
        raise UsageError("empty host name")
    if numeric_family(text) is not None:
        return text
    labels = text.rstrip(".").split(".")
    if (len(text) > 253 or not all(_LABEL.fullmatch(label) for label in labels)
            or labels[-1].isdigit()):
        raise UsageError(f"unknown host {shown(peer)}: not an IP address or a host name")
    return text


async def resolve_peer(peer: str) -> tuple[int, str]:
    """Return (family, address) for ``peer``; UsageError naming it when it does not resolve."""
    text = check_peer(peer)
    family = numeric_family(text)
    if family is not None:
        return family, text
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(text, None, type=socket.SOCK_DGRAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"unknown host {shown(peer)}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    family, _t, _p, _c, sockaddr = infos[0]
    return family, sockaddr[0]


NO_REPLY = "no reply"
PORT_UNREACHABLE = "port unreachable (ICMP error)"


async def udp_silence_reason(peer: str, port: int, timeout_s: float) -> str:
    """Why a UDP peer sent nothing back: PORT_UNREACHABLE when one datagram to ``peer``:``port``
    from a connected socket draws an ICMP port unreachable (the kernel reports it as
    ECONNREFUSED on a connected UDP socket, RFC 1122 §4.1.3.3 / udp(7)), else NO_REPLY."""
    family, addr = await resolve_peer(peer)
    loop = asyncio.get_running_loop()
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        try:
            sock.connect((addr, port))
            sock.send(bytes(44))  # the size of an unauthenticated STAMP test packet (RFC 8762)
            await asyncio.wait_for(loop.sock_recv(sock, 64), min(timeout_s, 2.0))
        except ConnectionRefusedError:
            return PORT_UNREACHABLE
        except (OSError, TimeoutError):
            return NO_REPLY
    return NO_REPLY
