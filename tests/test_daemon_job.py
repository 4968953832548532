"""Issue 41: the daemon's end of a job's live step stream — a real UNIX datagram socket, a real
history store, the metrics a scrape reads; garbage, hostile job names and too many jobs are
counted and dropped; a slow step during a loss burst in the history is put on the path."""

from __future__ import annotations

import asyncio
import json
import socket
import types

import pytest

from wanprobe.daemon.config_job import JobSettings
from wanprobe.daemon.job_ingest import JobIngest
from wanprobe.history.store import ProbeRow, Store
from wanprobe.job.recorder import StepRecorder

T0 = 1_700_000_000.0


def _store(path, loss_at: float) -> Store:
    store = Store(path / "history.sqlite3")
    for i in range(80):
        ts = T0 - 20 + i * 0.5
        lost = 6 if loss_at <= ts < loss_at + 1.5 else 0
        store.add_probe(ProbeRow(ts=ts, peer="usw", method="stamp", sent=40, received=40 - lost,
                                 loss_forward_lost=lost, loss_forward_of=40, loss_reverse_lost=0,
                                 loss_reverse_of=40 - lost, rtt_min_ms=130.0, rtt_p50_ms=131.0))
    store.flush()
    return store


def _metrics(ingest: JobIngest) -> dict[str, float]:
    out = {}
    for fam in ingest.collect():
        for s in fam.samples:
            out[s.name + json.dumps(s.labels, sort_keys=True)] = s.value
    return out


def test_steps_over_the_socket_give_metrics_and_a_path_attribution(tmp_path):
    store = _store(tmp_path, loss_at=T0 + 15.0)
    daemon = types.SimpleNamespace(store=store, cfg=types.SimpleNamespace(
        probe=types.SimpleNamespace(interval_s=0.5)))
    path = str(tmp_path / "job.sock")

    async def main():
        ingest = JobIngest(daemon, JobSettings(socket=path, max_jobs=2))
        ingest.delay_s = 0.0   # the history is written already
        ingest.open(asyncio.get_running_loop())
        rec = StepRecorder(socket_path=path, rank=0, job="llm")
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        raw.setblocking(False)
        for n in range(40):   # 0.5 s steps, one of 1.5 s at T0 + 15.25
            d = 1.5 if n == 30 else 0.5
            rec.record(n, T0 + 0.5 * n + (0.25 if n == 30 else 0.0), d, d - 0.3)
            await asyncio.sleep(0.005)   # a datagram socket queues 10 (net.unix.max_dgram_qlen)
        for bad in (b"garbage", b'{"step": 1}', json.dumps({"step": 1, "start": 1, "end": 2,
                                                           "job": "x\u202ey"}).encode(),
                    b"{" * 5000, json.dumps({"step": 1, "start": 1, "end": 2, "job": "b"}).encode(),
                    json.dumps({"step": 1, "start": 1, "end": 2, "job": "c"}).encode()):
            raw.sendto(bad, path)
            await asyncio.sleep(0.005)
        for _ in range(100):
            await asyncio.sleep(0.02)
            if sum(j.slow["path"] for j in ingest.jobs.values()) and ingest.refused >= 5:
                break
        assert rec.dropped == 0
        rec.close()
        raw.close()
        got = _metrics(ingest)
        ingest.close(asyncio.get_running_loop())
        return ingest, got

    ingest, got = asyncio.run(main())
    store.flush()
    filed = [f for f in store.findings() if f["id"] == "job.slow_step"]
    store.close()
    assert len(filed) == 1 and filed[0]["peer"] == "usw" and filed[0]["severity"] == "warning"
    assert "llm: step 30 took 1.50 s" in filed[0]["title"] and "loss burst" in filed[0]["title"]
    assert set(ingest.jobs) == {"llm", "b"}          # "c" is a job too many (max_jobs 2)
    assert ingest.refused == 5
    assert got['wanprobe_job_steps_total{"training_job": "llm"}'] == 40
    assert got['wanprobe_job_slow_steps_total{"attribution": "path", "training_job": "llm"}'] == 1
    assert got['wanprobe_job_step_baseline_seconds{"training_job": "llm"}'] == pytest.approx(0.5)
    assert got["wanprobe_job_datagrams_refused_total{}"] == 5


def test_a_path_that_is_not_a_socket_is_refused_not_replaced(tmp_path):
    from wanprobe.errors import ConfigError

    f = tmp_path / "plain"
    f.write_text("keep me")
    daemon = types.SimpleNamespace(store=None, cfg=None)

    async def main():
        JobIngest(daemon, JobSettings(socket=str(f))).open(asyncio.get_running_loop())

    with pytest.raises(ConfigError, match="job.socket"):
        asyncio.run(main())
    assert f.read_text() == "keep me"


def test_the_job_table_parses_and_each_bad_key_is_one_line():
    from wanprobe.daemon.config import ConfigInvalid, parse_config

    def config(job):
        return parse_config({"daemon": {"state_dir": "/var/lib/wanprobe"}, "job": job,
                             "peers": [{"name": "t1", "address": "198.18.0.2"}]}).job

    assert config({}) == JobSettings()
    assert config({"socket": "/run/wanprobe/job.sock", "max_jobs": 4}) == JobSettings(
        "/run/wanprobe/job.sock", 4)
    for job, key in (({"socket": "job.sock"}, "job.socket"), ({"max_jobs": 0}, "job.max_jobs"),
                     ({"sockets": "/x"}, "job.sockets")):
        with pytest.raises(ConfigInvalid) as info:
            config(job)
        assert len(info.value.problems) == 1 and key in info.value.problems[0], info.value.problems


def test_a_burst_of_slow_steps_runs_at_most_four_attributions_at_once(tmp_path):
    from wanprobe.job.steps import StepLine

    daemon = types.SimpleNamespace(store=None, cfg=types.SimpleNamespace(
        probe=types.SimpleNamespace(interval_s=0.5)))

    async def main():
        ingest = JobIngest(daemon, JobSettings(socket=str(tmp_path / "j.sock")))
        ingest.delay_s = 0.2
        for n in range(30):
            d = 0.5 if n < 20 else 5.0
            ingest.add("j", StepLine(n, T0 + n, T0 + n + d, None, 0))
        job = ingest.jobs["j"]
        held = (job.pending, job.slow["unexplained"])
        while job.pending:
            await asyncio.sleep(0.05)
        return held, dict(job.slow)

    (pending, early), slow = asyncio.run(main())
    assert pending == 4 and early == 6
    assert slow == {"path": 0, "host": 0, "unexplained": 10}   # no history: nothing to put it on


def test_job_explain_reads_the_daemon_over_its_listener(tmp_path):
    """/api/sessions on a real bounded listener (loopback) with a real store; `wanprobe job
    explain --daemon URL` puts the slow step on the loss burst; hostile queries are one 400."""
    import subprocess
    import sys
    import threading
    import urllib.error
    import urllib.request

    from wanprobe.daemon import routes
    from wanprobe.httpd.server import BoundedHttpServer

    store = _store(tmp_path, loss_at=T0 + 15.0)
    daemon = types.SimpleNamespace(store=store)
    loop = asyncio.new_event_loop()
    http = BoundedHttpServer(name="test")
    http.route("/api/sessions", lambda request: routes.sessions(daemon, request))
    _, port = loop.run_until_complete(http.start("127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    steps = tmp_path / "steps.jsonl"
    steps.write_text("".join(json.dumps({"step": n, "start": T0 + 0.5 * n + (0.25 if n == 30 else 0),
                                         "end": T0 + 0.5 * n + (1.75 if n == 30 else 0.5),
                                         "comm_s": 1.2 if n == 30 else 0.2}) + "\n"
                             for n in range(40)))
    try:
        url = f"http://127.0.0.1:{port}"
        r = subprocess.run([sys.executable, "-m", "wanprobe", "job", "explain", "--steps",
                            str(steps), "--daemon", url, "--json"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        (slow,) = doc["slow_steps"]
        assert slow["step"] == 30 and slow["attribution"] == "path"
        assert slow["evidence"]["peer"] == "usw" and doc["sessions"] == 80
        for query in ("since=1&until=x", "since=5&until=1", "since=0&until=9e9", "peer=a",
                      "since=1&until=2&since=3", "since=1&until=2&evil=1", "%ff=1"):
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(f"{url}/api/sessions?{query}", timeout=10)
            assert info.value.code == 400 and b"error" in info.value.read()
    finally:
        asyncio.run_coroutine_threadsafe(http.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        store.close()
