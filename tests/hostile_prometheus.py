"""A hostile fake Prometheus on loopback (issue 37): absurd figures, a huge number of series,
a body dripped a byte at a time, a Content-Length it never sends. Used by
tests/test_fleet_hostile_prometheus.py and bench/fleet_hostile_prometheus.py.

Every answer is built as text from a template, so 150,000 series cost the serving process
their bytes only, not the Python objects of ``json.dumps``.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse


def _labels(i: int) -> str:
    return (f'"__name__":"x","src_site":"tpe","dst_site":"usw","src_host":"tpe-{i}",'
            f'"dst_host":"usw-{i}"')


def answer(kind: str, result: str) -> bytes:
    return f'{{"status":"success","data":{{"resultType":"{kind}","result":[{result}]}}}}'.encode()


def many_series(kind: str, n: int, at_s: float) -> bytes:
    """``n`` series of one host pair each, one point at ``at_s`` (value 1e6)."""
    point = f'[{at_s:.3f},"1000000"]'
    key, value = ("value", point) if kind == "vector" else ("values", f"[{point}]")
    return answer(kind, ",".join(f'{{"metric":{{{_labels(i)}}},"{key}":{value}}}'
                                 for i in range(n)))


def filling(n: int, size: int) -> bytes:
    """A matrix answer of ``n`` series whose points fill about ``size`` bytes in all."""
    per_point = len('[1700000000.000,"1000000"],')
    points = ",".join(f'[{1700000000 + k}.000,"1000000"]'
                      for k in range(max(1, (size // n - 200) // per_point)))
    return answer("matrix", ",".join(f'{{"metric":{{{_labels(i)}}},"values":[{points}]}}'
                                     for i in range(n)))


def one_figure(kind: str, value: str, start_s: float, end_s: float) -> bytes:
    """One site-pair series whose every point is ``value`` (text, as Prometheus sends it)."""
    metric = '{"src_site":"tpe","dst_site":"usw"}'
    if kind == "vector":
        return answer(kind, f'{{"metric":{metric},"value":[{end_s:.3f},"{value}"]}}')
    points = ",".join(f'[{start_s + k * 3600:.3f},"{value}"]'
                      for k in range(int((end_s - start_s) // 3600) + 1))
    return answer(kind, f'{{"metric":{metric},"values":[{points}]}}')


class Fake:
    """What the server does with each GET: ``respond(handler, kind, params)``."""

    def __init__(self, respond: Callable[[BaseHTTPRequestHandler, str, dict], None]) -> None:
        self.respond = respond
        self.stop = threading.Event()
        self.requests = 0


def send(handler: BaseHTTPRequestHandler, body: bytes) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    with contextlib.suppress(OSError):
        handler.wfile.write(body)


def fixed(body: bytes) -> Fake:
    """Every query answers ``body``."""
    return Fake(lambda h, kind, q: send(h, body))


def figures(value: str) -> Fake:
    """Every query answers one series tpe -> usw whose points are all ``value``."""
    def respond(h, kind, q):
        end = float(q.get("end", q.get("time", [time.time()]))[0])
        send(h, one_figure(kind, value, float(q.get("start", [end])[0]), end))
    return Fake(respond)


def series(n: int) -> Fake:
    """Every query answers ``n`` series (the body built once per kind)."""
    cache: dict[str, bytes] = {}

    def respond(h, kind, q):
        if kind not in cache:
            cache[kind] = many_series(kind, n, float(q.get("end", q.get("time", [time.time()]))[0]))
        send(h, cache[kind])
    return Fake(respond)


def drip(every_s: float, *, in_headers: bool) -> Fake:
    """One byte every ``every_s`` until the client goes: of the status line, or of a body
    after complete headers (without a Content-Length)."""
    fake: Fake

    def respond(h, kind, q):
        data = b"HTTP/1.1 200 OK\r\n" if in_headers else b" " * 10**6
        if not in_headers:
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.end_headers()
            h.wfile.flush()
        for i in range(len(data)):
            if fake.stop.wait(every_s):
                return
            try:
                h.connection.sendall(data[i:i + 1])
            except OSError:
                return
    fake = Fake(respond)
    return fake


def claims(length: int) -> Fake:
    """Headers announcing ``length`` bytes, then nothing until the client goes."""
    fake: Fake

    def respond(h, kind, q):
        h.send_response(200)
        h.send_header("Content-Length", str(length))
        h.end_headers()
        h.wfile.flush()
        fake.stop.wait(60)
    fake = Fake(respond)
    return fake


def endless() -> Fake:
    """A body without a Content-Length that never ends (1 MiB at a time)."""
    fake: Fake

    def respond(h, kind, q):
        h.send_response(200)
        h.end_headers()
        chunk = b"[" * 2**20
        while not fake.stop.is_set():
            try:
                h.wfile.write(chunk)
            except OSError:
                return
    fake = Fake(respond)
    return fake


@contextlib.contextmanager
def serving(fake: Fake) -> Iterator[str]:
    """Serve ``fake`` on 127.0.0.1 in threads; yields its base URL."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802 - http.server's name
            fake.requests += 1
            url = urlparse(self.path)
            kind = "matrix" if url.path.endswith("query_range") else "vector"
            fake.respond(self, kind, parse_qs(url.query))
            self.close_connection = True

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        fake.stop.set()
        server.shutdown()
        server.server_close()


# Runs the CLI and, at exit, writes the process's VmHWM (peak RSS of its own memory since
# exec). Not ru_maxrss: after a vfork and exec it also holds the parent's peak (pytest's).
_MEASURED = """
import atexit, runpy, sys
out = sys.argv.pop(1)
def hwm():
    with open("/proc/self/status") as f:
        kib = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))
    with open(out, "w") as f:
        f.write(str(kib * 1024))
atexit.register(hwm)
runpy.run_module("wanprobe", run_name="__main__", alter_sys=True)
"""


def run_measured(argv: list[str], tmp: Path) -> tuple[int, str, int, float]:
    """(exit code, stderr, peak RSS in bytes, wall seconds) of ``wanprobe ARGV`` run as its
    own process."""
    err, hwm = tmp / "err", tmp / "hwm"
    t0 = time.perf_counter()
    with err.open("wb") as e:
        code = subprocess.run([sys.executable, "-c", _MEASURED, str(hwm), *argv], stderr=e,
                              stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL).returncode
    wall = time.perf_counter() - t0
    return code, err.read_text(), int(hwm.read_text()), wall
