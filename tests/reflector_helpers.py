"""Shared pieces of the reflector security tests: a server on a background event loop, and a
hand-driven control connection (what a hostile or replaying client sends)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading

from wanprobe.throughput import auth
from wanprobe.throughput import protocol as proto
from wanprobe.throughput.server import ThroughputServer

KEY = b"0123456789abcdef-reflector-key"


class LoopThread:
    """An asyncio loop in a daemon thread; ``run(coro)`` waits for a coroutine's result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class Served:
    """A server object (``make(**kwargs)``, with ``start(host, port)`` and ``close()``) on
    127.0.0.1, port 0, in its own loop thread (context manager)."""

    def __init__(self, make, **kwargs) -> None:
        self.make, self.kwargs = make, kwargs

    def __enter__(self):
        self.lt = LoopThread()

        async def start():  # asyncio objects belong in their loop
            obj = self.make(**self.kwargs)
            await obj.start("127.0.0.1", 0)
            return obj

        self.server = self.lt.run(start())
        return self.server

    def __exit__(self, *exc) -> None:
        self.lt.run(self.server.close())
        self.lt.stop()


class ServedThroughput(Served):
    def __init__(self, **kwargs) -> None:
        super().__init__(ThroughputServer, **kwargs)


def request_body(**fields) -> dict:
    return {"duration_s": 1.0, "max_bytes": 10**6, **fields}


class Control:
    """One control connection driven by hand: hello, challenge, an op line, replies."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.rfile = self.sock.makefile("rb")
        self.client_nonce = os.urandom(auth.NONCE_BYTES)
        self.server_nonce: bytes | None = None

    def hello(self, version: int = proto.VERSION) -> dict:
        self.sock.sendall(proto.MAGIC_CONTROL + proto.encode(
            "hello", version=version, nonce=self.client_nonce.hex()))
        reply = self.read()
        if reply.get("op") == "challenge":
            self.server_nonce = bytes.fromhex(reply["nonce"])
        return reply

    def op_line(self, op: str, key: bytes | None = None, **body) -> bytes:
        msg = {"op": op, **body}
        if key is not None:
            msg = auth.sign_request(key, self.server_nonce, self.client_nonce, msg)
        return (json.dumps(msg, separators=(",", ":")) + "\n").encode()

    def send(self, raw: bytes) -> dict:
        self.sock.sendall(raw)
        return self.read()

    def read(self) -> dict:
        line = self.rfile.readline(proto.MAX_LINE_BYTES)
        return json.loads(line) if line else {"op": "<closed>"}

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()
