"""A throwaway CA, server and client certificates made by the `openssl` command line (Debian's
openssl), and a web config file in the exporter-toolkit format, for the listener's TLS tests."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import bcrypt

PASSWORD = "scrape-secret"


@dataclass(frozen=True)
class Certs:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _leaf(d: Path, name: str, san: str, usage: str) -> None:
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n"
                   "basicConstraints=critical,CA:FALSE\n")
    _run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    _run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
         "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", ext.name, cwd=d)


def make_certs(d: Path, server_sans: str = "IP:127.0.0.1,DNS:localhost") -> Certs:
    d.mkdir(parents=True, exist_ok=True)
    _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=wanprobe test CA",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    _leaf(d, "server", server_sans, "serverAuth")
    _leaf(d, "client", "DNS:prometheus.test", "clientAuth")
    return Certs(d, d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt",
                 d / "client.key")


def bcrypt_hash(password: str = PASSWORD, cost: int = 4) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()


def web_config(path: Path, certs: Certs | None, *, users: dict[str, str] | None = None,
               client_auth: str | None = None, extra_tls: str = "", extra: str = "") -> Path:
    """Write ``path``: TLS with ``certs`` (relative file names), ``users`` {name: hash}."""
    lines = []
    if certs is not None:
        lines += ["tls_server_config:", f"  cert_file: {certs.server_cert}",
                  f"  key_file: {certs.server_key}"]
        if client_auth:
            lines += [f"  client_auth_type: {client_auth}", f"  client_ca_file: {certs.ca}"]
        lines += [f"  {ln}" for ln in extra_tls.splitlines() if ln]
    if users:
        lines.append("basic_auth_users:")
        lines += [f"  {name}: '{h}'" for name, h in users.items()]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path
