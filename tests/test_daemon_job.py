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
