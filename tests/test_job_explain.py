"""Issue 41, the pure part: a step log read back (garbage, skewed clocks, overlaps), path events
from probe sessions, and slow steps attributed to the path, a host or nothing known. The lab
proof (gloo training with injected events while a daemon probes) is tests/test_job_lab.py."""

from __future__ import annotations

import json

import pytest

from wanprobe.errors import ConfigError
from wanprobe.job.explain import HostEvent, explain
from wanprobe.job.path_events import Session, path_events
from wanprobe.job.recorder import StepRecorder, _union
from wanprobe.job.steps import parse_lines

T0 = 1_700_000_000.0


def lines(durations, *, ranks=1, comm=0.2, skew=(0.0,), slow_rank=None, extra=0.0):
    """Steps back to back (0.5 s usually); ``slow_rank`` computes ``extra`` longer in the steps
    given as negative durations (a straggler), the others wait that long in comm."""
    out, t = [], T0
    for n, d in enumerate(durations):
        straggle = d < 0
        d = abs(d)
        for r in range(ranks):
            # a slow step on the path: every rank's comm takes the extra time
            c = comm + (d - 0.5) if not straggle else (comm if r == slow_rank else comm + extra)
            off = skew[r] if r < len(skew) else 0.0
            out.append(json.dumps({"step": n, "start": t + off, "end": t + d + off,
                                   "comm_s": c, "rank": r}))
        t += d
    return out


def sessions(peer="usw", n=60, every=1.0, loss_at=(), rtt_at=(), queue_at=()):
    out = []
    for i in range(n):
        ts = T0 - 30 + i * every
        lost = 5 if any(a <= ts < b for a, b in loss_at) else 0
        floor = 130.0 + (25.0 if any(a <= ts < b for a, b in rtt_at) else 0.0)
        q = 30.0 if any(a <= ts < b for a, b in queue_at) else 0.5
        out.append(Session(ts, peer, 100, lost, 0, floor, floor + q))
    return out


def test_garbage_lines_are_skipped_and_counted_and_what_is_read_is_kept():
    text = lines([0.5] * 10) + ["not json", "{\"step\": -1}", "[1, 2]", "",
                                json.dumps({"step": 3, "start": 5.0, "end": 4.0}),
                                json.dumps({"step": 4, "start": "x", "end": 5.0})]
    log = parse_lines(text, "steps.jsonl")
    assert len(log.steps) == 10 and log.skipped == 5
    assert any("5 line(s) skipped" in n for n in log.notes)
    with pytest.raises(ConfigError, match="no step line readable"):
        parse_lines(["garbage", "{}"], "steps.jsonl")


def test_skewed_rank_clocks_are_aligned_and_overlaps_noted():
    log = parse_lines(lines([0.5] * 20, ranks=2, skew=(0.0, 3.25)), "s")
    assert log.offsets_s == {1: pytest.approx(3.25)}
    assert all(s.duration_s == pytest.approx(0.5) for s in log.steps)
    assert any("rank 1's clock is +3250.0 ms" in n for n in log.notes)
    over = lines([0.5] * 5) + [json.dumps({"step": 5, "start": T0 + 2.2, "end": T0 + 2.9})]
    assert any("start before the previous one ended" in n for n in parse_lines(over, "s").notes)


def test_path_events_loss_reroute_queue_with_figures():
    s = sessions(loss_at=[(T0, T0 + 2)], rtt_at=[(T0 + 10, T0 + 12)],
                 queue_at=[(T0 + 20, T0 + 22)])
    ev = path_events(s, 1.0)
    kinds = [(e.kind, round(e.start - T0)) for e in ev]
    assert kinds == [("loss burst", 0), ("loss burst", 1), ("reroute", 10), ("reroute", 11),
                     ("queue", 20), ("queue", 21)]
    loss = ev[0]
    assert loss.evidence["lost"] == 5 and loss.evidence["sent"] == 100
    lo, hi = loss.evidence["ci95"]
    assert lo < 0.05 < hi and "95 % CI" in loss.cause
    assert "+25.0 ms" in ev[2].cause and ev[4].evidence["queueing_ms"] == pytest.approx(30.0)
    assert path_events(sessions(), 1.0) == []   # a quiet path has no event


def test_slow_steps_are_put_on_the_path_a_straggler_or_nothing():
    d = [0.5] * 30 + [1.2] + [0.5] * 10 + [1.1] + [0.5] * 10 + [-1.3] + [0.5] * 10
    log = parse_lines(lines(d, ranks=2, slow_rank=1, extra=0.8), "s")
    slow_at = {30: T0 + 15.0, 41: None, 52: None}
    ev = path_events(sessions(n=120, every=0.5, loss_at=[(slow_at[30], slow_at[30] + 1.2)]), 0.5)
    res = explain(log, ev).to_json()
    got = {s["step"]: s for s in res["slow_steps"]}
    assert set(got) == {30, 41, 52}
    assert got[30]["attribution"] == "path" and "loss burst toward usw" in got[30]["cause"]
    assert got[30]["evidence"]["lost"] == 5
    assert got[41]["attribution"] == "unexplained"   # quiet path: never blamed on it
    assert got[52]["attribution"] == "host" and got[52]["evidence"]["rank"] == 1
    assert res["by_attribution"] == {"path": 1, "host": 1, "unexplained": 1}
    assert got[30]["baseline_s"] == pytest.approx(0.5)


def test_a_straggler_is_the_host_even_with_a_path_event_and_host_events_are_named():
    d = [0.5] * 30 + [-1.3] + [0.5] * 5 + [1.0]
    log = parse_lines(lines(d, ranks=2, slow_rank=0, extra=0.8), "s")
    ev = path_events(sessions(n=400, every=0.2, loss_at=[(T0, T0 + 40)]), 0.2)
    hosts = [HostEvent("tpe1", T0 + 18.0, T0 + 19.0, "CPU steal 40 %")]
    got = {s.step: s for s in explain(log, ev, hosts).slow_steps}
    assert got[30].attribution == "host" and got[30].evidence["rank"] == 0
    assert got[36].attribution == "path"


def test_the_recorder_writes_lines_the_reader_takes(tmp_path):
    clock = iter(float(T0 + i) for i in range(100))
    mono = iter(float(i) / 10 for i in range(1000))
    p = tmp_path / "steps.jsonl"
    with StepRecorder(p, rank=1, job="j", clock=lambda: next(clock),
                      monotonic=lambda: next(mono)) as rec:
        for n in range(3):
            with rec.step(n), rec.comm():
                pass
    log = parse_lines(p.read_text().splitlines(), str(p))
    assert [s.step for s in log.steps] == [0, 1, 2]
    line = log.steps[0].ranks[0]
    assert line.rank == 1 and line.comm_s == pytest.approx(0.1)
    assert line.end - line.start == pytest.approx(0.3)
    assert _union([(0, 2), (1, 3), (5, 6)]) == 4
    with pytest.raises(ValueError):
        StepRecorder()


def test_the_recorder_never_blocks_on_a_missing_daemon(tmp_path):
    rec = StepRecorder(socket_path=str(tmp_path / "none.sock"))
    with rec.step(0):
        pass
    assert rec.dropped == 1
    rec.close()


def test_the_ddp_hook_times_each_bucket_and_averages_like_ddp(tmp_path):
    """A real DistributedDataParallel model (gloo, one rank on loopback) with the recorder's
    hook: the gradients come out as DDP's own averaging gives them, and the step has comm_s."""
    torch = pytest.importorskip("torch", reason="needs torch's CPU wheel (the test extra)")
    import socket as sk

    import torch.distributed as dist

    with sk.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 64)
        plain = torch.nn.Linear(64, 64)
        plain.load_state_dict(model.state_dict())
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
        p = tmp_path / "steps.jsonl"
        with StepRecorder(p, rank=0) as rec:
            ddp.register_comm_hook(None, rec.ddp_hook())
            x = torch.randn(8, 64)
            with rec.step(0):
                ddp(x).sum().backward()
        plain(x).sum().backward()
        assert torch.allclose(model.weight.grad, plain.weight.grad)
        (line,) = parse_lines(p.read_text().splitlines(), str(p)).steps[0].ranks
        assert line.comm_s is not None and 0 < line.comm_s <= line.end - line.start
    finally:
        dist.destroy_process_group()
