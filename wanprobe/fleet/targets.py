"""Prometheus ``file_sd_configs`` targets for every daemon in a mesh file, and the scrape job
that reaches them when their listener is secured.

The format is a JSON list of ``{"targets": ["host:port"], "labels": {...}}`` groups
(https://prometheus.io/docs/prometheus/latest/configuration/configuration/#file_sd_config).
Each daemon is its own group so it carries its ``site`` and ``host``; these are target labels,
not ``src_site``/``src_host``, because a target label that a scraped series also carries is
renamed ``exported_*`` (honor_labels: false), and every path series already has ``src_*``.

A daemon with ``web_config_file`` (exporter-toolkit format: TLS, client certificates, bcrypt
basic auth) is scraped with ``scheme``, ``tls_config`` and ``basic_auth`` — settings of the
scrape job, which a file_sd group cannot carry — so :func:`scrape_config` writes the whole job
(``scrape_configs`` of prometheus.yml; ``promtool check config`` reads it as it is).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from wanprobe.errors import UsageError, shown
from wanprobe.mesh.topology import Mesh

# an RFC 1123 host name (a certificate's DNS SAN; Go's crypto/tls compares it as one)
_HOST_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?"
                        r"(\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*\.?")
_MAX_PATH = 4096


def host_port(address: str, port: int) -> str:
    """``10.0.0.1:9862`` or ``[2001:db8::1]:9862`` (RFC 3986 §3.2.2 brackets IPv6)."""
    return f"[{address}]:{port}" if ipaddress.ip_address(address).version == 6 else f"{address}:{port}"


def file_sd(mesh: Mesh, *, site: str | None = None) -> list[dict[str, Any]]:
    """One target group per daemon (of ``site`` only, if given), in mesh order."""
    return [{"targets": [host_port(h.address, h.metrics_port)],
             "labels": {"site": h.site, "host": h.name}}
            for h in mesh.hosts if site is None or h.site == site]


@dataclass(frozen=True)
class ScrapeAuth:
    """How Prometheus reaches a secured listener: files on the Prometheus host, as its
    scrape_config names them (``tls_config``, ``basic_auth``; the password never inline)."""

    scheme: str = "http"
    ca_file: str | None = None        # the CA that signed the daemons' certificates
    server_name: str | None = None    # the name their certificates carry, if not the mesh address
    cert_file: str | None = None      # Prometheus's client certificate (client_auth_type)
    key_file: str | None = None
    username: str | None = None       # a user of basic_auth_users
    password_file: str | None = None

    @property
    def secured(self) -> bool:
        return self != ScrapeAuth()


def _absolute(option: str, path: str | None) -> None:
    if path is None:
        return
    if not path.startswith("/") or len(path) > _MAX_PATH or not path.isprintable():
        raise UsageError(f"{option}: {shown(path)} must be an absolute path on the Prometheus "
                         "host (Prometheus resolves a relative one against its config file)")


def check_scrape_auth(a: ScrapeAuth) -> None:
    """The options in the form Prometheus needs them, each refused with one line."""
    if a.scheme not in ("http", "https"):
        raise UsageError(f"--scheme: {shown(a.scheme)} is not http or https")
    tls = {"--ca-file": a.ca_file, "--server-name": a.server_name,
           "--client-cert": a.cert_file, "--client-key": a.key_file}
    if a.scheme == "http":
        given = [o for o, v in tls.items() if v is not None]
        if given:
            raise UsageError(f"{given[0]} is a TLS setting: add --scheme https (the daemon's "
                             "web config has tls_server_config)")
        if a.username is not None:
            raise UsageError("--basic-auth-user needs --scheme https: over http the password "
                             "crosses the network in clear")
    if (a.cert_file is None) != (a.key_file is None):
        raise UsageError("--client-cert and --client-key go together (Prometheus's client "
                         "certificate and its key)")
    if (a.username is None) != (a.password_file is None):
        raise UsageError("--basic-auth-user and --password-file go together (the password "
                         "stays in a file on the Prometheus host)")
    if a.username is not None and (not a.username or ":" in a.username
                                   or not a.username.isprintable() or len(a.username) > 256):
        raise UsageError(f"--basic-auth-user: {shown(a.username)} is not a user name "
                         "(printable, without ':', RFC 7617 §2)")
    if a.server_name is not None and not _is_host(a.server_name):
        raise UsageError(f"--server-name: {shown(a.server_name)} is not a host name or address")
    for option, path in (("--ca-file", a.ca_file), ("--client-cert", a.cert_file),
                         ("--client-key", a.key_file), ("--password-file", a.password_file)):
        _absolute(option, path)


def _is_host(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return bool(_HOST_NAME.fullmatch(name))


def _tls_config(a: ScrapeAuth) -> dict[str, str]:
    pairs = (("ca_file", a.ca_file), ("cert_file", a.cert_file), ("key_file", a.key_file),
             ("server_name", a.server_name))
    return {k: v for k, v in pairs if v is not None}


def scrape_config(mesh: Mesh, *, job: str, auth: ScrapeAuth, site: str | None = None,
                  targets_file: str | None = None) -> dict[str, Any]:
    """A prometheus.yml fragment, ``scrape_configs`` with one job: the daemons from
    ``targets_file`` (file_sd, as ``fleet targets`` writes it; Prometheus re-reads it) or, without
    one, the same groups inline; ``scheme``, ``tls_config`` and ``basic_auth`` from ``auth``."""
    check_scrape_auth(auth)
    _absolute("--targets-file", targets_file)
    job_doc: dict[str, Any] = {"job_name": job, "scheme": auth.scheme}
    if _tls_config(auth):
        job_doc["tls_config"] = _tls_config(auth)
    if auth.username is not None:
        job_doc["basic_auth"] = {"username": auth.username, "password_file": auth.password_file}
    if targets_file is not None:
        job_doc["file_sd_configs"] = [{"files": [targets_file]}]
    else:
        job_doc["static_configs"] = file_sd(mesh, site=site)
    return {"scrape_configs": [job_doc]}
