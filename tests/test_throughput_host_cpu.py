"""The engine spreads streams over worker processes and says when a host's CPU, not the path,
set the rate (issue 26). Real kernel TCP between two namespaces on a veth pair."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import psutil
import pytest
from test_throughput_netns import ADDR_B, WP_PORT, VethPair
from test_throughput_workers import _workers

from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.lab.netns import entered
from wanprobe.throughput.client import run_throughput
from wanprobe.throughput.datapath_pool import available_cores

pytestmark = [pytest.mark.alone, pytest.mark.netns]

RATE = "1gbit"  # the path's bottleneck: one an unstarved sender fills with CPU to spare


@pytest.fixture
def shaped():
    """veth a→b limited to RATE by tbf on a's egress, a wanprobe server in b."""
    pair = VethPair()
    try:
        pair.up()
        subprocess.run(["ip", "-n", pair.a, "link", "set", "vtp0", "mtu", "1500"], check=True)
        subprocess.run(["tc", "-n", pair.a, "qdisc", "replace", "dev", "vtp0", "root", "tbf",
                        "rate", RATE, "burst", "256kb", "latency", "20ms"], check=True)
        pair.start_wanprobe_server("--max-bytes", str(2**40))
        yield pair
    finally:
        pair.down()


def _run(pair: VethPair, *, cpu: int | None = None) -> dict:
    """One 2 s test from ``a``, in a thread of its own; with ``cpu`` that thread (and so the
    data workers it spawns, which inherit both) runs pinned to that core at nice 19 under SCHED_IDLE."""
    out: dict = {}

    def client() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})            # this thread only (sched_setaffinity(2))
            # SCHED_IDLE, not only nice 19: a sendfile sender needs ~7 % of a core per Gbit/s
            # and a nice-19 sleeper still wins enough wake-ups against the hog to fill the
            # path (one CI run: 0.94 of free); SCHED_IDLE has weight 3 and never preempts a
            # normal task (sched(7)); both are per thread and inherited by the workers
            os.setpriority(os.PRIO_PROCESS, 0, 19)    # nice is per thread on Linux (nice(2))
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        with entered(pair.a):
            out["result"] = run_throughput(ADDR_B, port=WP_PORT, duration_s=2, interval_s=0.5,
                                           max_bytes=2**40, judge=JUDGE).to_json()

    t = threading.Thread(target=client)
    t.start()
    t.join(120)
    assert "result" in out, "the client did not finish"
    return out["result"]


def test_sender_on_one_busy_core_is_host_cpu_not_network(shaped):
    """Same path, same run: unpinned the sender fills the 1 Gbit/s path (not host_cpu); pinned
    at nice 19 (SCHED_IDLE) to one core that a busy loop in its namespace holds, it gets a sliver of that
    core and the verdict says host_cpu, naming the sender. Adds ~12 s."""
    free = _run(shaped)
    cpu = min(os.sched_getaffinity(0))
    hog = subprocess.Popen(["ip", "netns", "exec", shaped.a, "taskset", "-c", str(cpu),
                            sys.executable, "-c", "while True: pass"])
    try:
        starved = _run(shaped, cpu=cpu)
    finally:
        hog.kill()
        hog.wait()
    assert free["limited_by"]["verdict"] != "host_cpu", free["limited_by"]
    assert starved["bits_per_second"] < 0.8 * free["bits_per_second"], (
        starved["bits_per_second"], free["bits_per_second"])
    v = starved["limited_by"]
    assert v["verdict"] == "host_cpu" and v["evidence"]["side"] == "sender", v
    client = starved["cpu"]["client"]
    assert client["cores"] == 1 and client["workers"] == 1 and client["cpu_ids"] == [cpu]


def test_streams_map_to_workers_up_to_cores_and_cpus(shaped):
    """4 streams: one worker per stream up to the cores (and --cpus); every worker reports its
    CPU; none is left running. Adds ~3 s."""
    me = psutil.Process()
    with entered(shaped.a):
        one = run_throughput(ADDR_B, port=WP_PORT, duration_s=1, streams=4, cpus=1,
                             max_bytes=2**40, judge=JUDGE).to_json()
        spread = run_throughput(ADDR_B, port=WP_PORT, duration_s=1, streams=4,
                                max_bytes=2**40, judge=JUDGE).to_json()
    assert one["cpu"]["client"]["workers"] == 1
    assert {s["sender_worker"]["worker_id"] for s in one["streams"]} == {0}
    n = min(4, available_cores())
    assert spread["cpu"]["client"]["workers"] == n
    assert {s["sender_worker"]["worker_id"] for s in spread["streams"]} == set(range(n))
    # the server spreads its receiving streams over its own cores the same way
    assert {s["receiver_worker"]["worker_id"] for s in spread["streams"]} == set(range(n))
    for result in (one, spread):
        for end in ("client", "server"):
            e = result["cpu"][end]
            assert e["data_cpu_seconds"] > 0 and e["elapsed_s"] > 0.5
        assert result["cpu"]["engine_cpu_seconds_per_gigabit"] > 0
        assert all(s["bytes_received"] > 0 and s["error"] is None for s in result["streams"])
    # none left running: a worker may still be exiting as the result arrives (a zombie whose
    # cmdline psutil cannot read; zombies of this process are not workers that run), so
    # wait up to 5 s
    deadline = time.monotonic() + 5.0
    while (left := _workers(me, recursive=True)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], left

