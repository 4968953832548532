"""`wanprobe reflect` as the far site runs it, attacked from another namespace (issue 14):
outside ``--allow`` nothing is answered; idle and oversized connections cannot grow the server
past 200 MiB nor stop a keyed test; the issue's session-table flood does not lock out a probe."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest
import test_throughput_netns as tpn
from reflector_helpers import KEY

from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.errors import ProbeError
from wanprobe.lab.netns import entered
from wanprobe.probe.sender import probe_stamp
from wanprobe.throughput.client import run_throughput

pytestmark = pytest.mark.netns
PORT = 5310
RSS_LIMIT = 200 * 2**20


veth = tpn.veth  # the client/server namespace pair fixture (198.19.0.1 / 198.19.0.2)


def start_reflect(pair, port: int, *args: str, key_file=None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "wanprobe", "reflect", "--bind", tpn.ADDR_B, "--port", str(port),
            *args]
    if key_file is not None:
        argv += ["--hmac-key-file", str(key_file)]
    proc = pair.popen_b(argv, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    assert "STAMP on udp" in line, line
    return proc


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    return " ".join(proc.communicate(timeout=10)[1].split())


def test_outside_allow_no_stamp_reply_and_tcp_refused(veth):
    """The client (198.19.0.1) is outside --allow 10.0.0.0/8: its probes get no reply and its
    throughput connection is closed unread; a reflector allowing its network serves it."""
    denied = start_reflect(veth, PORT, "--allow", "10.0.0.0/8")
    allowed = start_reflect(veth, PORT + 1, "--allow", "198.19.0.0/24", "--allow", "10.0.0.0/8")
    with entered(veth.a):
        res = asyncio.run(probe_stamp(tpn.ADDR_B, port=PORT, count=5, interval_s=0.05,
                                      timeout_s=0.5))
        assert res.loss.received == 0
        with pytest.raises(ProbeError, match="closed the control connection|refused|reset"):
            run_throughput(tpn.ADDR_B, port=PORT, duration_s=1, max_bytes=10**6, judge=JUDGE)
        ok = asyncio.run(probe_stamp(tpn.ADDR_B, port=PORT + 1, count=5, interval_s=0.05,
                                     timeout_s=0.5))
        assert ok.loss.received == 5
        r = run_throughput(tpn.ADDR_B, port=PORT + 1, duration_s=1, max_bytes=10**6, judge=JUDGE)
        assert not r.partial and r.bytes_received == 10**6
    summary = stop(denied)
    assert "5 from outside --allow" in summary and "not_allowed 1" in summary, summary
    assert "0 from outside --allow" in stop(allowed)


def _rss_sampler(pid: int, stop_event: threading.Event, peak: list[int]) -> None:
    proc = psutil.Process(pid)
    while not stop_event.is_set():
        try:
            rss = sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])
        except psutil.Error:
            return
        peak[0] = max(peak[0], rss)
        time.sleep(0.05)


def _send_big_line(sock: socket.socket, result: list) -> None:
    try:
        sock.sendall(b"WPTC" + b"a" * (10 * 2**20))  # 10 MB, no newline
    except OSError as exc:
        result.append(exc.errno)  # reset after the server refused it: expected
    try:
        result.append(sock.recv(4096))
    except OSError:
        result.append(b"")


def test_idle_connections_and_a_huge_line_leave_a_keyed_test_working(veth, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)
    server = start_reflect(veth, PORT, key_file=key_file)
    pid = psutil.Process(server.pid).children(recursive=True)
    pid = pid[-1].pid if pid else server.pid  # ip netns exec execs; keep the python process
    peak, stop_event = [0], threading.Event()
    sampler = threading.Thread(target=_rss_sampler, args=(pid, stop_event, peak), daemon=True)
    sampler.start()
    idle: list[socket.socket] = []
    big_result: list = []
    try:
        with entered(veth.a):
            for i in range(300):
                s = socket.create_connection((tpn.ADDR_B, PORT), timeout=5)
                s.sendall([b"", b"WPTC", b'WPTC{"op":"hello","vers'][i % 3])
                idle.append(s)
            big = socket.create_connection((tpn.ADDR_B, PORT), timeout=10)
            sender = threading.Thread(target=_send_big_line, args=(big, big_result))
            sender.start()
            r = run_throughput(tpn.ADDR_B, port=PORT, duration_s=2, max_bytes=2**30, hmac_key=KEY,
                               judge=JUDGE)
            sender.join(20)
            big.close()
        assert not r.partial and r.bytes_received > 0, r.partial_reason
    finally:
        stop_event.set()
        for s in idle:
            s.close()
        sampler.join(2)
        summary = stop(server)
    print(f"server peak RSS {peak[0] / 2**20:.1f} MiB with 300 idle connections, a 10 MB line "
          f"and a keyed {r.bits_per_second / 1e9:.1f} Gbit/s test; {summary.strip()}")
    assert 0 < peak[0] < RSS_LIMIT
    assert any(isinstance(x, bytes) and b"longer than" in x for x in big_result) or \
        "line_too_long 1" in summary, (big_result, summary)


@pytest.mark.alone
@pytest.mark.slow
def test_issue_session_flood_reproducer_does_not_lock_out_a_probe(veth):
    """The issue's reproducer verbatim: 65,536 distinct SSIDs at 4.5 kpps from the client
    namespace, then `wanprobe probe PEER --count 20`: every probe answered, and the reflector
    spent well under a core on the flood (it used to scan the table per packet)."""
    server = start_reflect(veth, 862)
    proc = psutil.Process(server.pid)
    proc = (proc.children(recursive=True) or [proc])[-1]
    cpu0 = sum(proc.cpu_times()[:2])
    t0 = time.monotonic()
    flood = ("import socket,struct,time;s=socket.socket(2,2);s.connect((\"PEER\",862));"
             "[(s.send(struct.pack(\"!IQHH28x\",i,0,1,i)),time.sleep(1/4500)) for i in "
             "range(65536)]").replace("PEER", tpn.ADDR_B)
    subprocess.run(["ip", "netns", "exec", veth.a, sys.executable, "-c", flood], check=True,
                   timeout=120)
    flood_s = time.monotonic() - t0
    cpu_s = sum(proc.cpu_times()[:2]) - cpu0
    out = subprocess.run(["ip", "netns", "exec", veth.a, sys.executable, "-m", "wanprobe",
                          "probe", tpn.ADDR_B, "--count", "20", "--interval", "50ms", "--json"],
                         capture_output=True, text=True, timeout=60)
    summary = stop(server)
    import json

    doc = json.loads(out.stdout)
    print(f"flood {flood_s:.1f} s, reflector CPU {cpu_s:.1f} s ({100 * cpu_s / flood_s:.0f} % of "
          f"a core); probe after it: {doc['loss']['received']}/20; {summary.strip()}")
    assert doc["loss"]["received"] == 20
    assert cpu_s < 0.9 * flood_s
