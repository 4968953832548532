"""Issue 37's flood, scaled, between two namespaces: 64 source addresses in the client namespace
fill the reflector's whole session table with sessions that look active (64 x 16 of 1,024, as
the issue's 64 x 1,024 of 65,536) and go on probing them, while a prober at another address
opens one new session after another, as the daemon does. Every one of its sessions is admitted
and answered, forward loss 0 within its interval.

Unkeyed, the flood is the issue's: distinct SSIDs per source, probes numbered 0, 1, 2, ...
Keyed (authenticated mode), unsigned datagrams never reach the table (RFC 8762 §4.4), so the
flood is what an attacker without the key can still send: two captured probes of one session
replayed from every (source, port) as new sessions, beside the unsigned flood."""

from __future__ import annotations

import asyncio
import socket
import struct
import subprocess
import threading
import time

import pytest
import test_throughput_netns as tpn
from reflector_helpers import KEY, LoopThread
from test_stamp_auth import auth_sender_bytes

from wanprobe.lab.netns import entered
from wanprobe.probe.reflector import Reflector
from wanprobe.probe.sender import probe_stamp

pytestmark = [pytest.mark.alone, pytest.mark.netns]
PORT = 5330
SOURCES, PER_SOURCE = 64, 16          # the issue: 64 x 1,024 (its per-source share)
TABLE = SOURCES * PER_SOURCE
ROUND_S = 0.25                        # every flood session probes this often: all look active
FLOOD = struct.Struct("!IQHH28x")     # the reproducer's packet: seq, timestamp, error, SSID
veth = tpn.veth


def _flood_sources(pair) -> list[str]:
    addrs = [f"198.19.0.{100 + i}" for i in range(SOURCES)]
    batch = "".join(f"addr add {a}/24 dev vtp0\n" for a in addrs)
    subprocess.run(["ip", "-n", pair.a, "-batch", "-"], input=batch, text=True, check=True)
    return addrs


def _flood(pair, addrs: list[str], keyed: bool, stop: threading.Event, rounds: list[int]) -> None:
    """Round after round, one probe of every flood session, paced to about 10 kpps (the
    reflector must keep up: the point is the table, not the socket's queue)."""
    captured = [auth_sender_bytes(seq, 0, 4242, KEY) for seq in (0, 1)]
    with entered(pair.a):
        per_src = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in addrs]
        for s, a in zip(per_src, addrs, strict=True):
            s.bind((a, 0))
        replayers = []
        if keyed:   # one (source, port) per replayed session
            for a in addrs:
                for _ in range(PER_SOURCE):
                    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    s.bind((a, 0))
                    replayers.append(s)
    dest, n = (tpn.ADDR_B, PORT), 0
    try:
        while not stop.is_set():
            t0, seq = time.monotonic(), rounds[0]
            for s in per_src:
                for ssid in range(PER_SOURCE):
                    s.sendto(FLOOD.pack(seq, 0, 1, ssid), dest)
                    n += 1
                    if n % 25 == 0:
                        time.sleep(0.002)
            for s in replayers:
                s.sendto(captured[min(seq, 1)], dest)
                n += 1
                if n % 25 == 0:
                    time.sleep(0.002)
            rounds[0] += 1
            stop.wait(max(0.0, ROUND_S - (time.monotonic() - t0)))
    finally:
        for s in per_src + replayers:
            s.close()


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
def test_a_table_full_of_flood_sessions_still_admits_a_probers_new_sessions(veth, keyed):
    key = KEY if keyed else None
    addrs = _flood_sources(veth)
    lt = LoopThread()

    async def start() -> Reflector:
        r = Reflector(hmac_key=key, max_sessions=TABLE, sessions_per_source=PER_SOURCE,
                      rate_pps=1e6, burst=10**5)
        with entered(veth.b):   # the socket belongs to the reflector's namespace
            await r.start(tpn.ADDR_B, PORT)
        return r

    r = lt.run(start())
    stop, rounds = threading.Event(), [0]
    flooder = threading.Thread(target=_flood, args=(veth, addrs, keyed, stop, rounds),
                               daemon=True)
    flooder.start()
    results = []
    try:
        deadline = time.monotonic() + 20
        while (rounds[0] < 3 or len(r.stats().sessions) < TABLE) and time.monotonic() < deadline:
            time.sleep(0.05)
        full = r.stats()
        assert len(full.sessions) == TABLE, "the flood did not fill the table"
        with entered(veth.a):
            for _ in range(4):   # the daemon: a new session (a new SSID) per interval
                results.append(asyncio.run(probe_stamp(
                    tpn.ADDR_B, port=PORT, count=20, interval_s=0.02, timeout_s=0.5,
                    hmac_key=key)))
        after = r.stats()
    finally:
        stop.set()
        flooder.join(10)
        lt.run(r.close())
        lt.stop()
    print(f"{'keyed' if keyed else 'unkeyed'}: flood {rounds[0]} rounds, received "
          f"{after.received}, table {len(after.sessions)}/{TABLE}, new sessions refused "
          f"{after.session_refused}, reclaimed {after.reclaimed}, auth failed "
          f"{after.auth_failed}, replays {after.replayed}; prober: "
          + ", ".join(f"{x.loss.received}/{x.loss.sent} fwd {x.loss.forward_lost} "
                      f"ci95 {x.loss.forward_ci95}" for x in results))
    assert len(after.sessions) == TABLE and after.session_refused > 0   # the flood's own refused
    assert after.reclaimed >= 1 and (after.auth_failed > 0) == keyed
    for x in results:
        loss = x.loss
        assert loss.reflector_session_refused == 0 and loss.reflector_resets == 0
        assert loss.received == loss.sent == 20
        assert loss.forward_lost == 0 and loss.forward_ci95[0] == 0.0
