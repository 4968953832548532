"""The delay-line process: moves packets between the TUN devices of a lab's two namespaces.

Run as ``python -m wanprobe.lab.forwarder --name N --ns-a NS --ns-b NS --control SOCK
--settings JSON [--owner-pid PID]``. It creates the TUN device inside each namespace (setns(2)
on its only thread, then back to where it started), prints ``ready`` on stdout and forwards
until SIGTERM, until either namespace disappears (checked every 0.25 s), until a TUN device
goes away, or until the owner process exits (pidfd; it then removes the lab itself).

Per direction a packet gets: Bernoulli loss and the black-hole MTU check per *wire segment*,
DSCP bleaching, then a release time ``now + rtt/2 + jitter`` (Gaussian, clipped at 0). Release
times never go backwards within a direction (a real path is FIFO) unless the packet is picked
for reordering, in which case it overtakes the previous 1 ms of traffic.

Timing: a packet's delay counts from the kernel's stamp of its entry into the TUN (an
AF_PACKET socket per TUN, arrivals.py), not from the read() that found it, so the forwarder's
own wake-up (0.05-0.3 ms on a VM, sometimes milliseconds) is not added to a reply that had to
wake it, as it is not added to an ICMP echo reply made inside the forwarder's write(). Packets
wait in one heap; a select() loop sleeps until shortly before the next release and spins the
rest. The process learns how late select() wakes on this host (timer slack set to 1 ns): it
spins for 1.5x the 75th percentile of that lateness; without arrival stamps it also credits the
median lateness to packets that woke it. It runs at a low SCHED_FIFO priority, as netem runs in
softirq context, so ordinary load on a shared host does not delay releases.

Throughput: TCP and UDP GSO super-packets (TUN offload, see tun.py) are forwarded whole with
their virtio header, ~40 wire segments per read, which is what makes > 1 Gbit/s possible in
Python (a UDP sender that does not use UDP_SEGMENT is moved one datagram per read: ~0.5 Gbit/s).
Loss and the black-hole MTU still act on the segments a real wire would carry: the forwarder
draws one Bernoulli trial per segment and compares each segment's size with the limit; only
when some segment must go does it cut the super-packet into segments (packet.segment)
and forward the survivors. So TCP sees exactly per-packet Bernoulli loss.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path

from wanprobe.lab.arrivals import ArrivalStamps
from wanprobe.lab.delayline import (
    SPIN_MAX_NS,
    WAKE_WINDOW,
    DelayLine,
    calibrate_wakeups,
    wake_estimates,
)
from wanprobe.lab.netns import delete as delete_netns
from wanprobe.lab.netns import netns_path, setns
from wanprobe.lab.settings import LinkSettings
from wanprobe.lab.tun import open_tun

HOUSEKEEPING_S = 0.25
PR_SET_TIMERSLACK = 29


class Forwarder:
    """The process around a DelayLine: namespaces, TUNs, control socket, signals, main loop."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stop = False
        settings = LinkSettings.from_json(json.loads(args.settings)).validated()
        self.ns_inodes = {}
        fds = []
        stamps: list[ArrivalStamps | None] = []
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            for ns in (args.ns_a, args.ns_b):
                nsfd = os.open(netns_path(ns), os.O_RDONLY)
                try:
                    self.ns_inodes[ns] = os.fstat(nsfd).st_ino
                    setns(nsfd)
                finally:
                    os.close(nsfd)
                with contextlib.suppress(OSError):  # the lab is IPv4; keep v6 chatter off the link
                    with open("/proc/sys/net/ipv6/conf/default/disable_ipv6", "w") as f:
                        f.write("1")
                fds.append(open_tun(args.ifname, offload=not args.no_offload))
                try:
                    stamps.append(ArrivalStamps(args.ifname))
                except OSError as exc:  # no AF_PACKET: fall back to read time minus wake-up
                    print(f"forwarder: no arrival stamps ({exc})", file=sys.stderr)
                    stamps.append(None)
        finally:
            setns(home)
            os.close(home)
        self.line = DelayLine(fds[0], fds[1], settings, offload=not args.no_offload)
        self.line.ab.arrivals, self.line.ba.arrivals = stamps
        self.ctl = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(args.control)
        self.ctl.bind(args.control)
        os.chmod(args.control, 0o600)
        self.owner_fd = -1
        if args.owner_pid:
            # the lab lives as long as the process that brought it up (unless persistent)
            self.owner_fd = os.pidfd_open(args.owner_pid)
        self.ctl.setblocking(False)
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # no terminal to lose; only SIGTERM stops it

    def _on_signal(self, signum, frame) -> None:
        self.stop = True

    def remove_lab(self) -> None:
        """Tear the lab down ourselves (its owner died without calling down())."""
        from wanprobe.lab import registry
        for ns in (self.args.ns_a, self.args.ns_b):
            with contextlib.suppress(Exception):
                if os.stat(netns_path(ns)).st_ino == self.ns_inodes[ns]:
                    delete_netns(ns)
        with contextlib.suppress(Exception):
            if Path(self.args.control).parent == registry.REGISTRY_DIR:
                registry.remove(self.args.name)

    def namespaces_intact(self) -> bool:
        for ns, ino in self.ns_inodes.items():
            try:
                if os.stat(netns_path(ns)).st_ino != ino:
                    return False
            except OSError:
                return False
        return True

    def control(self) -> None:
        while True:
            try:
                data, addr = self.ctl.recvfrom(65536)
            except BlockingIOError:
                return
            try:
                req = json.loads(data)
                if req.get("op") == "update":
                    merged = {**self.line.settings.to_json(), **req.get("settings", {})}
                    self.line.apply(LinkSettings.from_json(merged).validated())
                    reply = {"ok": True, "settings": self.line.settings.to_json()}
                elif req.get("op") == "offset":
                    self.line.set_offset(int(req["offset_ns"]))
                    reply = {"ok": True, "offset_ns": self.line.offset_ns}
                elif req.get("op") == "stats":
                    reply = {"ok": True, "stats": self.line.stats(), "settings": self.line.settings.to_json()}
                else:
                    reply = {"ok": False, "error": f"unknown op {req.get('op')!r}"}
            except Exception as exc:  # a bad request must never stop the link
                reply = {"ok": False, "error": " ".join(str(exc).split())}
            if addr:
                with contextlib.suppress(OSError):
                    self.ctl.sendto(json.dumps(reply).encode(), addr)

    def run(self) -> int:
        """The delay line's event loop until told to stop. Long because: it is the per-packet
        hot loop (select, read, schedule, release) with its state in locals on purpose."""
        line = self.line
        fd_a, fd_b = line.ab.src_fd, line.ba.src_fd
        rfds = [fd_a, fd_b, self.ctl.fileno(), self.wake_r]
        if self.owner_fd >= 0:
            rfds.append(self.owner_fd)
        next_check = time.monotonic() + HOUSEKEEPING_S
        clock = time.monotonic_ns
        overshoots = calibrate_wakeups()
        wake_ns, spin_ns = wake_estimates(overshoots)
        overshoots.clear()
        while not self.stop:
            line.release_due(clock())
            target = 0
            if line.heap:
                now = clock()
                wait_ns = line.heap[0][0] - now - spin_ns
                if wait_ns > 0:
                    timeout = min(HOUSEKEEPING_S, wait_ns / 1e9)
                    target = now + int(timeout * 1e9)
                else:
                    timeout = 0.0
            else:
                timeout = HOUSEKEEPING_S
            before = clock()
            ready, _, _ = select.select(rfds, [], [], timeout)
            if target and not ready:
                # Learn how late a sleeping process wakes on this host (timer interrupt, vCPU
                # wake-up, scheduling): spin twice that before a release, and credit it to
                # packets that woke us from sleep, since they arrived that much before the read.
                overshoots.append(min(max(clock() - target, 0), SPIN_MAX_NS))
                if len(overshoots) >= WAKE_WINDOW:
                    wake_ns, spin_ns = wake_estimates(overshoots)
                    overshoots.clear()
            # credit only a real sleep: select() that returned at once did not wake anyone
            woke_ns = min(wake_ns, clock() - before) if timeout > 0 else 0
            if woke_ns < wake_ns // 2:
                woke_ns = 0
            line.wake_ns = wake_ns
            for fd in ready:
                if fd == fd_a or fd == fd_b:
                    try:
                        line.read_ready(fd, woke_ns)
                    except OSError as exc:  # device gone with its namespace
                        print(f"forwarder: link device gone ({exc}); exiting", file=sys.stderr)
                        return 0
                elif fd == self.owner_fd:
                    print(f"forwarder: owner process {self.args.owner_pid} exited; removing the lab",
                          file=sys.stderr)
                    self.remove_lab()
                    return 0
                elif fd == self.wake_r:
                    with contextlib.suppress(OSError):
                        os.read(self.wake_r, 512)
                else:
                    self.control()
            now_s = time.monotonic()
            if now_s >= next_check:
                next_check = now_s + HOUSEKEEPING_S
                if not self.namespaces_intact():
                    print("forwarder: lab namespaces are gone; exiting", file=sys.stderr)
                    return 0
        return 0

    def close(self) -> None:
        if self.owner_fd >= 0:
            os.close(self.owner_fd)
        self.ctl.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.args.control)
        os.close(self.line.ab.src_fd)
        os.close(self.line.ba.src_fd)
        for d in (self.line.ab, self.line.ba):
            if d.arrivals is not None:
                d.arrivals.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="wanprobe.lab.forwarder", description=__doc__.split("\n")[0])
    p.add_argument("--name", required=True, help="lab name (for ps and logs)")
    p.add_argument("--ns-a", required=True)
    p.add_argument("--ns-b", required=True)
    p.add_argument("--ifname", default="wan0")
    p.add_argument("--control", required=True, help="path of the control UNIX datagram socket")
    p.add_argument("--settings", required=True, help="LinkSettings as JSON")
    p.add_argument("--no-offload", action="store_true", help="per-packet TUN, no GSO")
    p.add_argument("--owner-pid", type=int, default=0,
                   help="remove the lab and exit when this process exits (0 = persistent)")
    p.add_argument("--rt-priority", type=int, default=10, help="SCHED_FIFO priority, 0 = normal")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    if args.rt_priority > 0:
        # Like netem's softirq, the delay line must not queue behind ordinary processes: a
        # low SCHED_FIFO priority keeps release times accurate on a busy host. Its CPU use is
        # bounded by the traffic plus <= SPIN_MAX_NS of spinning per release (and the kernel's
        # RT throttling).
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(args.rt_priority))
    try:
        fwd = Forwarder(args)
    except Exception as exc:
        print(f"error: {' '.join(str(exc).split())}", flush=True)
        return 1
    # A full collection walks every live object (imports included) and takes milliseconds in
    # which no packet moves; the packet path makes no reference cycles, so freeze what start-up
    # built and let only young objects be collected.
    gc.collect()
    gc.freeze()
    print("ready", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    try:
        return fwd.run()
    finally:
        fwd.close()


if __name__ == "__main__":
    sys.exit(main())
