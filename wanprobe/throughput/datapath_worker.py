"""One data-path worker process: moves the bytes of the streams its parent hands it.

Run as ``python -I -S datapath_worker.py FD`` by datapath_pool.py; standard library only, so
that it starts in a few tens of milliseconds and shares nothing with its parent but the file
descriptors it is given. FD is its end of an AF_UNIX SOCK_SEQPACKET pair (one JSON message per
packet, stream sockets passed with SCM_RIGHTS, unix(7)):

    parent -> worker  {"setup": {payload_bytes, slots}}  fds [payload memfd, counters memfd]
                      {"add": [{"slot", "sending"}, ...]} fds [the streams' sockets]
                      {"go": {t_start_ns, duration_s, grace_s, max_bytes}}
                      {"abort": true}                     (or EOF: the parent is gone)
    worker -> parent  {"ready": true}   once it runs (sent first, before setup)
                      {"done": slot, "error": str|null, "tcp_info": hex|null}
                      {"exit": {cpu_s, user_s, sys_s, run_ns, wait_ns, elapsed_s}}

The data path stays in the kernel as far as it goes: a sending stream calls ``os.sendfile``
from a memfd of incompressible bytes (the pages go to the socket by reference, sendfile(2),
no copy from user space), a receiving stream ``recv_into`` one preallocated buffer. Per call
the Python work is a few integer operations on a shared int64 array (the counters memfd, read
by the parent's sampler): bytes, first and last CLOCK_MONOTONIC ns of each stream. There are no
per-chunk Python objects beyond the call's own integer result.

sendfile against MSG_ZEROCOPY and plain send on a veth pair: bench/throughput_send_paths.py.
"""

from __future__ import annotations

import json
import mmap
import os
import resource
import select
import socket
import sys
import time

SLOT_WORDS = 8          # int64 per stream slot: bytes, t_first_ns, t_last_ns (64 B: one cache line)
SEND_BYTES = 1 << 20    # per sendfile() call (bench/throughput_send_paths.py)
RECV_BYTES = 1 << 20    # per recv_into() call
_TCP_INFO_BYTES = 512
_MAX_MSG_BYTES = 1 << 20
_MAX_FDS = 256


def _send(ctl: socket.socket, **msg) -> None:
    try:
        ctl.send(json.dumps(msg, separators=(",", ":")).encode())
    except OSError:
        pass  # the parent is gone: nobody to tell


def _schedstat() -> tuple[int, int] | None:
    """(ns on a CPU, ns runnable but waiting for one) of this single-threaded process
    (/proc/<pid>/schedstat, Documentation/scheduler/sched-stats.rst); None without
    CONFIG_SCHED_INFO."""
    try:
        with open("/proc/self/schedstat") as f:
            run_ns, wait_ns, _slices = f.read().split()
        return int(run_ns), int(wait_ns)
    except (OSError, ValueError):
        return None


class Worker:
    """The epoll loop over this worker's streams (level-triggered, non-blocking sockets)."""

    def __init__(self, ctl: socket.socket) -> None:
        self.ctl = ctl
        self.ep = select.epoll()
        self.ep.register(ctl.fileno(), select.EPOLLIN)
        self.state: dict[int, list] = {}   # fd -> [sock, counter base, offset, drain_until, sending]
        self.counters = None
        self.payload_fd = -1
        self.payload_bytes = 0
        self.go: dict | None = None
        self.aborted = False

    # ---- control messages ----------------------------------------------------------------
    def _control(self) -> None:
        """Read one message from the parent; EOF or a malformed message aborts."""
        try:
            raw, fds, _flags, _addr = socket.recv_fds(self.ctl, _MAX_MSG_BYTES, _MAX_FDS)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            raw, fds = b"", []
        if not raw:
            self.aborted = True
            return
        msg = json.loads(raw)
        if "setup" in msg:
            self.payload_fd, counters_fd = fds
            self.payload_bytes = int(msg["setup"]["payload_bytes"])
            size = int(msg["setup"]["slots"]) * SLOT_WORDS * 8
            mm = mmap.mmap(counters_fd, size)
            os.close(counters_fd)
            self.counters = memoryview(mm).cast("q")
        elif "add" in msg:
            for spec, fd in zip(msg["add"], fds, strict=True):
                sock = socket.socket(fileno=fd)
                sock.setblocking(False)
                sending = bool(spec["sending"])
                self.state[fd] = [sock, int(spec["slot"]) * SLOT_WORDS, 0, None, sending]
                self.ep.register(fd, select.EPOLLOUT if sending else select.EPOLLIN)
        elif "go" in msg:
            self.go = msg["go"]
        elif "abort" in msg:
            self.aborted = True

    def wait_for_go(self) -> None:
        while self.go is None and not self.aborted:
            self.ep.poll()
            self._control()

    # ---- the data path ---------------------------------------------------------------------
    def run(self) -> None:
        """Move bytes on every stream until each is done. Long because: it is the per-call hot
        loop of the data path and keeps its state in locals on purpose (see the docstring)."""
        go = self.go
        t_start_ns = int(go["t_start_ns"])
        send_deadline_ns = t_start_ns + int(float(go["duration_s"]) * 1e9)
        self.grace_ns = int(float(go["grace_s"]) * 1e9)
        self.recv_deadline_ns = send_deadline_ns + self.grace_ns
        self.send_deadline_ns = send_deadline_ns
        max_bytes = int(go["max_bytes"])
        state, cnt, poll = self.state, self.counters, self.ep.poll
        ctl_fd = self.ctl.fileno()
        buf = bytearray(RECV_BYTES)
        recv_view = memoryview(buf)
        sendfile, monotonic_ns = os.sendfile, time.monotonic_ns
        pfd, psize = self.payload_fd, self.payload_bytes
        next_due = 0
        while state and not self.aborted:
            now = monotonic_ns()
            if now >= next_due:
                next_due = self._deadlines(now)
            ready = poll(max(next_due - now, 0) / 1e9)
            now = monotonic_ns()
            for fd, _events in ready:
                if fd == ctl_fd:
                    self._control()
                    continue
                st = state.get(fd)
                if st is None:
                    continue
                base = st[1]
                try:
                    if not st[4]:
                        n = st[0].recv_into(recv_view)
                        if n == 0:
                            self._finish(fd, None)
                            continue
                    elif st[3] is None:
                        offset = st[2]
                        n = sendfile(fd, pfd, offset,
                                     min(SEND_BYTES, psize - offset, max_bytes - cnt[base]))
                        offset += n
                        st[2] = 0 if offset >= psize else offset
                    else:  # draining: wait for the receiver to read everything and close
                        if st[0].recv_into(recv_view, 4096) == 0:
                            self._finish(fd, None)
                        continue
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    self._finish(fd, exc.strerror or str(exc))
                    continue
                if not cnt[base + 1]:
                    cnt[base + 1] = now
                cnt[base + 2] = now
                total = cnt[base] + n
                cnt[base] = total
                if total >= max_bytes:  # the byte cap, per stream
                    if st[4]:
                        self._shutdown(fd)
                        next_due = min(next_due, st[3] or now)
                    elif total > max_bytes:
                        self._finish(fd, "byte cap reached")
        for fd in list(state):
            self._finish(fd, None)

    def _deadlines(self, now: int) -> int:
        """Act on every deadline that is due; return when the next one falls due (ns)."""
        for fd, st in list(self.state.items()):
            sending, drain_until = st[4], st[3]
            if sending and drain_until is None and now >= self.send_deadline_ns:
                self._shutdown(fd)
            elif sending and drain_until is not None and now >= drain_until:
                self._finish(fd, None)  # the receiver never closed: keep what was sent
            elif not sending and now > self.recv_deadline_ns:
                self._finish(fd, "receive deadline passed")
        due = [self.recv_deadline_ns if not st[4]
               else self.send_deadline_ns if st[3] is None else st[3]
               for st in self.state.values()]
        return min(due, default=now)

    def _shutdown(self, fd: int) -> None:
        """The sender is done: FIN, then wait for the receiver's close so that the final
        TCP_INFO covers every byte acknowledged."""
        st = self.state[fd]
        try:
            st[0].shutdown(socket.SHUT_WR)
        except OSError:
            self._finish(fd, None)
            return
        st[3] = time.monotonic_ns() + self.grace_ns
        self.ep.modify(fd, select.EPOLLIN)

    def _finish(self, fd: int, error: str | None) -> None:
        sock, _base, _off, _drain, sending = self.state.pop(fd)
        try:
            self.ep.unregister(fd)
        except (OSError, ValueError):
            pass
        info = None
        if sending:
            try:
                info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES).hex()
            except OSError:
                pass
        else:
            try:  # the parent still holds this socket: FIN now rather than at its close
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        sock.close()
        _send(self.ctl, done=_base // SLOT_WORDS, error=error, tcp_info=info)


def main(argv: list[str]) -> int:
    ctl = socket.socket(fileno=int(argv[1]))
    worker = Worker(ctl)
    _send(ctl, ready=True)
    try:
        worker.wait_for_go()
        ru0, sched0, t0 = resource.getrusage(resource.RUSAGE_SELF), _schedstat(), time.monotonic()
        if not worker.aborted:
            worker.run()
        ru1, sched1 = resource.getrusage(resource.RUSAGE_SELF), _schedstat()
        user_s, sys_s = ru1.ru_utime - ru0.ru_utime, ru1.ru_stime - ru0.ru_stime
        run_ns = wait_ns = None
        if sched0 is not None and sched1 is not None:
            run_ns, wait_ns = sched1[0] - sched0[0], sched1[1] - sched0[1]
        _send(ctl, exit={"cpu_s": user_s + sys_s, "user_s": user_s, "sys_s": sys_s,
                         "run_ns": run_ns, "wait_ns": wait_ns,
                         "elapsed_s": time.monotonic() - t0})
    except Exception as exc:  # report, never a traceback on the parent's terminal
        _send(ctl, fatal=f"{type(exc).__name__}: {exc}"[:200])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
