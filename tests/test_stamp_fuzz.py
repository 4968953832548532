"""Fuzz: 10 000 garbage datagrams (hypothesis + scapy fuzz()) at a real reflector on loopback.

After each garbage datagram a valid probe follows on the same socket, so every reply that
arrives before the valid probe's answer belongs to the garbage: it must never be longer than the
garbage was, and the valid probe must always be answered (the reflector stays up)."""

import json
import random
import socket
import struct
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wanprobe.probe import stamp_packet as sp

HYPOTHESIS_EXAMPLES = 400
PER_EXAMPLE = 20          # 400 x 20 = 8000 hypothesis datagrams
SCAPY_DATAGRAMS = 2000

REFLECTOR = """
import asyncio, json, signal
from wanprobe.probe.reflector import Reflector
async def main():
    r = Reflector(rate_pps=1e9, burst=10**9)
    await r.start("127.0.0.1", 0)
    print(r.address[1], flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    d = r.stats().to_json()
    d.pop("sessions")
    print(json.dumps(d), flush=True)
asyncio.run(main())
"""


class Harness:
    """A reflector in its own process (as in production) and a client socket."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", REFLECTOR], stdout=subprocess.PIPE,
                                     text=True)
        self.addr = ("127.0.0.1", int(self.proc.stdout.readline()))
        self.cli = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.cli.settimeout(5.0)
        self.sent = 0
        self.marker = 0

    def check(self, garbage: bytes) -> None:
        try:
            self.cli.sendto(garbage, self.addr)
            self.sent += 1
        except OSError:
            pass  # > 65507 octets cannot be sent at all
        self.marker += 1
        probe = sp.pack_sender(sp.SenderPacket(0x7F000000 | self.marker, 1, 0xFFFF))
        self.cli.sendto(probe, self.addr)
        while True:
            data, _ = self.cli.recvfrom(65536)   # raises TimeoutError if the reflector died
            if len(data) == len(probe) and data[24:28] == probe[:4] and data[14:16] == b"\xff\xff":
                return
            assert len(data) <= len(garbage), (len(data), len(garbage), garbage[:60].hex())

    def close(self) -> dict:
        self.cli.close()
        assert self.proc.poll() is None, "reflector exited"
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        return json.loads(out.strip().splitlines()[-1])


_harness: Harness | None = None

tlv = st.builds(lambda f, t, v, lie: struct.pack("!BBH", f, t, (len(v) + lie) & 0xFFFF) + v,
                st.integers(0, 255), st.sampled_from([0, 1, 2, 3, 4, 5, 7, 8, 12, 200, 244, 255]),
                st.binary(max_size=40), st.sampled_from([0, 0, 0, 1, -1, 100, 60000]))
structured = st.builds(lambda head, tlvs: head + b"".join(tlvs),
                       st.binary(min_size=44, max_size=44), st.lists(tlv, max_size=6))
oversize = st.builds(lambda b, n: (b * (n // len(b) + 1))[:n], st.binary(min_size=1, max_size=8),
                     st.integers(9000, 9400))
datagram = st.one_of(st.binary(max_size=120), structured, oversize)


@settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.lists(datagram, min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
def _hypothesis_batch(batch):
    for g in batch:
        _harness.check(g)


def scapy_garbage(n: int):
    from scapy.contrib import stamp as s
    from scapy.packet import fuzz

    rng = random.Random(862)
    for i in range(n):
        kind = i % 4
        if kind == 0:
            pkt = fuzz(s.STAMPSessionSenderTestUnauthenticated(
                tlv_objects=[fuzz(s.STAMPTestTLV()) for _ in range(rng.randint(0, 4))]))
        elif kind == 1:
            pkt = fuzz(s.STAMPSessionReflectorTestUnauthenticated())
        elif kind == 2:
            pkt = s.STAMPSessionSenderTestUnauthenticated(
                tlv_objects=[fuzz(s.STAMPTestTLV(type=rng.choice([1, 4, 5, 12])))])
        else:
            yield rng.randbytes(rng.randint(0, 200))
            continue
        raw = bytes(pkt)
        yield raw[:rng.randint(0, len(raw))] if rng.random() < 0.2 else raw


@pytest.mark.slow
def test_reflector_survives_10000_garbage_datagrams():
    global _harness
    _harness = Harness()
    try:
        _hypothesis_batch()
        for g in scapy_garbage(SCAPY_DATAGRAMS):
            _harness.check(g)
        sent = _harness.sent
    finally:
        stats = _harness.close()
        _harness = None
    assert sent == HYPOTHESIS_EXAMPLES * PER_EXAMPLE + SCAPY_DATAGRAMS == 10_000
    assert stats["received"] == 2 * sent          # every garbage datagram and marker went through
    assert stats["short"] > 0 and stats["oversize"] > 0 and stats["malformed"] > 0
