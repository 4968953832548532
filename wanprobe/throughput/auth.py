"""Challenge-response on the throughput control channel (protocol v2).

The same shared key as authenticated STAMP (RFC 8762 §4.4) proves the client to the server and
the server to the client; the key itself never crosses the wire. The handshake:

    client → server   hello{version, nonce: Nc}            (16 random octets, hex)
    server → client   challenge{version, nonce: Ns, auth}   (auth: does the server hold a key)
    client → server   <op>{..., mac}                        mac = HMAC-SHA-256(K, "wanprobe-control-v2
                                                            request" ‖ Ns ‖ Nc ‖ canonical(<op> without mac))
    server → client   accepted{..., mac}                    mac = HMAC-SHA-256(K, "... accept" ‖ Ns ‖ Nc ‖
                                                            canonical(accepted without mac))

HMAC-SHA-256 is RFC 2104 with SHA-256 (FIPS 180-4), as in RFC 4868. Ns is fresh for every
connection, so a recorded request replayed on a new connection carries a MAC over the old Ns and
fails; Nc does the same for a recorded ``accepted``. ``canonical`` is the JSON text with sorted
keys and no spaces; both ends compute it from the parsed object, so the MAC covers every field of
the request (the test's duration, bytes, streams ...), not its formatting.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os

NONCE_BYTES = 16
_REQUEST_LABEL = b"wanprobe-control-v2 request"
_ACCEPT_LABEL = b"wanprobe-control-v2 accept"


def new_nonce() -> str:
    return os.urandom(NONCE_BYTES).hex()


def parse_nonce(value: object) -> bytes | None:
    """The 16-octet nonce from its hex text, or None when it is anything else."""
    if not isinstance(value, str) or len(value) != 2 * NONCE_BYTES:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return None


def canonical(msg: dict) -> bytes:
    """The bytes a MAC covers: ``msg`` without its ``mac``, sorted keys, no whitespace."""
    body = {k: v for k, v in msg.items() if k != "mac"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _mac(key: bytes, label: bytes, server_nonce: bytes, client_nonce: bytes, msg: dict) -> str:
    return hmac.new(key, label + server_nonce + client_nonce + canonical(msg),
                    hashlib.sha256).hexdigest()


def sign_request(key: bytes, server_nonce: bytes, client_nonce: bytes, msg: dict) -> dict:
    return {**msg, "mac": _mac(key, _REQUEST_LABEL, server_nonce, client_nonce, msg)}


def sign_accept(key: bytes, server_nonce: bytes, client_nonce: bytes, msg: dict) -> dict:
    return {**msg, "mac": _mac(key, _ACCEPT_LABEL, server_nonce, client_nonce, msg)}


def _verify(key: bytes, label: bytes, server_nonce: bytes, client_nonce: bytes, msg: dict) -> bool:
    got = msg.get("mac")
    if not isinstance(got, str):
        return False
    want = _mac(key, label, server_nonce, client_nonce, msg)
    return hmac.compare_digest(want.encode(), got.encode("utf-8", "replace"))


def verify_request(key: bytes, server_nonce: bytes, client_nonce: bytes, msg: dict) -> bool:
    return _verify(key, _REQUEST_LABEL, server_nonce, client_nonce, msg)


def verify_accept(key: bytes, server_nonce: bytes, client_nonce: bytes, msg: dict) -> bool:
    return _verify(key, _ACCEPT_LABEL, server_nonce, client_nonce, msg)
