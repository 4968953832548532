"""The pictures in a real browser (Debian's chromium + chromium-driver, selenium, headless): the
daemon's page on a lab with two peers, the HTML of a real lab diagnose, and a history file.

One lab for the three: b runs the reflector with a small receive buffer (so the diagnose has a
real first finding), a runs the daemon (two peers: ``lab-b`` from a mesh file and one named
``<script>alert(1)</script> $$x^2$$`` from the config, both reflected by b), a tuning
transaction journalled in the daemon's state dir, and ``wanprobe diagnose``. Chromium runs inside
namespace a, which has no route anywhere but the lab: for each page the peer names and the
first finding are visible, every chart holds drawn pixels, the console has no error, no dialog
opened (the script in the peer name did not run), and every request stayed on the page's own
origin. A screenshot of each is kept (``WANPROBE_SCREENSHOTS=DIR`` copies them there: docs/).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from browser_check import available
from conftest import new_lab_name, require
from daemon_toml import LAB_PROBE, daemon_toml

from wanprobe.lab import Lab, netns
from wanprobe.lab.scenario import start_reflector

pytestmark = [pytest.mark.alone, pytest.mark.netns]
EVIL = "<script>alert(1)</script> $$x^2$$"
CHECKER = str(Path(__file__).with_name("browser_check.py"))
PORT = 9862


def wanprobe(end, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    r = end.run([sys.executable, "-m", "wanprobe", *map(str, args)], capture_output=True,
                text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory):
    require(available())
    tmp = tmp_path_factory.mktemp("browser")
    lab = Lab(name=new_lab_name(), rtt_ms=30.0)
    lab.up()
    procs: list[subprocess.Popen] = []
    try:
        lab.b.run(["sysctl", "-qw", "net.ipv4.tcp_rmem=4096 65536 262144"], check=True)
        procs.append(start_reflector(lab))
        state, tune_state = tmp / "state", tmp / "tune"   # the daemon's and the tuner's, apart
        mesh = tmp / "mesh.toml"
        mesh.write_text(f'[sites.osaka]\nhosts = [{{ name = "lab-a", address = "{lab.a.addr}" }}]\n'
                        f'[sites.tokyo]\nhosts = [{{ name = "lab-b", address = "{lab.b.addr}" }}]\n')
        cfg = tmp / "wanprobe.toml"
        cfg.write_text(daemon_toml(
            {"state_dir": state, "tune_state_dir": tune_state,
             "metrics_listen": f"127.0.0.1:{PORT}", "hostname": "lab-a",
             "mesh_file": mesh, "reflector_listen": [f"{lab.a.addr}:862"]},
            probe=LAB_PROBE, counters={"interval": "5s"}, baseline={"min_samples": 6},
            peers=[{"name": EVIL, "address": lab.b.addr, "site": "tokyo"}]))
        daemon = lab.a.popen([sys.executable, "-m", "wanprobe", "daemon", "--config", str(cfg)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(daemon)
        # a tuning transaction (the tuner's state dir): a tcp_rmem change in namespace a only
        knob = {"tuner": "sysctl", "key": "net.ipv4.tcp_rmem", "value": "4096 131072 67108864",
                "reason": "test"}
        (tmp / "knob.json").write_text(json.dumps({
            "schema_version": "1.0", "id": "knob", "host": {}, "peer": {"address": lab.b.addr},
            "measurements": {}, "findings": [{"id": "t", "severity": "info", "title": "t",
                                              "knobs": [knob]}]}))
        time.sleep(4.0)
        wanprobe(lab.a, "tune", "plan", "-r", tmp / "knob.json", "-o", tmp / "plan.json")
        wanprobe(lab.a, "tune", "apply", tmp / "plan.json", "--yes", "--state-dir", tune_state)
        wanprobe(lab.a, "diagnose", lab.b.addr, "--quick", "-o", tmp / "report.json")
        wanprobe(lab.a, "report", "show", tmp / "report.json", "--format", "html", "-o",
                 tmp / "report.html")
        wanprobe(lab.a, "history", EVIL, "--state-dir", state, "--tune-state-dir", tune_state,
                 "--since", "5m", "--format", "html", "-o", tmp / "history.html")
        assert daemon.poll() is None, daemon.stdout.read()
        pages = {"daemon": f"http://127.0.0.1:{PORT}/?window=5m",
                 "report": (tmp / "report.html").as_uri(),
                 "history": (tmp / "history.html").as_uri()}
        seen = browse(lab, {k: (url, tmp / f"pictures-{k}.png") for k, url in pages.items()})
        yield tmp, seen
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(10) == 0
    finally:
        for p in procs:
            netns.stop(p)
        lab.down()


def browse(lab, pages: dict[str, tuple[str, Path]]) -> dict[str, dict]:
    """One Chromium in namespace a visits every page; screenshots kept as the docstring says."""
    r = lab.a.run([sys.executable, CHECKER, *(f"{url}::{shot}" for url, shot in pages.values())],
                  capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    keep = os.environ.get("WANPROBE_SCREENSHOTS")
    for _, shot in pages.values():
        if keep:
            small(shot, Path(keep) / shot.name)
    return dict(zip(pages, json.loads(r.stdout), strict=True))


def small(src: Path, dst: Path) -> None:
    """A screenshot for docs/: a 256-colour palette (a page of flat colours loses nothing
    visible; a third of the size)."""
    from PIL import Image

    Image.open(src).convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(
        dst, optimize=True)


def assert_clean(got: dict, origin: str) -> None:
    assert got["charts"] >= 1 and all(n > 500 for n in got["drawn_pixels"]), got["drawn_pixels"]
    assert got["charts_attr"] == str(got["charts"])
    errors = [e for e in got["console"] if e["level"] in ("SEVERE", "WARNING")]
    assert not errors, errors
    assert got["alert"] is None
    assert got["requests"] and all(u.startswith(origin) for u in got["requests"]), got["requests"]


def test_daemon_page_in_chromium(lab_run):
    _, seen = lab_run
    got = seen["daemon"]
    assert_clean(got, f"http://127.0.0.1:{PORT}/")
    text = got["text"]
    assert "lab-b" in text and EVIL in text        # the name shown as text, not run
    assert "from osaka" in text and "to tokyo" in text
    assert "tune applied: sysctl net.ipv4.tcp_rmem" in text
    assert got["charts"] == 2


def test_report_of_a_lab_diagnose_in_chromium(lab_run):
    tmp, seen = lab_run
    report = json.loads((tmp / "report.json").read_text())
    assert (tmp / "report.html").stat().st_size < 5 * 2**20
    got = seen["report"]
    assert_clean(got, "file://")
    assert report["findings"][0]["title"] in got["text"]
    assert report["peer"]["address"] in got["text"]
    assert got["charts"] >= 3      # RTT distribution, streams forward and reverse


def test_history_file_in_chromium(lab_run):
    _, seen = lab_run
    got = seen["history"]
    assert_clean(got, "file://")
    assert f"wanprobe history: {EVIL}" in got["text"]
    assert "tune applied: sysctl net.ipv4.tcp_rmem" in got["text"]
