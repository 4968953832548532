"""Issues 19 and 20 in the lab, on loss-free links: at twice a reflector's rate limit `probe`,
`paths --flows 16` and the daemon report path loss of at most 1 % and count the reflector's drops
apart; a sender told the limit paces or refuses; and floods of new sessions, from the prober's own
address or from 64 others, do not turn into forward loss of a 20-probe session."""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import signal
import subprocess
import sys
import time

import pytest
from daemon_toml import daemon_toml, scrape_command
from test_daemon_lab import _metric

from wanprobe.lab import netns
from wanprobe.probe.sender import probe_stamp

pytestmark = pytest.mark.netns
PORT = 862
LIMIT = 500            # the reflector's --rate-limit, probes/s per source (burst 100)


@contextlib.contextmanager
def limited_reflector(lab, limit: int = LIMIT):
    """`wanprobe reflect --rate-limit LIMIT` in namespace b; always stopped."""
    proc = lab.b.popen([sys.executable, "-m", "wanprobe", "reflect", "--bind", lab.b.addr,
                        "--port", str(PORT), "--rate-limit", str(limit)],
                       stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stderr], [], [], 30)
        line = proc.stderr.readline() if ready else ""
        if "STAMP on udp" not in line:
            netns.stop(proc, 10)
            pytest.fail(f"reflector did not start (exit {proc.poll()}): {line!r} "
                        f"{proc.stderr.read()[-500:]!r}")
        yield proc
    finally:
        netns.stop(proc, 10)


def _cli(lab, *args: str) -> subprocess.CompletedProcess:
    return lab.a.run([sys.executable, "-m", "wanprobe", *args], capture_output=True, text=True,
                     timeout=120)


def test_probe_and_paths_at_twice_the_limit(lab_factory):
    """1,000 probes/s against 500/s: sent anyway, the reflector's drops are counted apart and
    the path is loss-free; by default the sender paces to 400/s with one line; asked to refuse,
    it exits 2 with one line naming both rates. `paths --flows 16 --interval 16ms` is the same
    1,000 probes/s (the interval is per flow)."""
    lab = lab_factory(rtt_ms=4)
    with limited_reflector(lab):
        sent = _cli(lab, "probe", lab.b.addr, "--count", "1000", "--interval", "1ms",
                    "--above-limit", "send", "--json")
        paced = _cli(lab, "probe", lab.b.addr, "--count", "600", "--interval", "1ms", "--json")
        refused = _cli(lab, "probe", lab.b.addr, "--count", "600", "--interval", "1ms",
                       "--above-limit", "refuse")
        paths = _cli(lab, "paths", lab.b.addr, "--flows", "16", "--interval", "16ms",
                     "--count", "80", "--above-limit", "send", "--json")
    assert sent.returncode == 0 and paced.returncode == 0, (sent.stderr, paced.stderr)
    doc = json.loads(sent.stdout)
    loss = doc["loss"]
    print("probe:", json.dumps(loss), doc["reflector"])
    assert sent.returncode == 0, sent.stderr
    assert loss["forward_ratio"] <= 0.01 and loss["reverse_ratio"] <= 0.01
    assert loss["ratio"] <= 0.01
    # The bucket admits at most 100 + 500/s x T of N probes sent over T s. Asked for 1,000/s
    # (N = 1,000, T = 1 s) about 400 are the reflector's; a sender held to 700/s by a busy host
    # (T = 1.43 s) still leaves >= 185. At least 100 counted apart, with the path loss-free.
    assert loss["reflector_rate_limited"] >= 100
    assert doc["reflector"]["counts"] == "reported" and doc["reflector"]["limit_pps"] == LIMIT
    assert "rate limit" in doc["reflector"]["note"]

    pdoc = json.loads(paced.stdout)
    lines = paced.stderr.strip().splitlines()
    print("paced:", lines, json.dumps(pdoc["loss"]))
    assert len(lines) == 1 and "1,000 probes/s" in lines[0] and "500" in lines[0]
    assert pdoc["reflector"]["paced_pps"] == 0.8 * LIMIT
    assert pdoc["loss"]["reflector_rate_limited"] <= 6 and pdoc["loss"]["ratio"] <= 0.01

    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "1,000 probes/s" in lines[0] and "500 per second" in lines[0]

    pdoc = json.loads(paths.stdout)
    flows = pdoc["flows"]
    limited = sum(f["loss"]["reflector_rate_limited"] for f in flows)
    print("paths:", [(p["loss_ratio"], p["forward_ratio"], p["reverse_ratio"])
                     for p in pdoc["summary"]["paths"]], "rate-limited", limited)
    assert paths.returncode == 0, paths.stderr
    # 16 x 80 = 1,280 probes at 1,000/s (T = 1.28 s): about 540 dropped by the bucket; a sender
    # held to 600/s (T = 2.13 s) still leaves >= 113. (At 40 per flow a run whose sender reached
    # ~710/s counted 89: the bound assumed the asked rate, so the run is now long enough.)
    assert len(flows) == 16 and limited >= 100
    for p in pdoc["summary"]["paths"]:
        assert p["loss_ratio"] <= 0.01 and p["forward_ratio"] <= 0.01
        assert p["reverse_ratio"] <= 0.01
    assert all(f["loss"]["forward_ratio"] <= 0.01 for f in flows)
    assert "rate limit" in pdoc["reflector"]["note"]


def test_daemon_at_twice_the_limit_keeps_reflector_drops_out_of_loss(lab_factory, tmp_path):
    """400-probe sessions at 1,000/s against 500/s: the first session's drops are the
    reflector's, not loss; told the limit, the daemon paces the peer's next sessions to 400/s
    (one line naming the rates) and they lose nothing to the reflector."""
    lab = lab_factory(rtt_ms=4)
    cfg = tmp_path / "wanprobe.toml"
    cfg.write_text(daemon_toml(
        {"state_dir": tmp_path / "state", "metrics_listen": "127.0.0.1:9862",
         "reflector_listen": [f"{lab.a.addr}:862"]},
        probe={"interval": "2s", "jitter": "100ms", "count": 400, "packet_interval": "1ms",
               "timeout": "300ms"},
        counters={"enabled": False},
        peers=[{"name": "lab-b", "address": lab.b.addr, "methods": ["stamp"]}]))
    lab_b = {"peer": "lab-b", "method": "stamp"}

    def scrape_when(sessions: int) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.5)
            text = lab.a.run([sys.executable, "-c", scrape_command()], capture_output=True,
                             text=True, timeout=30).stdout
            if (_metric(text, "wanprobe_probe_sessions_total", **lab_b) or 0) >= sessions:
                return text
        pytest.fail(f"fewer than {sessions} sessions in 30 s")

    with limited_reflector(lab):
        daemon = lab.a.popen([sys.executable, "-m", "wanprobe", "daemon", "--config", str(cfg)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            first = scrape_when(1)
            later = scrape_when(3)
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=15)
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait(10)
    log = daemon.stdout.read()

    def drops(text: str) -> float:
        return _metric(text, "wanprobe_probe_reflector_drops_total", cause="rate_limited",
                       **lab_b) or 0

    sessions = _metric(later, "wanprobe_probe_sessions_total", **lab_b)
    sent = _metric(later, "wanprobe_probe_packets_sent_total", **lab_b)
    lost = {d: _metric(later, "wanprobe_probe_packets_lost_total", direction=d, **lab_b) or 0
            for d in ("forward", "reverse", "round_trip")}
    print(f"{sessions} sessions, sent {sent}, reflector drops {drops(first)} in the first, "
          f"{drops(later)} in all, lost {lost}")
    assert sent == 400 * sessions, log
    assert drops(first) >= 40                        # ~100: 400 probes against 100 + 200 tokens
    assert drops(later) - drops(first) <= 0.01 * 400 * (sessions - 1)   # paced: none
    assert all(n <= 0.01 * sent for n in lost.values()), lost
    assert _metric(later, "wanprobe_loss_ratio", direction="forward", **lab_b) <= 0.01
    told = [ln for ln in log.splitlines() if "reflector limit" in ln]
    assert len(told) == 1 and "pacing its sessions" in told[0], log
    assert all(f in told[0] for f in ("reflector_limit_pps=500", "probe_pps=1000",
                                      "paced_pps=400"))


# -- floods of new sessions (issue 19) -----------------------------------------------------------

FLOOD = r"""
import socket, struct, sys, time
dest, port, rate, duration = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
socks = []
for src in sys.argv[5:]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((src, 0))
    socks.append(s)
pkt = struct.Struct("!IQHH28x")   # the issue's reproducer: packet n is number n, SSID n
n, t0 = 0, time.monotonic()
print("flooding", flush=True)
while time.monotonic() - t0 < duration:
    due = int((time.monotonic() - t0) * rate)
    while n < due:
        socks[n % len(socks)].sendto(pkt.pack(n, 0, 1, n & 0xFFFF or 1), (dest, port))
        n += 1
    time.sleep(0.002)
print(n, flush=True)
"""


REFLECTOR = r"""
import asyncio, json, signal, sys
from wanprobe.probe.reflector import Reflector

async def main():
    refl = Reflector(sessions_per_source=int(sys.argv[3]), max_sessions=int(sys.argv[4]))
    await refl.start(sys.argv[1], int(sys.argv[2]))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await stop.wait()
    await refl.close()
    st = refl.stats()
    print(json.dumps({"evicted": st.evicted, "session_refused": st.session_refused,
                      "received": st.received}), flush=True)

asyncio.run(main())
"""


@contextlib.contextmanager
def small_table_reflector(lab, got: dict):
    """Our reflector in namespace b, in its own process, with a small session table (32 per
    source, 128 in all) so 2,000 packets a second cycle it within a probe interval, as the
    issue's floods cycled the default table. Its counters land in ``got`` when it stops."""
    proc = lab.b.popen([sys.executable, "-c", REFLECTOR, lab.b.addr, str(PORT), "32", "128"],
                       stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
        got.update(json.loads(out.strip().splitlines()[-1]) if out.strip() else {})


def _probe_during_flood(lab, sources: list[str], interval_s: float, rate: float = 2000):
    got: dict = {}
    with small_table_reflector(lab, got):
        flood = lab.a.popen([sys.executable, "-c", FLOOD, lab.b.addr, str(PORT), str(rate),
                             str(20 * interval_s + 3), *sources], stdout=subprocess.PIPE,
                            text=True)
        try:
            assert flood.stdout.readline().strip() == "flooding"
            time.sleep(0.5)   # the table is full of flood sessions before the prober starts
            with lab.a.entered():
                res = asyncio.run(probe_stamp(lab.b.addr, port=PORT, count=20,
                                              interval_s=interval_s, timeout_s=1.0))
        finally:
            flood.terminate()
            flood.wait(10)
    print(json.dumps(res.loss.to_json()), got)
    return res, got


def test_session_floods_do_not_fake_forward_loss(lab_factory):
    lab = lab_factory(rtt_ms=4)
    extra = [f"198.18.100.{i}" for i in range(1, 65)]
    netns.batch(lab.a.name, [f"addr add {a}/32 dev {lab.a.ifname}" for a in extra])
    netns.batch(lab.b.name, [f"route add 198.18.100.0/24 dev {lab.b.ifname}"])
    # from the prober's own address at 2,000 packets/s: 100 new sessions per probe interval,
    # its share holds 32; from 64 addresses at 2,000/s: 200 per interval, the table holds 128
    for sources, interval_s in (([lab.a.addr], 0.05), (extra, 0.1)):
        res, got = _probe_during_flood(lab, sources, interval_s)
        assert got["evicted"] > 1000, "the flood did not cycle the session table"
        assert res.loss.forward_lost is not None and res.loss.forward_lost <= 1
        assert res.loss.forward_of >= 18   # measured over the session, not lost in resets
        assert res.loss.received >= 19
