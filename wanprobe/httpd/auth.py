"""HTTP Basic authentication (RFC 7617) against the web config's bcrypt hashes.

bcrypt is slow on purpose (cost 12: ~0.25 s of one core), so a listener that ran it inline for
every request would hand its CPU, and the event loop, to anyone who sends a wrong password. Here:

- ``bcrypt.checkpw`` runs in a worker thread, ``CONCURRENT`` at a time: the loop keeps serving;
- each verdict is cached by a SHA-256 of the credentials (successes and failures, ``CACHE``
  entries, oldest dropped first), so Prometheus's scrape every 15 s costs one bcrypt per user
  per reload, not one per scrape, as exporter-toolkit caches its own (web/handler.go);
- an unknown user is checked against a fixed hash of the same cost, so the time taken does not
  tell which users exist (exporter-toolkit does the same).

A waiting check holds no slot the server would not preempt (server.py marks it
``queued``): wrong passwords from many sources can queue, not deny the scrape a slot.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
from collections import OrderedDict

import bcrypt

from wanprobe.httpd.web_config import WebConfig

CONCURRENT = 1
CACHE = 1024
# a fixed hash for unknown users: same cost as the configured ones, so timing tells nothing
_DUMMY_PASSWORD = b"wanprobe: no such user"


class BasicAuth:
    """``await check(header)`` → the user name, or None when the request must get 401."""

    def __init__(self, web: WebConfig) -> None:
        self.users = dict(web.users)
        self._cache: OrderedDict[bytes, str | None] = OrderedDict()
        self._sem = asyncio.Semaphore(CONCURRENT)
        self._cost = max((int(h[4:6]) for h in self.users.values()), default=4)
        self._dummy: bytes | None = None  # made on first use, in the worker thread, not the loop

    async def check(self, header: str | None) -> str | None:
        creds = parse_basic(header)
        if creds is None:
            return None
        user, password = creds
        key = hashlib.sha256(user.encode() + b"\0" + password).digest()
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]  # the key covers the user name: a hit is this user's verdict
        async with self._sem:
            ok = await asyncio.to_thread(self._verify, user, password)
        self._cache[key] = user if ok else None
        while len(self._cache) > CACHE:
            self._cache.popitem(last=False)
        return user if ok else None

    def _verify(self, user: str, password: bytes) -> bool:
        hashed = self.users.get(user)
        try:
            if hashed is None:
                if self._dummy is None:
                    self._dummy = bcrypt.hashpw(_DUMMY_PASSWORD, bcrypt.gensalt(self._cost))
                bcrypt.checkpw(password, self._dummy)
                return False
            return bcrypt.checkpw(password, hashed)
        except ValueError:  # a password bcrypt cannot take (NUL byte)
            return False


def parse_basic(header: str | None) -> tuple[str, bytes] | None:
    """``Basic base64(user:password)`` → (user, password bytes); None for anything else."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic" or not token or len(token) > 1024:
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    try:
        name = user.decode("utf-8")
    except UnicodeDecodeError:
        return None
    # bcrypt reads at most 72 bytes (bcrypt 5 refuses more): longer passwords never match
    return (name, password) if len(password) <= 72 else (name, b"\0")
