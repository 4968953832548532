"""The daemon in the multi-path lab (issue 16): a cable cut rehearsed (traffic moved from the
40 ms ECMP paths to a 95 ms one) gives one ``path.rerouted`` report within 30 s, with the hop
lists of the peer's 4 flows before and after; a queue
building in the middle hop's delay line (spread up, floor steady) gives ``path.queueing`` and no
``path.rerouted``. The daemon runs in namespace a, the reflector in b."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time

import pytest
from conftest import new_lab_name
from daemon_toml import LAB_PROBE, daemon_toml, scrape_command

from wanprobe.lab.multipath import MultipathLab, path_addrs
from wanprobe.lab.settings import LinkSettings

pytestmark = pytest.mark.netns
SCRAPE = scrape_command()
WARMUP_S = 8.0   # 16 sessions: 5 for the reference, 5 recent, some margin


@contextlib.contextmanager
def daemon_in_lab(paths, ecmp, tmp_path, flows=1):
    lab = MultipathLab(new_lab_name(), paths, ecmp=ecmp)
    state = tmp_path / "state"
    cfg = tmp_path / "wanprobe.toml"
    cfg.write_text(daemon_toml(
        {"state_dir": state, "metrics_listen": "127.0.0.1:9862", "reflector": False,
         "hostname": "lab-a"},
        probe=LAB_PROBE, counters={"enabled": False},
        peers=[{"name": "lab-b", "address": lab.b.addr, "site": "tokyo", "flows": flows}]))
    procs = []
    try:
        lab.up()
        procs.append(lab.b.popen([sys.executable, "-m", "wanprobe", "reflect", "--bind",
                                  lab.b.addr], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        daemon = lab.a.popen([sys.executable, "-m", "wanprobe", "daemon", "--config", str(cfg)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(daemon)
        yield lab, daemon, state
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        lab.down()


def wait_for(state, pattern, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = sorted((state / "reports").glob(pattern))
        if found:
            return found
        time.sleep(0.25)
    return []


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + "{") and 'peer="lab-b"' in line:
            return line
    return None


def test_cable_cut_gives_one_reroute_report(tmp_path):
    paths = [LinkSettings(rtt_ms=40), LinkSettings(rtt_ms=40), LinkSettings(rtt_ms=95)]
    with daemon_in_lab(paths, [0, 1], tmp_path, flows=4) as (lab, daemon, state):
        time.sleep(WARMUP_S)
        assert daemon.poll() is None
        lab.reroute([2])
        cut = time.monotonic()
        reports = wait_for(state, "*-lab-b-path.rerouted.json", 30)
        detected_s = time.monotonic() - cut
        time.sleep(3.0)   # a few more sessions on the new path: still one report
        metrics = lab.a.run([sys.executable, "-c", SCRAPE], capture_output=True, text=True,
                            timeout=30).stdout
        daemon.send_signal(signal.SIGTERM)
        log = daemon.communicate(timeout=10)[0]
    assert reports, f"no path.rerouted report; log:\n{log}"
    print(f"\nreroute 40 -> 95 ms detected after {detected_s:.1f} s")
    assert "probe failed" not in log, log   # traces fit in the sessions' deadline
    assert len(list((state / "reports").glob("*path.rerouted*"))) == 1
    assert not list((state / "reports").glob("*path.queueing*"))
    doc = json.loads(reports[0].read_text())
    from wanprobe.report.document import validate

    validate(doc)
    ev = doc["findings"][0]["evidence"]
    assert 39 < ev["old_floor_ms"] < 42 and 94 < ev["new_floor_ms"] < 97, ev
    assert ev["training_step"]["allreduce_s_after"] > ev["training_step"]["allreduce_s_before"]
    # 4 flows traced: before the cut they crossed paths 0/1, after it all cross path 2
    r2_side = {path_addrs(i)[1]: i for i in range(3)}
    before = {r2_side[h] for hops in ev["hops_before"] for h in hops if h in r2_side}
    after = {r2_side[h] for hops in ev["hops_after"] for h in hops if h in r2_side}
    assert before and before <= {0, 1} and after == {2}, (ev["hops_before"], ev["hops_after"])
    fp = metric(metrics, "wanprobe_path_fingerprint_flows")
    assert fp and float(fp.rsplit(" ", 1)[1]) == 4   # all 4 flows on the one path left
    floor = metric(metrics, "wanprobe_path_rtt_floor_seconds")
    assert floor and 'dst_site="tokyo"' in floor and 'src_host="lab-a"' in floor
    assert 0.094 < float(floor.rsplit(" ", 1)[1]) < 0.097
    events = metric(metrics, "wanprobe_path_events_total")
    assert events and 'event="rerouted"' in events and events.endswith(" 1.0")


def test_queue_at_middle_hop_gives_queueing_not_reroute(tmp_path):
    paths = [LinkSettings(rtt_ms=40), LinkSettings(rtt_ms=40)]
    with daemon_in_lab(paths, [0, 1], tmp_path) as (lab, daemon, state):
        time.sleep(WARMUP_S)
        for i in range(2):   # whichever path the daemon's flow hashes onto
            lab.update_path(i, queue_ms=15)
        reports = wait_for(state, "*-lab-b-path.queueing.json", 30)
        time.sleep(4.0)   # 8 more sessions: the gauge's window (5) holds only queued ones
        metrics = lab.a.run([sys.executable, "-c", SCRAPE], capture_output=True, text=True,
                            timeout=30).stdout
        daemon.send_signal(signal.SIGTERM)
        log = daemon.communicate(timeout=10)[0]
    assert reports, f"no path.queueing report; log:\n{log}"
    assert not list((state / "reports").glob("*path.rerouted*")), log
    ev = json.loads(reports[0].read_text())["findings"][0]["evidence"]
    spread = metric(metrics, "wanprobe_path_rtt_spread_seconds")
    assert spread, metrics
    spread_ms = 1000 * float(spread.rsplit(" ", 1)[1])
    print(f"\nqueue: spread {ev['old_spread_ms']:.2f} -> {ev['new_spread_ms']:.2f} ms at the "
          f"event, {spread_ms:.2f} ms {4.0:.0f} s later; floor "
          f"{ev['old_floor_ms']:.2f} -> {ev['new_floor_ms']:.2f} ms")
    assert abs(ev["new_floor_ms"] - ev["old_floor_ms"]) < ev["floor_threshold_ms"]
    # the event fires on the detector's own rule: the median spread of the recent window above
    # the reference by the threshold (it may fire before every session in the window is queued)
    assert ev["new_spread_ms"] > ev["old_spread_ms"] + ev["spread_threshold_ms"], ev
    # once the window holds queued sessions only, the spread shows the emulated queue: 15 ms mean
    # per direction (exponential), so p99 - min of 20 RTT samples is ~45 ms; 15 ms leaves room
    # for a session that met a short run of the queue
    assert spread_ms > max(15.0, 2 * ev["old_spread_ms"]), (spread_ms, ev)
