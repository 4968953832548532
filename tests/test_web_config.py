"""Issue 37: the daemon's listener under a web config in the exporter-toolkit format — TLS from
Python's ssl, client certificates, bcrypt basic auth, headers — and the file's checks, one line
per problem. Loopback only, in process; certificates from Debian's openssl."""

from __future__ import annotations

import base64
import socket
import ssl
import time
import urllib.error
import urllib.request

import pytest
from reflector_helpers import Served
from tls_certs import PASSWORD, bcrypt_hash, make_certs, web_config

from wanprobe.errors import ConfigInvalid
from wanprobe.httpd.web_config import load_web_config


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def serve(web, open_paths=frozenset()):
    from wanprobe.httpd.server import BoundedHttpServer, Response

    def make():
        srv = BoundedHttpServer(name="test", web=web, open_paths=open_paths)
        srv.route("/metrics", lambda _r: Response(200, b"up 1\n"))
        srv.route("/healthz", lambda _r: Response(200, b"ok\n"))
        return srv
    return Served(make)


def fetch(port, path="/metrics", *, ca=None, user=None, password=PASSWORD, cert=None):
    ctx = ssl.create_default_context(cafile=str(ca)) if ca else None
    if ctx and cert:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    req = urllib.request.Request(f"{'https' if ca else 'http'}://127.0.0.1:{port}{path}")
    if user:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def port_of(server) -> int:
    return server._lsock.getsockname()[1]


def test_tls_and_basic_auth_on_every_route_but_the_open_ones(certs, tmp_path):
    path = web_config(tmp_path / "web.yml", certs, users={"prometheus": bcrypt_hash()},
                      extra="http_server_config:\n  headers:\n"
                            "    Strict-Transport-Security: max-age=31536000\n")
    web = load_web_config(path)
    assert web.secured and "TLS" in web.describe() and "basic auth" in web.describe()
    with serve(web, open_paths=frozenset({"/healthz"})) as server:
        port = port_of(server)
        status, body, headers = fetch(port, ca=certs.ca, user="prometheus")
        assert (status, body) == (200, b"up 1\n")
        assert headers["Strict-Transport-Security"] == "max-age=31536000"
        status, _, headers = fetch(port, ca=certs.ca)                   # no password
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic ")
        assert fetch(port, ca=certs.ca, user="prometheus", password="wrong")[0] == 401
        assert fetch(port, ca=certs.ca, user="nobody")[0] == 401
        assert fetch(port, "/healthz", ca=certs.ca)[0] == 200            # open when configured
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # plain HTTP
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            try:
                while chunk := s.recv(4096):
                    got += chunk
            except ConnectionResetError:
                pass
        assert b"up 1" not in got and not got.startswith(b"HTTP/1.1 200")
        deadline = time.monotonic() + 5
        while server.active and time.monotonic() < deadline:  # its task ends after the close
            time.sleep(0.05)
        assert server.stats()["tls_failed"] == 1 and server.stats()["unauthorized"] == 3


def test_client_certificates_required_and_named(certs, tmp_path):
    path = web_config(tmp_path / "web.yml", certs, client_auth="RequireAndVerifyClientCert",
                      extra_tls="client_allowed_sans: [prometheus.test]")
    with serve(load_web_config(path)) as server:
        port = port_of(server)
        assert fetch(port, ca=certs.ca, cert=(certs.client_cert, certs.client_key))[0] == 200
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            fetch(port, ca=certs.ca)                                    # no certificate
    path = web_config(tmp_path / "web2.yml", certs, client_auth="RequireAndVerifyClientCert",
                      extra_tls="client_allowed_sans: [other.test]")
    with serve(load_web_config(path)) as server:
        got = fetch(port_of(server), ca=certs.ca, cert=(certs.client_cert, certs.client_key))
        assert got[0] == 403


def test_a_reload_swaps_the_config_for_new_connections(certs, tmp_path):
    open_web = load_web_config(None)
    with serve(open_web) as server:
        port = port_of(server)
        assert fetch(port)[0] == 200
        server.set_web(load_web_config(web_config(tmp_path / "w.yml", None,
                                                  users={"prometheus": bcrypt_hash()})))
        assert fetch(port)[0] == 401 and fetch(port, user="prometheus")[0] == 200


@pytest.mark.parametrize(("body", "needle"), [
    ("basic_auth_users:\n  prometheus: plaintext\n", "not a bcrypt hash"),
    ("basic_auth_users:\n  prometheus: '{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g='\n", "not a bcrypt hash"),
    ("basic_auth_users:\n  prometheus: '$1$abc$abcdefghijklmnopqrstuv'\n", "not a bcrypt hash"),
    ("tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n", "No such file"),
    ("tls_server_config:\n  cert_file: a\n", "cert_file and key_file are both required"),
    ("tls_server_config:\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n", "not supported"),
    ("tls_server_config:\n  client_auth_type: RequireAnyClientCert\n", "without verifying"),
    ("tls_server_config:\n  client_auth_type: Sometimes\n", "is not one of"),
    ("tls_server_config:\n  min_version: SSL3\n", "is not one of"),
    ("http_server_config:\n  headers:\n    Set-Cookie: x\n", "not settable"),
    ("http_server_config:\n  headers:\n    X-Frame-Options: [a]\n", "one line of text"),
    ("basic_auth: {}\n", "unknown key"),
    ("- a\n- b\n", "must be a YAML mapping"),
    ("tls_server_config: [\n", "not valid YAML"),
    ("[" * 5000 + "]" * 5000, "nested too deeply"),
    ("tls_server_config:\n  cert_file: /dev/zero\n  key_file: /dev/zero\n", "not a regular file"),
    ("tls_server_config:\n  cert_file: web.yml\n  key_file: web.yml\n",  # itself: not PEM
     "not a PEM certificate"),
])
def test_a_bad_web_config_is_one_line_per_problem(tmp_path, body, needle):
    path = tmp_path / "web.yml"
    path.write_text(body)
    with pytest.raises(ConfigInvalid) as err:
        load_web_config(path)
    assert any(needle in p for p in err.value.problems), err.value.problems
    assert all("\n" not in p for p in err.value.problems)


def test_a_key_that_does_not_match_its_certificate(certs, tmp_path):
    path = tmp_path / "web.yml"
    path.write_text(f"tls_server_config:\n  cert_file: {certs.server_cert}\n"
                    f"  key_file: {certs.client_key}\n")
    with pytest.raises(ConfigInvalid) as err:
        load_web_config(path)
    assert "cert_file/key_file" in err.value.problems[0]
