"""Resolve a probe target to one address (numeric hosts never touch DNS)."""

from __future__ import annotations

import asyncio
import socket

from wanprobe.errors import UsageError

IP_HEADER_BYTES = {socket.AF_INET: 20, socket.AF_INET6: 40}


async def resolve_peer(peer: str) -> tuple[int, str]:
    """Return (family, address) for ``peer``; UsageError naming it when it does not resolve."""
    text = str(peer).strip().strip("[]")
    if not text:
        raise UsageError("empty host name")
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, text)
            return family, text
        except OSError:
            pass
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(text, None, type=socket.SOCK_DGRAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"unknown host {peer!r}: {getattr(exc, 'strerror', None) or exc}") from None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    family, _t, _p, _c, sockaddr = infos[0]
    return family, sockaddr[0]
