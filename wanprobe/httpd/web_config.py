"""The listener's TLS and authentication, read from a web config file in the Prometheus
exporter-toolkit format (``--web.config.file`` of node_exporter; exporter-toolkit
``docs/web-configuration.md``), so one file and one scrape config serve both:

.. code-block:: yaml

    tls_server_config:
      cert_file: server.crt          # relative paths: from this file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # or NoClientCert, VerifyClientCertIfGiven
      client_ca_file: clients-ca.crt
      client_allowed_sans: [prometheus.example]      # optional: a client cert must name one
      min_version: TLS12             # TLS10 … TLS13 (default TLS12, as exporter-toolkit)
      max_version: TLS13
    basic_auth_users:
      prometheus: $2b$12$…           # bcrypt only (`htpasswd -nBC 12 prometheus`)
    http_server_config:
      headers:
        Strict-Transport-Security: max-age=31536000

TLS is Python's ``ssl`` (OpenSSL); passwords are checked with ``bcrypt`` — no crypto here.
What exporter-toolkit accepts and this listener cannot honour is refused in one line, not
ignored: ``RequestClientCert`` and ``RequireAnyClientCert`` (a client certificate asked for but not
verified: OpenSSL verifies every certificate it asks for), ``cipher_suites``,
``curve_preferences`` and ``prefer_server_cipher_suites`` (Go's names; OpenSSL chooses), inline
``cert``/``key``/``client_ca``. ``http2`` is accepted and has no effect: the listener speaks
HTTP/1.1 (no ALPN ``h2``), which Prometheus falls back to. Every problem is one line naming its
key; ``load_web_config`` raises :class:`ConfigInvalid` with all of them.
"""

from __future__ import annotations

import re
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from wanprobe.errors import ConfigInvalid, shown
from wanprobe.userfiles import read_text

MAX_WEB_CONFIG_BYTES = 1 << 20
MAX_PEM_BYTES = 1 << 20
# $2a$/$2b$/$2y$, a two-digit cost, 22 characters of salt and 31 of hash (bcrypt's modular
# crypt format; htpasswd -B writes $2y$)
BCRYPT_HASH = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
UNSUPPORTED_AUTH = ("RequestClientCert", "RequireAnyClientCert")
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "client_allowed_sans",
            "min_version", "max_version"}
TLS_UNSUPPORTED = {"cipher_suites", "curve_preferences", "prefer_server_cipher_suites", "cert",
                   "key", "client_ca"}
# the headers exporter-toolkit lets http_server_config.headers set (web/handler.go)
HEADERS = ("Strict-Transport-Security", "X-Content-Type-Options", "X-Frame-Options",
           "X-XSS-Protection", "Content-Security-Policy")


@dataclass(frozen=True)
class WebConfig:
    """What the listener enforces. ``ssl_context`` None: plain HTTP; ``users`` empty: no basic
    auth. ``source`` names the file (empty: the built-in open listener)."""

    ssl_context: ssl.SSLContext | None = None
    users: tuple[tuple[str, bytes], ...] = ()     # (name, bcrypt hash)
    allowed_sans: frozenset[str] = frozenset()
    headers: tuple[tuple[str, str], ...] = ()
    client_auth: str = "NoClientCert"
    source: str = ""

    @property
    def secured(self) -> bool:
        return self.ssl_context is not None or bool(self.users)

    def hash_of(self, user: str) -> bytes | None:
        return dict(self.users).get(user)

    def describe(self) -> str:
        parts = ["TLS" if self.ssl_context else "plain HTTP"]
        if self.client_auth != "NoClientCert":
            parts.append(f"client certificates ({self.client_auth})")
        if self.users:
            parts.append(f"basic auth ({len(self.users)} user(s))")
        return ", ".join(parts)


OPEN = WebConfig()


def load_web_config(path: Path | str | None) -> WebConfig:
    """Read and check ``path`` (None: the open listener); build the TLS context now, so a
    certificate that does not load is a problem at ``--check`` and at SIGHUP, not at a scrape."""
    if path is None:
        return OPEN
    path = Path(path)
    label = f"web_config_file {path}"
    try:
        data = yaml.safe_load(read_text(path, "web_config_file", MAX_WEB_CONFIG_BYTES))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigInvalid(label, [f"not valid YAML{where}"]) from None
    except RecursionError:  # PyYAML's composer recurses per nesting level
        raise ConfigInvalid(label, ["not valid YAML: nested too deeply"]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigInvalid(label, ["must be a YAML mapping (tls_server_config, "
                                    "basic_auth_users, http_server_config)"])
    problems: list[str] = []
    for key in data:
        if key not in ("tls_server_config", "basic_auth_users", "http_server_config"):
            problems.append(f"{shown(key)}: unknown key (known: basic_auth_users, "
                            "http_server_config, tls_server_config)")
    tls = _tls(_mapping(data, "tls_server_config", problems), path.parent, problems)
    users = _users(_mapping(data, "basic_auth_users", problems), problems)
    headers = _headers(_mapping(data, "http_server_config", problems), problems)
    if problems:
        raise ConfigInvalid(label, problems)
    context, client_auth, sans = tls
    return WebConfig(context, users, sans, headers, client_auth, str(path))


def _mapping(data: dict, key: str, problems: list[str]) -> dict:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{key}: must be a mapping")
        return {}
    return value


def _string(t: dict, key: str, where: str, problems: list[str]) -> str | None:
    value = t.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        problems.append(f"{where}.{key}: must be a string, not {shown(value)}")
        return None
    return value


def _tls(t: dict, base: Path, problems: list[str]
         ) -> tuple[ssl.SSLContext | None, str, frozenset[str]]:
    """The server context of ``tls_server_config`` (None when the table is absent)."""
    where = "tls_server_config"
    for key in t:
        if key in TLS_UNSUPPORTED:
            problems.append(f"{where}.{key}: not supported by this listener (OpenSSL chooses "
                            "ciphers and curves; give certificates as files)")
        elif key not in TLS_KEYS:
            problems.append(f"{where}.{shown(key)}: unknown key (known: {', '.join(sorted(TLS_KEYS))})")
    if not t:
        return None, "NoClientCert", frozenset()
    files = {k: _string(t, k, where, problems) for k in ("cert_file", "key_file", "client_ca_file")}
    paths = {k: (base / v if v else None) for k, v in files.items()}
    auth = _string(t, "client_auth_type", where, problems) or "NoClientCert"
    if auth in UNSUPPORTED_AUTH:
        problems.append(f"{where}.client_auth_type: {auth} asks for a certificate without "
                        "verifying it, which OpenSSL does not do; use VerifyClientCertIfGiven "
                        "or RequireAndVerifyClientCert with client_ca_file")
    elif auth not in CLIENT_AUTH:
        problems.append(f"{where}.client_auth_type: {shown(auth)} is not one of "
                        f"{', '.join(CLIENT_AUTH)}")
    elif auth != "NoClientCert" and paths["client_ca_file"] is None:
        problems.append(f"{where}.client_ca_file: required with client_auth_type {auth}")
    sans = t.get("client_allowed_sans") or []
    if not isinstance(sans, list) or not all(isinstance(s, str) for s in sans):
        problems.append(f"{where}.client_allowed_sans: must be a list of names")
        sans = []
    elif sans and auth == "NoClientCert":
        problems.append(f"{where}.client_allowed_sans: needs client certificates "
                        "(client_auth_type)")
    versions = [_version(t, k, problems) for k in ("min_version", "max_version")]
    if paths["cert_file"] is None or paths["key_file"] is None:
        problems.append(f"{where}: cert_file and key_file are both required for TLS")
        return None, auth, frozenset(sans)
    if problems:
        return None, auth, frozenset(sans)
    return _context(paths, auth, versions, problems), auth, frozenset(sans)


def _version(t: dict, key: str, problems: list[str]) -> ssl.TLSVersion | None:
    value = t.get(key)
    if value is None:
        return None
    if value not in TLS_VERSIONS:
        problems.append(f"tls_server_config.{key}: {shown(value)} is not one of "
                        f"{', '.join(TLS_VERSIONS)}")
        return None
    return TLS_VERSIONS[value]


def _context(paths: dict[str, Path | None], auth: str, versions: list, problems: list[str]
             ) -> ssl.SSLContext | None:
    for key, path in paths.items():
        why = _not_pem_file(path)
        if why:
            problems.append(f"tls_server_config.{key} {path}: {why}")
    if problems:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    low, high = versions
    try:
        ctx.minimum_version = low or ssl.TLSVersion.TLSv1_2   # exporter-toolkit's default
        if high is not None:
            ctx.maximum_version = high
    except (ValueError, ssl.SSLError) as exc:
        problems.append(f"tls_server_config.min_version: {exc}")
        return None
    if high is not None and ctx.maximum_version < ctx.minimum_version:
        problems.append("tls_server_config.max_version: below min_version")
        return None
    try:
        ctx.load_cert_chain(paths["cert_file"], paths["key_file"])
    except (OSError, ssl.SSLError, ValueError) as exc:
        problems.append(f"tls_server_config.cert_file/key_file {paths['cert_file']}, "
                        f"{paths['key_file']}: {_why(exc)}")
        return None
    ctx.verify_mode = CLIENT_AUTH.get(auth, ssl.CERT_NONE)
    if ctx.verify_mode != ssl.CERT_NONE:
        try:
            ctx.load_verify_locations(cafile=paths["client_ca_file"])
        except (OSError, ssl.SSLError, ValueError) as exc:
            problems.append(f"tls_server_config.client_ca_file {paths['client_ca_file']}: "
                            f"{_why(exc)}")
            return None
    return ctx


def _not_pem_file(path: Path | None) -> str | None:
    """Why ``path`` cannot be a PEM file to hand OpenSSL (None: it can): a device or FIFO
    would be read without end (``/dev/zero``), a huge file whole."""
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError as exc:
        return exc.strerror or str(exc)
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_size > MAX_PEM_BYTES:
        return f"{st.st_size} bytes, more than a PEM file holds ({MAX_PEM_BYTES})"
    return None


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, ssl.SSLError):
        return exc.strerror
    if isinstance(exc, ssl.SSLError) and (exc.reason in ("PEM_LIB", "NO_START_LINE")
                                          or "PEM lib" in str(exc)):
        return "not a PEM certificate and its key"
    if isinstance(exc, ssl.SSLError) and exc.reason == "KEY_VALUES_MISMATCH":
        return "the key is not the certificate's"
    return getattr(exc, "reason", None) or str(exc) or type(exc).__name__


def _users(t: dict, problems: list[str]) -> tuple[tuple[str, bytes], ...]:
    users = []
    for name, value in t.items():
        if not isinstance(name, str) or not name or ":" in name:
            problems.append(f"basic_auth_users.{shown(name)}: a user name is a non-empty "
                            "string without ':' (RFC 7617)")
        elif not isinstance(value, str) or not BCRYPT_HASH.fullmatch(value):
            problems.append(f"basic_auth_users.{name}: not a bcrypt hash ($2a$/$2b$/$2y$, "
                            "e.g. `htpasswd -nBC 12 USER`); plain or other hashes are refused")
        else:
            users.append((name, value.encode("ascii")))
    return tuple(users)


def _headers(t: dict, problems: list[str]) -> tuple[tuple[str, str], ...]:
    for key in t:
        if key not in ("headers", "http2"):
            problems.append(f"http_server_config.{shown(key)}: unknown key (known: headers, http2)")
    if "http2" in t and not isinstance(t["http2"], bool):
        problems.append("http_server_config.http2: must be true or false")
    headers = t.get("headers") or {}
    if not isinstance(headers, dict):
        problems.append("http_server_config.headers: must be a mapping")
        return ()
    out = []
    allowed = {h.lower(): h for h in HEADERS}
    for name, value in headers.items():
        if not isinstance(name, str) or name.lower() not in allowed:
            problems.append(f"http_server_config.headers.{shown(name)}: not settable "
                            f"(settable: {', '.join(HEADERS)})")
        elif not isinstance(value, str) or any(ord(c) < 32 or ord(c) == 127 for c in value):
            problems.append(f"http_server_config.headers.{name}: must be one line of text")
        else:
            out.append((allowed[name.lower()], value))
    return tuple(out)


def peer_sans(cert: dict[str, Any] | None) -> set[str]:
    """The DNS names, IP addresses and URIs of a verified peer certificate
    (``SSLSocket.getpeercert()``'s ``subjectAltName``)."""
    return {value for _kind, value in (cert or {}).get("subjectAltName", ())}
