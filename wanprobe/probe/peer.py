"""Resolve a probe target to one address (numeric hosts never touch DNS)."""

from __future__ import annotations

import asyncio
import re
import socket

from wanprobe.errors import PeerLimit, UsageError, WanprobeError, shown

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
ANSWERS_UNSIGNED = "answers unauthenticated probes"


async def udp_silence_reason(peer: str, port: int, timeout_s: float) -> str:
    """Why a UDP peer sent nothing back: PORT_UNREACHABLE when one datagram to ``peer``:``port``
    from a connected socket draws an ICMP port unreachable (the kernel reports it as
    ECONNREFUSED on a connected UDP socket, RFC 1122 §4.1.3.3 / udp(7)); ANSWERS_UNSIGNED when
    that datagram, an unauthenticated STAMP test packet, is answered (a reflector in
    authenticated mode drops it unanswered, RFC 8762 §4.4, so whoever answers runs without a
    key); else NO_REPLY."""
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
    return ANSWERS_UNSIGNED


def silence_line(where: str, reason: str, *, keyed: bool, lead: str = "no reply from") -> str:
    """The one line for a STAMP peer that answered none of a run's probes (``where``: "HOST port
    N"; ``reason``: :func:`udp_silence_reason`; ``keyed``: the probes carried an HMAC).

    A reflector in authenticated mode drops unsigned probes without a word (RFC 8762 §4.4), and
    one without a key cannot answer signed probes in a form the sender accepts, so silence from
    an open port is most often a key mismatch: the line says which way. Callers say it only
    when nothing came back; a run with some replies has loss, not a key problem."""
    head = f"{lead} {where}"
    if reason == PORT_UNREACHABLE:
        return f"{head}: {PORT_UNREACHABLE}: no reflector listens there"
    if keyed and reason == ANSWERS_UNSIGNED:
        return (f"{head} to authenticated probes, but it answers unauthenticated ones: its "
                "reflector runs without a key, so the key may not match (probe without "
                "--hmac-key-file, or give the reflector the same key)")
    if keyed:
        return (f"{head} to authenticated probes: the key may not match its reflector's "
                "--hmac-key-file (else the reflector is down or the probes are filtered)")
    if reason == ANSWERS_UNSIGNED:
        return (f"{head} during the run, though it answered a probe sent after it: the path or "
                "the reflector dropped every probe of the run")
    return (f"{head}: if its reflector runs with --hmac-key-file, pass the same key "
            "(--hmac-key-file); else the reflector is down or the probes are filtered")


def session_refused(host: str, port: int, refused: int, sent: int) -> PeerLimit:
    """The exit-8 error of a STAMP run whose reflector refused ``refused`` of ``sent`` probes a
    session (the Reflector Report TLV's session-refused flag, issue 37): a refusal under its
    limits, not path loss. ``probe``, ``probe --flows`` and ``paths`` raise it after printing
    what the other probes measured."""
    return PeerLimit(f"{host} port {port}: its reflector refused a STAMP session to {refused:,} "
                     f"of {sent:,} probes (its session table had no room: a flood, or this "
                     "source's share of it full); not counted as path loss")


def no_reply(host: str, method: str, kw: dict) -> WanprobeError:
    """The exit-1 error of a run nothing answered (as ping(8)), saying why. For STAMP, what the
    port's silence says (:func:`udp_silence_reason`) and whether a key is the likely cause
    (:func:`silence_line`: a keyed reflector drops unsigned probes unanswered, RFC 8762 §4.4);
    ``probe``, ``probe --flows`` and ``paths`` raise it only when zero replies came back."""
    where = f"{host}" if method == "icmp" else f"{host} port {kw['port']}"
    if method != "stamp":
        return WanprobeError(f"no probe to {where} was answered: {NO_REPLY}", exit_code=1)
    reason = asyncio.run(udp_silence_reason(host, kw["port"], kw["timeout_s"]))
    return WanprobeError(silence_line(where, reason, keyed=kw.get("hmac_key") is not None),
                         exit_code=1)
