"""The bulk data path of one test side: its streams, their payload, and where they run.

Each side moves its streams in worker processes (datapath_pool.py, datapath_worker.py): one per
stream up to the cores available and asked for (``--cpus``), with the data path in the kernel
as far as it goes (``sendfile`` from a memfd, ``recv_into`` a preallocated buffer). This module
keeps what the client, the server and the sampler see of a stream: its socket (the parent's
copy, for TCP_INFO), its live counters (read from the memory the worker writes), its end state.

Why processes and sendfile, measured on an unshaped veth pair on the 2-core VM: issue 26 found
one Python epoll thread per side stopping at 0.70 × iperf3 3.12 at 8 streams (that thread 95-99 %
busy, one core idle 55-83 %). bench/throughput_send_paths.py, one stream, 1 MiB per call, three
runs of 5 rounds under other jobs' load (load average 3.8-6.9), median Gbit/s and CPU s per Gbit
moved (sender + receiver): sendfile 9.22 / 5.58 / 2.24 Gbit/s at 0.077 / 0.075 / 0.110;
plain send 7.82 / 5.24 / 2.97 at 0.074 / 0.080 / 0.111; MSG_ZEROCOPY 7.60 / 4.84 / 2.35 at
0.076 / 0.091 / 0.119 (to a local receiver the kernel copies the pages anyway, and the
completions cost extra). The CPU both ends spend per Gbit is the same for sendfile and send
within the noise; sendfile moves it off the sender, the side that limits a lone stream, so it
was fastest in the two less loaded runs: sendfile it is. A 1 MiB receive buffer cost
0.050-0.062 CPU s/Gbit on the receiver against 0.076-0.098 for 128 KiB (3 rounds each).
bench/throughput_vs_iperf3.py compares the whole engine with iperf3, rate and CPU s/Gbit.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable

from wanprobe.errors import ProbeError
from wanprobe.throughput.datapath_pool import DataWorkers, worker_count
from wanprobe.throughput.sockopts import TCP_CONGESTION
from wanprobe.throughput.tcp_info import TcpInfo, tcp_info_summary

PAYLOAD_BYTES = 4 << 20  # the incompressible bytes the senders cycle through


class Payload:
    """PAYLOAD_BYTES of incompressible bytes (os.urandom) in a memfd the workers sendfile from."""

    def __init__(self, size: int = PAYLOAD_BYTES) -> None:
        self.size = size
        fd = os.memfd_create("wanprobe-payload", os.MFD_CLOEXEC)
        self._file = open(fd, "r+b", buffering=0)  # closes the memfd when the Payload goes
        self._file.write(os.urandom(size))
        self.fd = fd


class Stream:
    """One data connection: its socket and live counters (written by its worker process)."""

    def __init__(self, stream_id: int, direction: int, sock: socket.socket, sending: bool) -> None:
        self.stream_id, self.direction, self.sock, self.sending = stream_id, direction, sock, sending
        self.t_start: float | None = None
        self.cpu_s = 0.0              # its worker's CPU time (the worker may carry others too)
        self.worker: dict | None = None  # its worker's id, CPU, busy and demand shares
        self.error: str | None = None
        self.final_tcp_info: TcpInfo | None = None
        self.cc: str | None = None
        self.reported = False
        self.done = threading.Event()
        self.thread: threading.Thread | None = None  # set once the stream was handed over
        self._view = None
        self._base = 0
        self._final = (0, 0, 0)

    def attach(self, view, slot: int, *, worker_id: int) -> None:
        """Read the counters from ``view`` (int64: bytes, t_first_ns, t_last_ns at ``slot``)."""
        self._view, self._base = view, slot * 8
        self.worker = {"worker_id": worker_id}

    def freeze(self) -> None:
        """Keep the last counter values and let go of the shared memory."""
        if self._view is not None:
            b = self._base
            self._final = (self._view[b], self._view[b + 1], self._view[b + 2])
            self._view = None

    def _word(self, k: int) -> int:
        view = self._view
        return view[self._base + k] if view is not None else self._final[k]

    @property
    def bytes(self) -> int:
        return self._word(0)

    @property
    def t_first(self) -> float | None:
        ns = self._word(1)
        return ns / 1e9 if ns else None

    @property
    def t_last(self) -> float | None:
        ns = self._word(2)
        return ns / 1e9 if ns else None

    def elapsed_s(self) -> float | None:
        """Wall time from the test start to the last byte moved."""
        t_last = self.t_last
        if self.t_start is None or t_last is None:
            return None
        return max(t_last - self.t_start, 1e-9)

    def close_parent_copy(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def start_streams(streams: list[Stream], *, t_start: float, duration_s: float, max_bytes: int,
                  abort: threading.Event, payload: Payload | None = None,
                  grace_s: float = 10.0, on_finished: Callable[[], None] | None = None,
                  workers: DataWorkers | None = None, cpus: int | None = None) -> DataWorkers:
    """Move the data of ``streams`` (``max_bytes`` each) in worker processes; each stream's
    ``done`` is set when it has finished and its worker has reported, and ``on_finished`` is
    called (from the pool's reader thread) once all have, so that callers wait on an event
    instead of polling the streams. ``workers``: a pool spawned and made ready beforehand
    (so that start-up stays outside the test); without one, one is started here."""
    for s in streams:
        s.t_start = t_start
        try:
            raw = s.sock.getsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, 16)
            s.cc = raw.split(b"\0", 1)[0].decode() or None
        except OSError:
            s.cc = None
    if any(s.sending for s in streams) and payload is None:
        raise ValueError("sending streams need a payload")
    if workers is None:
        workers = DataWorkers(worker_count(len(streams), cpus))
        if not workers.wait_ready():
            workers.close()
            raise ProbeError("the data workers did not start")
    workers.start(streams, t_start=t_start, duration_s=duration_s, max_bytes=max_bytes,
                  abort=abort, payload=payload, grace_s=grace_s, on_finished=on_finished)
    return workers


def stream_final(stream: Stream) -> dict:
    """The end-of-test report of one stream (same shape from client and server)."""
    return {"id": stream.stream_id, "direction": stream.direction, "sending": stream.sending,
            "bytes": stream.bytes, "elapsed_s": stream.elapsed_s(), "cpu_s": stream.cpu_s,
            "error": stream.error, "cc": stream.cc, "worker": stream.worker,
            "tcp_info": tcp_info_summary(stream.final_tcp_info) if stream.sending else None}


