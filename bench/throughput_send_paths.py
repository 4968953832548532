#!/usr/bin/env python3
"""Which send path the throughput engine's workers use: sendfile, MSG_ZEROCOPY or plain send.

One TCP stream per round over an unshaped veth pair between two fresh namespaces; the sender
moves SEND_BYTES per call with each method in turn (rounds alternate the order), the receiver
``recv_into`` a preallocated buffer, as datapath_worker.py does. Printed per method: median and
range of Gbit/s and of CPU seconds per Gbit moved (sender + receiver processes, getrusage), the
figure that decides on a host whose cores are all busy. MSG_ZEROCOPY to a local receiver is
copied anyway (Documentation/networking/msg_zerocopy.rst, "Notification": loopback and other
local delivery copy), so on veth it pays the completion reads on top of the copy.

Run as root: ``python bench/throughput_send_paths.py [--rounds 5] [--duration 2]``.
Creates and always deletes its own namespaces (prefix ``wpsend``); touches nothing else.
"""

from __future__ import annotations

import os
import resource
import socket
import statistics
import sys
import time

from common import parser, span, veth_pair

from wanprobe.lab.netns import entered

ADDR_A, ADDR_B, PORT = "198.19.1.1", "198.19.1.2", 5230
SEND_BYTES = 1 << 20
PAYLOAD_BYTES = 4 << 20
MSG_ZEROCOPY = getattr(socket, "MSG_ZEROCOPY", 0x4000000)
SO_ZEROCOPY = getattr(socket, "SO_ZEROCOPY", 60)
METHODS = ("sendfile", "zerocopy", "send")


def _receiver(ready_w: int) -> None:
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((ADDR_B, PORT))
    ls.listen(1)
    os.write(ready_w, b"r")
    conn, _ = ls.accept()
    buf = memoryview(bytearray(1 << 20))
    while conn.recv_into(buf):
        pass
    conn.close()


def _sender(method: str, duration_s: float) -> int:
    mfd = os.memfd_create("payload")
    os.write(mfd, os.urandom(PAYLOAD_BYTES))
    view = memoryview(os.urandom(PAYLOAD_BYTES))
    s = socket.create_connection((ADDR_B, PORT))
    if method == "zerocopy":
        s.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    fd, off, total, calls = s.fileno(), 0, 0, 0
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        if method == "sendfile":
            n = os.sendfile(fd, mfd, off, SEND_BYTES)
        elif method == "send":
            n = s.send(view[off:off + SEND_BYTES])
        else:
            try:
                n = s.send(view[off:off + SEND_BYTES], MSG_ZEROCOPY)
            except OSError:  # ENOBUFS: too many notifications outstanding
                n = 0
            calls += 1
            if calls % 8 == 0 or n == 0:  # read the completions (msg_zerocopy.rst)
                try:
                    while True:
                        s.recvmsg(0, 4096, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
                except OSError:
                    pass
        total += n
        off = (off + n) % (PAYLOAD_BYTES - SEND_BYTES)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    s.close()
    return total


def one_round(ns_a: str, ns_b: str, method: str, duration_s: float) -> tuple[float, float]:
    """(Gbit/s, CPU seconds per Gbit) of one transfer; CPU of both child processes."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    ready_r, ready_w = os.pipe()
    rx = os.fork()
    if rx == 0:
        try:
            with entered(ns_b):
                _receiver(ready_w)
        finally:
            os._exit(0)
    os.close(ready_w)
    if not os.read(ready_r, 1):
        raise SystemExit("the receiver did not start")
    res_r, res_w = os.pipe()
    t0 = time.monotonic()
    tx = os.fork()
    if tx == 0:
        try:
            with entered(ns_a):
                os.write(res_w, str(_sender(method, duration_s)).encode())
        finally:
            os._exit(0)
    os.close(res_w)
    os.waitpid(tx, 0)
    os.waitpid(rx, 0)
    secs = time.monotonic() - t0
    total = int(os.read(res_r, 64) or b"0")
    for fd in (ready_r, res_r):
        os.close(fd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    gbit = total * 8 / 1e9
    return gbit / secs, cpu_s / gbit if gbit else float("inf")


def report(results: dict[str, list[tuple[float, float]]], duration_s: float) -> None:
    """Per method: median and range of Gbit/s and of CPU s/Gbit over its rounds."""
    print(f"{'method':10} {'Gbit/s median':>14} {'range':>12} {'CPU s/Gbit median':>18} "
          f"{'range':>14}")
    for method in METHODS:
        rates = [r for r, _ in results[method]]
        cpus = [c for _, c in results[method]]
        print(f"{method:10} {statistics.median(rates):14.2f} {span(rates, '5.2f', hi_fmt='<6.2f')}"
              f" {statistics.median(cpus):18.4f} {span(cpus, '6.4f', hi_fmt='<7.4f')}")
    print(f"({len(results[METHODS[0]])} rounds of {duration_s:g} s, one stream, "
          f"{SEND_BYTES >> 10} KiB per call, order rotating; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")


def main() -> int:
    args = parser(__doc__, ("--rounds", 5), ("--duration", 2.0), first_line=True).parse_args()
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in METHODS}
    with veth_pair(f"wpsend{os.getpid()}", ADDR_A, ADDR_B) as (a, b):
        for n in range(args.rounds):
            order = METHODS[n % len(METHODS):] + METHODS[:n % len(METHODS)]
            for method in order:
                results[method].append(one_round(a, b, method, args.duration))
    report(results, args.duration)
    return 0


if __name__ == "__main__":
    sys.exit(main())
