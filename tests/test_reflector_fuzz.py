"""Fuzz the throughput control protocol (issue 14): 6,000 seeded hostile conversations against a
real server on loopback, which must answer each with at most a one-line refusal, never hit its
"server error" path, and still run a real test afterwards (keyed and unkeyed)."""

from __future__ import annotations

import asyncio
import json
import math
import random

import pytest
from reflector_helpers import KEY, ServedThroughput

from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.throughput import protocol as proto
from wanprobe.throughput.client import run_throughput
from wanprobe.throughput.limits import ServerLimits

# a real server process under fuzz (the fast tier, `pytest -m 'not lab'`, leaves it to CI)
pytestmark = pytest.mark.lab

CASES = 6000
SEED = 14

VALUES = [0, 1, -1, 2, 7, 2**31, 2**62, 2**64 + 1, 10**40, -10**40, 0.0, -0.0, 1e-9, 1e-300,
          1e300, math.nan, math.inf, -math.inf, 0.5, 60.0, 1e9, "", "x", "10", "nan", "bbr",
          "\u202e\u0000", "é" * 40, None, True, False, [], [1, 2], {}, {"a": 1}]
FIELDS = ["duration_s", "streams", "reverse", "bidir", "cc", "window_bytes", "dscp",
          "pacing_rate_bps", "udp", "udp_rate_bps", "udp_packet_bytes", "interval_s", "max_bytes"]


def _value(rng: random.Random):
    if rng.random() < 0.05:
        depth = rng.choice([5, 50, 5000])
        return json.loads("[" * depth + "]" * depth) if depth < 900 else "[" * depth
    return rng.choice(VALUES)


def _json_line(obj) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def _hello(rng: random.Random) -> bytes:
    r = rng.random()
    if r < 0.7:
        return _json_line({"op": "hello", "version": proto.VERSION, "nonce": rng.randbytes(16).hex()})
    body = {"op": rng.choice(["hello", "test", "start", "HELLO", 3, None])}
    for k in rng.sample(["version", "nonce", "test", "mac"], rng.randint(0, 4)):
        body[k] = rng.choice([_value(rng), proto.VERSION, "00" * 16, "zz" * 16, "0" * 31])
    return _json_line(body)


def _op(rng: random.Random) -> bytes:
    test = {"duration_s": 0.2, "max_bytes": 10**5}
    for k in rng.sample(FIELDS, rng.randint(0, 5)):
        test[k] = _value(rng)
    msg = {"op": rng.choice(["test", "test", "test", "host_facts", "start", "", "x" * 300]),
           "test": test if rng.random() < 0.9 else _value(rng)}
    if rng.random() < 0.3:
        msg["mac"] = rng.choice([rng.randbytes(32).hex(), "", 5, None])
    return _json_line(msg)


def case(rng: random.Random) -> bytes:
    """One hostile conversation, as the bytes a client sends before it half-closes."""
    kind = rng.random()
    if kind < 0.1:
        return rng.randbytes(rng.randint(0, 300))
    if kind < 0.2:
        return proto.MAGIC_CONTROL + rng.randbytes(rng.randint(0, 300))
    if kind < 0.25:
        return proto.MAGIC_DATA + rng.randbytes(rng.randint(0, 20))
    raw = proto.MAGIC_CONTROL + _hello(rng) + _op(rng)
    if rng.random() < 0.2:  # damage it: cut, flip a byte, drop the newlines
        i = rng.randrange(len(raw))
        raw = rng.choice([raw[:i], raw[:i] + bytes([raw[i] ^ 0xFF]) + raw[i + 1:],
                          raw.replace(b"\n", b"")])
    return raw


async def _converse(port: int, raw: bytes, sem: asyncio.Semaphore) -> bytes:
    async with sem:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(raw)
            await writer.drain()
            writer.write_eof()
            async with asyncio.timeout(10):
                return await reader.read()
        except (ConnectionError, OSError):
            return b""  # a reset: the server dropped the garbage at once
        finally:
            writer.close()


async def _run_all(port: int, cases: list[bytes]) -> list[bytes]:
    sem = asyncio.Semaphore(48)
    return await asyncio.gather(*(_converse(port, raw, sem) for raw in cases))


@pytest.mark.parametrize("key", [None, KEY], ids=["unkeyed", "keyed"])
def test_fuzzed_control_conversations_never_break_the_server(key):
    rng = random.Random(SEED if key is None else SEED + 1)
    cases = [case(rng) for _ in range(CASES // 2)]
    limits = ServerLimits(handshake_timeout_s=2.0, max_duration_s=5.0,
                          tests_per_hour=10**6, tests_per_hour_per_client=10**6)
    with ServedThroughput(limits=limits, hmac_key=key) as server:
        replies = asyncio.run(_run_all(server.port, cases))
        errors = [r for r in replies if b"server error" in r]
        assert not errors, errors[:3]
        for reply in replies:
            lines = reply.splitlines()
            ops = [json.loads(x)["op"] for x in lines]  # every reply line is one JSON object
            assert ops.count("refused") <= 1 and len(lines) <= 3, reply[:300]
        refused = sum(server.refusals().values())
        print(f"{len(cases)} cases: {refused} refusals {dict(server.refusals())}")
        assert refused > len(cases) // 2
        r = run_throughput("127.0.0.1", port=server.port, duration_s=0.5, max_bytes=10**6,
                           hmac_key=key, judge=JUDGE)
        assert not r.partial and r.bytes_received == 10**6
