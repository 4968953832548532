"""Issue 37: a U+202E (or any other invisible format character, Unicode category Cf) in a peer
name, a site, a host name or a finding never reaches an HTML page raw — in the report file, the
history file and the daemon's own pages it is shown as ``\\u202e``, the way the terminal shows it
(safe_text), in the markup and in the chart data alike."""

from __future__ import annotations

import asyncio
import json
import re
import time
import unicodedata
import urllib.parse
import urllib.request
from dataclasses import replace

import pytest
from clirun import invoke
from test_report_document import make_report

from wanprobe.daemon.config import parse_config
from wanprobe.daemon.main import Daemon
from wanprobe.history.store import ProbeRow, Store
from wanprobe.pictures.html import esc, script_json
from wanprobe.report.document import Finding, save
from wanprobe.safe_text import clean

pytest.importorskip("bokeh")
# a right-to-left override, an isolate, a zero-width space, a BOM, a soft hyphen, a tag character
SPOOF = "fra\u202egnp.exe\u2066x\u200by\ufeff\u00ad\U000e0041"
SHOWN = "fra\\u202egnp.exe\\u2066x\\u200by\\ufeff\\xad\\U000e0041"
FORMAT = re.compile("[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u200b-\u200f\u202a-\u202e"
                    "\u2060-\u206f\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]")


def visible(html: str) -> str:
    """What the browser shows or hands to charts.js: the markup and the chart JSON decoded,
    without the inline plotting library (its source is ours, not the peer's)."""
    data = re.search(r'<script type="application/json" id="wanprobe-charts">(.*?)</script>',
                     html, re.S)
    markup = re.sub(r"<script[^>]*>.*?</script>", "", html, flags=re.S)
    return markup + (json.dumps(json.loads(data.group(1)), ensure_ascii=False) if data else "")


def assert_shown(html: str, times: int = 1) -> None:
    seen = visible(html)
    raw = FORMAT.findall(seen)
    assert not raw, f"{len(raw)} raw format characters, first {raw[0]!r}"
    assert seen.count(SHOWN) >= times


def test_every_format_character_is_escaped_in_text_and_html():
    cf = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf"]
    assert len(cf) > 150
    for ch in cf:
        assert ch not in clean(f"a{ch}b") and ch not in esc(f"a{ch}b"), hex(ord(ch))
    assert esc("<\u202e>") == "&lt;\\u202e&gt;"
    assert "\u202e" not in json.loads(script_json({"title": "to \u202e", "\u2066": ["\u200b"]}))


def test_report_html_file(tmp_path):
    r = make_report()
    bad = Finding(id="x.spoof", severity="warning", title=SPOOF, evidence={SPOOF: SPOOF},
                  recommendation=SPOOF, expected_effect=SPOOF)
    r = replace(r, host={**r.host, "hostname": SPOOF}, findings=(bad, *r.findings),
                peer={**r.peer, "name": SPOOF})
    path = save(r, tmp_path / "r.json")
    out = invoke("report", "show", path, "--format", "html", "-o", tmp_path / "r.html")
    assert out.returncode == 0, out.stderr
    assert_shown((tmp_path / "r.html").read_text(), times=5)


def test_history_html_file(tmp_path):
    store = Store(tmp_path / "history.sqlite3")
    now = time.time()
    for i in range(3):
        store.add_probe(ProbeRow(ts=now - 600 + 60 * i, peer=SPOOF, method="stamp", sent=20,
                                 received=19, loss_ratio=0.05, rtt_min_ms=9.0, rtt_p50_ms=10.0,
                                 rtt_p99_ms=12.0))
    store.add_finding(now - 300, {"id": "path.rerouted", "severity": "warning",
                                  "title": f"Path to {SPOOF} rerouted"}, peer=SPOOF)
    store.close()
    out = invoke("history", SPOOF, "--state-dir", tmp_path, "--tune-state-dir", tmp_path / "t",
                 "--format", "html", "--since", "1h", "-o", tmp_path / "h.html")
    assert out.returncode == 0, out.stderr
    assert_shown((tmp_path / "h.html").read_text(), times=2)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read().decode()


def test_daemon_pages(tmp_path):
    cfg = parse_config({
        "daemon": {"state_dir": str(tmp_path), "metrics_listen": "127.0.0.1:0", "site": "osaka"},
        "probe": {"interval": "50ms", "jitter": "5ms", "count": 5, "packet_interval": "1ms",
                  "timeout": "100ms"},
        "peers": [{"name": "tokyo-1", "address": "198.18.0.2", "site": "tokyo"},
                  {"name": SPOOF, "address": "198.18.0.3", "site": SPOOF}]})
    cfg = replace(cfg, mesh_file=tmp_path / "mesh.toml")   # draws the site matrix

    async def prober(peer, method, s):
        await asyncio.sleep(0.002)
        return {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "rtt_ms": {"min": 9.5, "p50": 10.0, "p90": 10.5, "p99": 11.0, "max": 12.0,
                           "mean": 10.0},
                "loss": {"sent": 20, "received": 20, "ratio": 0.0}}

    class Reflector:
        async def start(self, listen):
            pass

        async def close(self):
            pass

        def refusals(self):
            return {SPOOF: 1}

    async def main():
        d = Daemon(cfg, cfg.peers, prober=prober, reflector=Reflector())
        task = asyncio.create_task(d.run())
        await asyncio.sleep(1.0)
        host, port = d.metrics_address
        base = f"http://{host}:{port}"
        pages = [await asyncio.to_thread(_get, base + p) for p in
                 ("/", "/peer/" + urllib.parse.quote(SPOOF, safe="") + "?window=1h")]
        d.stop_event.set()
        await task
        return pages

    overview, peer = asyncio.run(main())
    assert 'class="matrix"' in overview
    assert_shown(overview, times=4)   # the table, the band's heading and title, the matrix
    assert_shown(peer, times=2)
