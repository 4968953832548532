"""One-way delay per direction in the lab (issue 20): on a 10 ms forward / 50 ms back link,
`probe` reports each direction's p50 within 1 ms of the set value with a clock bound of 0 (both
namespaces read one kernel clock), iputils ping's RTT agrees with their sum, and `lab update
--delay-ba` moves only the reverse one. Against a third-party reflector that cannot say whether
it shares our clock, a fake `chronyc` reporting an unsynchronised clock withholds the absolute
values and keeps the variation; a synchronised one gives them with the bound. The daemon's path
watch names the direction a queue builds in, and exports one-way delay with its bound."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_toml import LAB_PROBE, daemon_toml, scrape_command

from wanprobe.lab import netns

pytestmark = pytest.mark.netns
PORT = 862
HERE = Path(__file__).parent
# chronyc -c tracking (chrony client.c field order): reference, name, stratum, ref time, System
# time (s), last offset, RMS offset, frequency, residual, skew, root delay, root dispersion,
# update interval, leap status
UNSYNCED = "00000000,,0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,1.0,1.0,0.0,Not synchronised"
SYNCED = ("C0A80001,192.168.0.1,2,1761000000.0,0.000050000,0.0,0.0,0.0,0.0,0.0,0.001000000,"
          "0.000200000,64.0,Normal")   # bound 0.05 + 0.2 + 1.0 / 2 = 0.75 ms


@contextlib.contextmanager
def served(lab, argv, ready_text):
    """A server in namespace b, waited for until it prints ``ready_text``; always stopped."""
    proc = lab.b.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else ""
        assert ready_text in line, f"server did not start: {line!r}"
        yield proc
    finally:
        netns.stop(proc, 10)


def our_reflector(lab):
    return served(lab, [sys.executable, "-m", "wanprobe", "reflect", "--bind", lab.b.addr,
                        "--port", str(PORT)], "STAMP on udp")


def probe(lab, *, count=150, env=None, json_out=True):
    argv = [sys.executable, "-m", "wanprobe", "probe", lab.b.addr, "--count", str(count),
            "--interval", "10ms", "--port", str(PORT)] + (["--json"] if json_out else [])
    r = lab.a.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout) if json_out else r.stdout


def fake_chronyc(tmp_path, line):
    """A `chronyc` on PATH that prints ``line`` for `-n -c tracking` (the environment to use)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    script = bindir / "chronyc"
    script.write_text(f"#!/bin/sh\n[ \"$*\" = \"-n -c tracking\" ] || exit 1\necho '{line}'\n")
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}


def test_asymmetric_lab_gives_each_direction_and_ping_agrees(lab_factory):
    lab = lab_factory(delay_ab_ms=10, delay_ba_ms=50)
    with our_reflector(lab):
        runs = [probe(lab)["owd_ms"] for _ in range(3)]
        ping = lab.a.run(["ping", "-c", "100", "-i", "0.01", lab.b.addr], capture_output=True,
                         text=True, timeout=60)
        upd = subprocess.run([sys.executable, "-m", "wanprobe", "lab", "update", lab.name,
                              "--delay-ba", "30ms", "--json"], capture_output=True, text=True,
                             timeout=30)
        after = probe(lab)["owd_ms"]
    fwd = [r["forward"]["p50"] for r in runs]
    rev = [r["reverse"]["p50"] for r in runs]
    ping_ms = statistics.median(float(x) for x in re.findall(r"time=([\d.]+) ms", ping.stdout))
    print(f"\none-way p50 over 3 runs: forward {min(fwd):.3f}-{max(fwd):.3f} ms (set 10), "
          f"reverse {min(rev):.3f}-{max(rev):.3f} ms (set 50); ping RTT p50 {ping_ms:.3f} ms; "
          f"after --delay-ba 30ms: {after['forward']['p50']:.3f} / {after['reverse']['p50']:.3f}")
    for r in runs:
        assert r["clock_error_bound_ms"] == 0.0 and r["clock_source"] == "same-clock"
        assert r["same_clock"] is True and r["withheld"] is None
        assert abs(r["forward"]["p50"] - 10) <= 1.0 and abs(r["reverse"]["p50"] - 50) <= 1.0
    # an independent reference measured in the same run: iputils ping's RTT (0.1 ms resolution
    # at this RTT, ping_common.c) equals forward + reverse
    assert abs(ping_ms - (statistics.median(fwd) + statistics.median(rev))) <= 1.0
    assert upd.returncode == 0, upd.stderr
    assert json.loads(upd.stdout)["delay_ba_ms"] == 30.0
    assert abs(after["forward"]["p50"] - 10) <= 1.0 and abs(after["reverse"]["p50"] - 30) <= 1.0


def test_unsynchronised_chrony_withholds_against_a_third_party_reflector(lab_factory, tmp_path):
    lab = lab_factory(delay_ab_ms=10, delay_ba_ms=50)
    unsync, sync = fake_chronyc(tmp_path / "u", UNSYNCED), fake_chronyc(tmp_path / "s", SYNCED)
    with served(lab, [sys.executable, str(HERE / "third_party_reflector.py"), lab.b.addr,
                      str(PORT)], "ready"):
        withheld = probe(lab, env=unsync)
        table = probe(lab, count=20, env=unsync, json_out=False)
        shown = probe(lab, env=sync)
    w, s = withheld["owd_ms"], shown["owd_ms"]
    print(f"\nunsynchronised: withheld ({w['withheld']}); variation p99 forward "
          f"{w['variation']['forward']['p99']:.3f} reverse {w['variation']['reverse']['p99']:.3f}"
          f" ms; synchronised: {s['forward']['p50']:.3f} / {s['reverse']['p50']:.3f} ms "
          f"± {s['clock_error_bound_ms']:.3f} ms ({s['clock_source']})")
    assert w["forward"] == dict.fromkeys(("min", "p50", "p90", "p99")) == w["reverse"]
    assert "not synchronised" in w["withheld"] and "chrony" in w["withheld"]
    assert w["clock_error_bound_ms"] is None and w["local_clock"]["source"] == "chrony"
    assert w["same_clock"] is None and "third-party" in w["note"]
    for d in ("forward", "reverse"):   # the variation needs no clock: still there
        var = w["variation"][d]
        assert var["p50"] is not None and 0 <= var["p50"] <= var["p99"] <= var["max"]
    assert "one-way withheld" in table and "clock note" in table   # the text output says it
    # synchronised at 0.75 ms (fake chronyc) + the reflector's declared 1.007 ms
    assert s["withheld"] is None and s["clock_source"] == "chrony/ntp"
    assert s["clock_error_bound_ms"] == pytest.approx(0.75 + 132 * 2 ** -17 * 1e3, abs=1e-6)
    bound = s["clock_error_bound_ms"]
    # load only ever adds delay: each direction's minimum is at least its set value less the bound
    assert s["forward"]["min"] >= 10 - bound - 0.2 and s["reverse"]["min"] >= 50 - bound - 0.2


def test_daemon_path_watch_names_the_queueing_direction(lab_factory, tmp_path):
    lab = lab_factory(delay_ab_ms=10, delay_ba_ms=30)
    state, cfg = tmp_path / "state", tmp_path / "wanprobe.toml"
    cfg.write_text(daemon_toml(
        {"state_dir": state, "metrics_listen": "127.0.0.1:9862", "reflector": False,
         "hostname": "lab-a"}, probe=LAB_PROBE, counters={"enabled": False},
        peers=[{"name": "lab-b", "address": lab.b.addr, "site": "tokyo"}]))
    with our_reflector(lab):
        daemon = lab.a.popen([sys.executable, "-m", "wanprobe", "daemon", "--config", str(cfg)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            time.sleep(8.0)   # 16 sessions: a reference and recent ones
            metrics = lab.a.run([sys.executable, "-c", scrape_command()], capture_output=True,
                                text=True, timeout=30).stdout
            lab.update(queue_ba_ms=15)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not list((state / "reports").glob(
                    "*-lab-b-path.queueing.json")):
                time.sleep(0.25)
        finally:
            daemon.send_signal(signal.SIGTERM)
            log = daemon.communicate(timeout=15)[0]
    reports = list((state / "reports").glob("*-lab-b-path.queueing.json"))
    assert reports, f"no path.queueing report; log:\n{log}"
    finding = json.loads(reports[0].read_text())["findings"][0]
    ev = finding["evidence"]
    print(f"\nqueue b→a: reverse spread {ev['old_reverse_spread_ms']:.2f} -> "
          f"{ev['new_reverse_spread_ms']:.2f} ms, forward {ev['old_forward_spread_ms']:.2f} -> "
          f"{ev['new_forward_spread_ms']:.2f} ms: {ev['direction']}")
    assert ev["direction"] == "reverse" and "way back from lab-b" in finding["title"]
    owd = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'wanprobe_owd_seconds\{[^}]*direction="(\w+)"[^}]*stat="p50"[^}]*\} (\S+)', metrics)}
    assert abs(owd["forward"] - 0.010) <= 0.001 and abs(owd["reverse"] - 0.030) <= 0.001
    assert re.search(r'wanprobe_owd_clock_error_bound_seconds\{[^}]*\} 0\.0', metrics)
