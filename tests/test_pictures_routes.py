"""The daemon's page on its metrics listener, with a daemon running injected probes (no root): what
each route answers, the only inputs (peer name, ?window=) validated with one line, read-only,
names escaped, the site matrix with a mesh file, /metrics and /healthz unchanged."""

from __future__ import annotations

import asyncio
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from wanprobe.daemon.config import parse_config
from wanprobe.daemon.main import Daemon

pytest.importorskip("bokeh")
EVIL = "<script>alert(1)</script>"


def _doc(rtt_ms: float, received: int = 20) -> dict:
    return {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "rtt_ms": {"min": rtt_ms - 0.5, "p50": rtt_ms, "p90": rtt_ms + 0.5,
                       "p99": rtt_ms + 1, "max": rtt_ms + 2, "mean": rtt_ms},
            "loss": {"sent": 20, "received": received, "ratio": (20 - received) / 20,
                     "forward_ratio": (20 - received) / 20, "reverse_ratio": 0.0}}


class FakeReflector:
    async def start(self, listen):
        pass

    async def close(self):
        pass

    def refusals(self):
        return {"not_allowed": 3, EVIL: 1}


def _raw(host: str, port: int, request: bytes) -> bytes:
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def _get(base: str, path: str) -> tuple[int, dict, bytes]:
    try:
        with urllib.request.urlopen(base + path, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    """Start a daemon probing two peers (one named EVIL, in a site named <b>fra</b>) with a
    mesh file, let it run, and collect the answers of every route."""
    tmp: Path = tmp_path_factory.mktemp("page")
    cfg = parse_config({
        "daemon": {"state_dir": str(tmp), "metrics_listen": "127.0.0.1:0", "site": "osaka"},
        "probe": {"interval": "50ms", "jitter": "5ms", "count": 5, "packet_interval": "1ms",
                  "timeout": "100ms"},
        "baseline": {"min_samples": 5, "recent": 3},
        "peers": [{"name": "tokyo-1", "address": "198.18.0.2", "site": "tokyo"},
                  {"name": EVIL, "address": "198.18.0.3", "site": "<b>fra</b>"}]})
    cfg = replace(cfg, mesh_file=tmp / "mesh.toml")   # the page only asks whether there is one

    async def prober(peer, method, s):
        await asyncio.sleep(0.002)
        return _doc(60.0 if peer.name == "tokyo-1" else 20.0)

    evil_path = "/peer/" + urllib.parse.quote(EVIL, safe="")
    gets = ["/", "/?window=5m", evil_path + "?window=1h", "/peer/nobody", "/?window=1m",
            "/?window=abc", "/?x=1", "/?window=1h&window=2h", "/metrics", "/healthz",
            "/static/nope.js", "/peer/" + "a" * 2000, "/peer/%ff"]

    async def main():
        d = Daemon(cfg, cfg.peers, prober=prober, reflector=FakeReflector())
        task = asyncio.create_task(d.run())
        await asyncio.sleep(1.5)
        host, port = d.metrics_address
        base = f"http://{host}:{port}"
        got = {p: await asyncio.to_thread(_get, base, p) for p in gets}
        script = re.search(r'<script src="(/static/[^"]+)"', got["/"][2].decode()).group(1)
        got["script"] = await asyncio.to_thread(_get, base, script)
        for verb in ("POST", "PUT", "DELETE", "HEAD"):
            got[verb] = await asyncio.to_thread(
                _raw, host, port, f"{verb} / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
        d.stop_event.set()
        await task
        return got

    return asyncio.run(main())


def test_overview_lists_every_peer_escaped_with_bands_and_matrix(answers):
    status, headers, body = answers["/"]
    html = body.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert EVIL not in html and "<b>fra</b>" not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 3   # table, band, refusals
    assert "&lt;b&gt;fra&lt;/b&gt;" in html and "tokyo-1" in html
    assert 'class="matrix"' in html and "from osaka" in html
    assert html.count('<div class="chart"') == 2
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert headers["Cache-Control"] == "no-store"
    assert 'href="/peer/%3Cscript%3Ealert%281%29%3C%2Fscript%3E"' in html


def test_peer_page_and_window(answers):
    status, _, body = answers["/peer/%3Cscript%3Ealert%281%29%3C%2Fscript%3E?window=1h"]
    assert status == 200 and EVIL not in body.decode()
    assert "last 1 h" in body.decode()
    assert answers["/?window=5m"][0] == 200


@pytest.mark.parametrize("path, status, text", [
    ("/peer/nobody", 404, "no peer named 'nobody'"),
    ("/?window=1m", 400, "shorter than 5 minutes"),
    ("/?window=abc", 400, "duration"),
    ("/?x=1", 400, "only window=DURATION"),
    ("/?window=1h&window=2h", 400, "repeated parameter"),
    ("/static/nope.js", 404, "no such asset"),
    ("/peer/%ff", 400, "not UTF-8"),
])
def test_bad_input_is_one_line(answers, path, status, text):
    got, headers, body = answers[path]
    assert got == status and headers["Content-Type"].startswith("text/plain")
    assert body.endswith(b"\n") and body.count(b"\n") == 1 and text in body.decode()


def test_long_target_refused(answers):
    assert answers["/peer/" + "a" * 2000][0] == 414


def test_read_only(answers):
    for verb in ("POST", "PUT", "DELETE"):
        assert answers[verb].startswith(b"HTTP/1.1 405"), answers[verb][:80]
    head = answers["HEAD"]
    assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")   # no body


def test_static_script_is_cached_and_metrics_unchanged(answers):
    status, headers, body = answers["script"]
    assert status == 200 and headers["Content-Type"].startswith("text/javascript")
    assert "immutable" in headers["Cache-Control"] and b"Bokeh" in body
    assert answers["/metrics"][0] == 200 and b"wanprobe_rtt_seconds" in answers["/metrics"][2]
    assert answers["/healthz"][0] == 200
