"""The HTML pictures without a browser: what each page carries (chart data read back from the
page's JSON), escaping of every outside string, the bounds on huge inputs, the history folds,
windows, the excess scale, and the one-line error when the plotting library is missing."""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import replace

import pytest
from clirun import invoke, one_line_error
from test_report_document import make_report

from wanprobe.daemon.config import BaselineSettings
from wanprobe.errors import UsageError
from wanprobe.history.store import ProbeRow, Store
from wanprobe.pictures import assets
from wanprobe.pictures.files import MAX_FILE_BYTES
from wanprobe.pictures.history_data import HistoryReader, bucket_s, parse_window
from wanprobe.pictures.html import esc
from wanprobe.pictures.peer_html import band_spec, history_page
from wanprobe.pictures.report_html import MAX_FINDINGS, report_page
from wanprobe.pictures.routes import parse_query
from wanprobe.pictures.state import excess
from wanprobe.report.document import Finding, Report, save

pytest.importorskip("bokeh")
EVIL = "<script>alert(1)</script>"


def charts(html: str) -> list[dict]:
    """The chart specs a page hands to charts.js."""
    m = re.search(r'<script type="application/json" id="wanprobe-charts">(.*?)</script>', html)
    assert m is not None
    assert "<" not in m.group(1)  # nothing in the data can close the element
    return json.loads(m.group(1))


def assert_escaped(html: str) -> None:
    assert EVIL not in html and "<b>bold</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def _intervals() -> list[dict]:
    out = []
    for k in range(6):
        streams = [{"id": i, "bits_per_second": 1e8 * (i + 1) + k * 1e6} for i in range(2)]
        out.append({"start_s": k, "end_s": k + 1.0, "bits_per_second": sum(
            s["bits_per_second"] for s in streams), "streams": streams, "partial": k == 5})
    return out


def evil_report() -> Report:
    """The engine's report on a window-limited path, with samples, intervals (the last one
    partial), a verify, and hostile text in a finding and the host name."""
    r = make_report()
    m = dict(r.measurements)
    m["path"] = {**m["path"], "rtt_samples_ms": [130.0 + (i % 17) * 0.1 for i in range(200)]}
    m["throughput"] = {**m["throughput"], "intervals": _intervals()}
    m["verify"] = {"bits_per_second": 9.1e8, "bits_per_second_after_omit": 9.4e8, "omit_s": 2.0,
                   "verdict": "network", "fixed": True, "next_step": "none"}
    bad = Finding(id="x.evil", severity="warning", title=EVIL, evidence={EVIL: "<b>bold</b>"},
                  recommendation=EVIL, expected_effect=EVIL)
    return replace(r, measurements=m, host={**r.host, "hostname": EVIL},
                   findings=(*r.findings, bad))


def test_report_page_carries_findings_distribution_streams_and_before_after():
    r = evil_report()
    html = report_page(r).render(assets.load())
    assert_escaped(html)
    assert esc(r.findings[0].title) in html
    specs = {s["kind"]: s for s in charts(html)}
    assert set(specs) == {"hist", "lines", "bars"}
    assert sum(specs["hist"]["count"]) == 200
    names = [s["name"] for s in specs["lines"]["series"]]
    assert names == ["stream 0", "stream 1", "all streams"]
    assert specs["lines"]["series"][0]["x"] == [1.0, 2.0, 3.0, 4.0, 5.0]   # partial one left out
    assert specs["bars"]["values"] == [190.0, 940.0]                       # Mbit/s, after omit
    assert len(html.encode()) < 2 * 2**20


def test_huge_report_is_bounded():
    r = make_report()
    evidence = {f"k{j}": "v" * 5000 for j in range(100)}   # one dict, shared: 500 kB, not 1.5 GB
    noisy = tuple(Finding(id=f"x.{i}", severity="info", title=f"finding {i}", evidence=evidence,
                          recommendation="r" * 5000, expected_effect="")
                  for i in range(3000))
    m = {**r.measurements, "path": {**r.measurements["path"],
                                    "rtt_samples_ms": [float(i % 997) for i in range(100_000)]}}
    html = report_page(replace(r, findings=r.findings + noisy, measurements=m)).render(assets.load())
    assert len(html.encode()) < MAX_FILE_BYTES
    assert f"{len(r.findings) + 3000 - MAX_FINDINGS} more findings not shown" in html
    assert len(charts(html)[0]["count"]) <= 40


def test_report_without_samples_draws_its_quantiles(tmp_path):
    html = report_page(make_report()).render(assets.load())
    hist = charts(html)[0]
    assert hist["kind"] == "hist" and hist["left"][0] == 130.0 and hist["right"][-1] == 133.0


def test_report_show_html_writes_one_offline_file(tmp_path):
    path = save(evil_report(), tmp_path / "r.json")
    r = invoke("report", "show", path, "--format", "html", "-o", tmp_path / "r.html")
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "r.html").read_text()
    assert_escaped(html)
    # the markup names no other host (no src/href/url() to a scheme or a network path; inside
    # BokehJS a MathJax loader names a CDN: the browser tests show it is never used)
    markup = re.sub(r"<script>.*?</script>", "", html, flags=re.S)
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:[a-z]+:|//)|url\(\s*["']?(?:https?:)?//""",
                         markup, re.I)
    assert "default-src &#x27;none&#x27;" in html   # the CSP: this file fetches nothing


def test_missing_plotting_library_is_one_line(tmp_path, monkeypatch):
    path = save(make_report(), tmp_path / "r.json")
    assets.load.cache_clear()
    monkeypatch.setitem(sys.modules, "bokeh", None)   # import bokeh now raises ImportError
    try:
        line = one_line_error(invoke("report", "show", path, "--format", "html"))
    finally:
        assets.load.cache_clear()
    assert "pip install 'wanprobe[pictures]'" in line


def _rows(store: Store, peer: str, t0: float) -> None:
    for i, (p50, p99, sent, received) in enumerate(
            [(10.0, 12.0, 20, 20), (14.0, 30.0, 20, 18),      # bucket 0 (t0 .. t0 + 60)
             (11.0, 13.0, 20, 20)]):                          # bucket 1
        store.add_probe(ProbeRow(ts=t0 + 20 * i + (40 if i == 2 else 0), peer=peer,
                                 method="stamp", sent=sent, received=received,
                                 loss_ratio=(sent - received) / sent,
                                 rtt_min_ms=p50 - 1, rtt_p50_ms=p50, rtt_p99_ms=p99))
    store.add_probe(ProbeRow(ts=t0 + 600, peer=peer, method="stamp", sent=20, received=20,
                             loss_ratio=0.0, rtt_min_ms=9.0, rtt_p50_ms=10.0,
                             rtt_p99_ms=11.0))  # after a gap


def test_history_band_folds_rows_as_the_store_downsamples(tmp_path):
    store = Store(tmp_path / "history.sqlite3")
    t0 = 1_800_000_000.0
    _rows(store, EVIL, t0)
    store.flush()
    with HistoryReader(tmp_path / "history.sqlite3") as reader:
        band = reader.band(EVIL, None, since=t0, until=t0 + 900, bucket=60.0)
    store.close()
    assert band.method == "stamp" and len(band.rows) == 3
    first = band.rows[0]
    assert (first.rtt_min_ms, first.rtt_p50_ms, first.rtt_p99_ms) == (9.0, 12.0, 30.0)
    assert first.loss_ratio == pytest.approx(2 / 40) and first.sessions == 2
    spec = band_spec(band, "t", [], [])
    assert spec["data"]["p50"] == [12.0, 11.0, None, 10.0]   # a gap, not a line over 9 minutes
    assert spec["data"]["x"][0] == (t0 + 30) * 1e3           # bucket centres, ms since epoch


def test_history_page_marks_events_and_tuning_changes(tmp_path):
    from tuners.journal import Journal, JournalStore

    now = time.time()
    store = Store(tmp_path / "history.sqlite3")
    _rows(store, EVIL, now - 3000)
    store.add_finding(now - 2000, {"id": "path.rerouted", "severity": "warning",
                                   "title": f"Path to {EVIL} rerouted"}, peer=EVIL)
    store.close()
    jstore = JournalStore(tmp_path / "tune")   # the tuner's own state dir, not the daemon's
    jstore.dir.mkdir(parents=True)
    jstore.save(Journal(id=JournalStore.new_id(), state="applied", netns_inode=1,
                        netns_cookie=None, host_id="h", plan_id="p",
                        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        entries=(), pid=1))
    r = invoke("history", EVIL, "--state-dir", tmp_path, "--tune-state-dir", tmp_path / "tune",
               "--format", "html", "--since", "2h", "-o", tmp_path / "h.html")
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "h.html").read_text()
    assert_escaped(html)
    band = charts(html)[0]
    assert band["kind"] == "band" and len(band["events"]) == 1
    assert band["events"][0]["x"] == pytest.approx((now - 2000) * 1e3, abs=1)
    assert len(band["changes"]) == 1 and band["changes"][0]["label"].startswith("tune applied")
    page = history_page(tmp_path / "history.sqlite3", "nobody", window_s=3600,
                        state_dir=None).render(assets.load())
    assert "no probe sessions for nobody" in page


@pytest.mark.parametrize("text, seconds", [("5m", 300), ("24h", 86400), ("2160h", 90 * 86400)])
def test_window_accepts_5_minutes_to_90_days(text, seconds):
    assert parse_window(text) == seconds
    assert parse_query(f"window={text}") == (seconds, text)
    assert bucket_s(seconds) * 288 >= seconds


@pytest.mark.parametrize("query", ["window=1m", "window=2161h", "window=abc", "window=10",
                                   "x=1", "window=1h&window=2h", "window", "window=%ff",
                                   "a=1&b=2&c=3&d=4&e=5"])
def test_bad_window_or_parameter_is_refused(query):
    with pytest.raises(UsageError) as err:
        parse_query(query)
    assert "\n" not in str(err.value)


def test_excess_is_relative_to_each_paths_own_baseline():
    s = BaselineSettings()
    base = {"rtt_p50_ms": 130.0, "rtt_p99_ms": 132.0, "loss_ratio": 0.0}
    doc = {"rtt_ms": {"p50": 132.0, "p99": 134.0}, "loss": {"ratio": 0.0}}
    assert excess(doc, base, s).score == pytest.approx(2 / 32.5)   # 2 ms on 130 ms: small
    base2 = {"rtt_p50_ms": 2.0, "rtt_p99_ms": 2.5, "loss_ratio": 0.0}
    doc2 = {"rtt_ms": {"p50": 4.0, "p99": 4.5}, "loss": {"ratio": 0.0, "forward_ratio": 0.02}}
    e = excess(doc2, base2, s)
    assert e.score == 2.0 and e.loss_forward == 2.0 and e.loss_reverse is None
    assert excess(None, base, s).score is None
