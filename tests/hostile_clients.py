"""Hostile HTTP(S) clients for the listener tests, run as a process inside a lab namespace:

    python hostile_clients.py slow HOST PORT N SECONDS
        N clients that each open a connection and dribble one byte every 2 s (a TLS handshake
        or request head that never completes), opening a new one whenever theirs is closed;
    python hostile_clients.py nonreading HOST PORT N SECONDS CA USER PASSWORD
        N clients that complete TLS, ask for /metrics with a valid password and never read
        (a 4 KiB receive buffer), each renewed every 6 s.

Prints one line, ``opened=K``, the connections opened, when SECONDS are over (or on SIGTERM)."""

from __future__ import annotations

import base64
import signal
import socket
import ssl
import sys
import threading
import time

opened = 0
lock = threading.Lock()
stop = threading.Event()


def _count() -> None:
    global opened
    with lock:
        opened += 1


def slow(host: str, port: int) -> None:
    while not stop.is_set():
        try:
            s = socket.create_connection((host, port), timeout=5)
        except OSError:
            stop.wait(0.5)
            continue
        _count()
        try:
            while not stop.is_set():
                s.sendall(b"\x16")   # a TLS record type, then nothing more of it
                if stop.wait(2.0):
                    break
                s.setblocking(False)
                try:
                    if s.recv(1) == b"":
                        break        # closed by the server: open another
                except BlockingIOError:
                    pass
                s.setblocking(True)
        except OSError:
            pass
        finally:
            s.close()


def nonreading(host: str, port: int, ca: str, user: str, password: str) -> None:
    ctx = ssl.create_default_context(cafile=ca)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = (f"GET /metrics HTTP/1.1\r\nHost: {host}\r\nAuthorization: Basic {token}\r\n\r\n"
               ).encode()
    while not stop.is_set():
        try:
            raw = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            raw.settimeout(5)
            raw.connect((host, port))
            s = ctx.wrap_socket(raw, server_hostname=host)
            s.sendall(request)
            _count()
        except OSError:
            stop.wait(0.5)
            continue
        stop.wait(6.0)
        s.close()


def main(argv: list[str]) -> int:
    kind, host, port, n, seconds = argv[0], argv[1], int(argv[2]), int(argv[3]), float(argv[4])
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    target, args = (slow, (host, port)) if kind == "slow" else (nonreading, (host, port, *argv[5:8]))
    threads = [threading.Thread(target=target, args=args, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    stop.wait(seconds)
    stop.set()
    print(f"opened={opened}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
