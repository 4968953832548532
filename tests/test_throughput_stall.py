"""Issue 37: a reverse test whose client never reads ended 20.6 s after it started, though the
README says such a test ends within 10 s (stall.STALL_S). The stall check compared the streams'
byte counts only every STALL_S, so the first comparison came at the second wake. Here with the
real STALL_S, on loopback: the server's test and its sockets are gone within STALL_S + 2 s of the
start (the client takes nothing, so its last byte is the start)."""

from __future__ import annotations

import time

import pytest
from reflector_helpers import ServedThroughput
from test_throughput_hostile import reverse_never_read, server_sockets

from wanprobe.throughput.stall import STALL_S


@pytest.mark.lab
def test_reverse_test_with_a_client_that_never_reads_ends_within_the_stall_time():
    assert STALL_S == 10.0   # the README's figure
    with ServedThroughput(max_duration_s=60.0) as server:
        c, data = reverse_never_read(server.port, duration_s=40.0, streams=2, max_bytes=2**32)
        t0 = time.monotonic()
        bound = STALL_S + 2.0
        while time.monotonic() - t0 < 25.0 and (server._tests or server_sockets(server.port)):
            time.sleep(0.1)
        took = time.monotonic() - t0
        for s in [*data, c.sock]:
            s.close()
    assert took <= bound, f"the test ended {took:.1f} s after its start (bound {bound:g} s)"
    assert took >= STALL_S - 0.5, f"ended after {took:.1f} s: before the stall time"
