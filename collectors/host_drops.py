"""Where a receiving or sending host drops datagrams itself: counters that are the host's losses,
never the path's (they count packets that crossed the path, or never left this host).

- ``/proc/net/snmp`` ``Udp:`` ``RcvbufErrors`` (a socket's receive buffer was full),
  ``InErrors`` (it also counts those, and checksum and memory errors) and ``SndbufErrors`` (a
  send dropped for want of buffer or by the local qdisc, udp_send_skb in net/ipv4/udp.c) — per
  network namespace;
- ``/proc/net/softnet_stat`` column 2: packets dropped because a CPU's input backlog was full
  (``netdev_max_backlog``, enqueue_to_backlog in net/core/dev.c) — per CPU, for the whole host;
- ``/sys/class/net/IF/statistics/rx_dropped``, ``rx_missed_errors``, ``rx_fifo_errors``: the
  interface's own receive drops (ring full, no buffer), as ``ip -s link`` shows them.

A socket's own drop count is read from the socket (SO_MEMINFO); see
wanprobe/throughput/udp_sink.py. ``HostDrops.since`` gives the increase between two readings.
The kernel counts a dropped buffer (an skb) once; with GRO or GSO one holds several datagrams,
so these are drop events, a lower bound of the datagrams lost.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from collectors.procfs_netstat import parse_proc_net_table
from collectors.sysfs_read import read_text

NIC_DROP_FILES = ("rx_dropped", "rx_missed_errors", "rx_fifo_errors")


@dataclass(frozen=True)
class HostDrops:
    """One reading; a counter that could not be read is None (absent, never 0)."""

    udp_rcvbuf_errors: int | None = None
    udp_in_errors: int | None = None
    udp_sndbuf_errors: int | None = None
    backlog_drops: int | None = None
    nic_rx_drops: int | None = None

    def since(self, earlier: HostDrops) -> HostDrops:
        """The increase of each counter from ``earlier`` (None where either is unknown; a
        counter that went backwards — a reset — counts from zero)."""
        def delta(now: int | None, then: int | None) -> int | None:
            if now is None or then is None:
                return None
            return now - then if now >= then else now
        return HostDrops(**{f.name: delta(getattr(self, f.name), getattr(earlier, f.name))
                            for f in fields(self)})

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def parse_softnet_dropped(text: str) -> int | None:
    """Sum over CPUs of the second (hex) column of ``/proc/net/softnet_stat``."""
    total = 0
    rows = 0
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 2:
            continue
        try:
            total += int(cols[1], 16)
        except ValueError:
            return None
        rows += 1
    return total if rows else None


def _int_file(path: Path) -> int | None:
    text, _why = read_text(path)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def read_host_drops(iface: str | None = None, *, proc_root: Path = Path("/proc"),
                    sys_root: Path = Path("/sys")) -> HostDrops:
    """The counters now; ``iface`` adds that interface's receive drops."""
    udp: dict[str, int] = {}
    text, _why = read_text(proc_root / "net" / "snmp")
    if text is not None:
        tables, _errors = parse_proc_net_table(text, str(proc_root / "net" / "snmp"))
        udp = tables.get("Udp", {})
    softnet, _why = read_text(proc_root / "net" / "softnet_stat")
    nic = None
    if iface and "/" not in iface and iface not in (".", ".."):
        vals = [_int_file(sys_root / "class" / "net" / iface / "statistics" / name)
                for name in NIC_DROP_FILES]
        nic = sum(v for v in vals if v is not None) if any(v is not None for v in vals) else None
    return HostDrops(udp_rcvbuf_errors=udp.get("RcvbufErrors"), udp_in_errors=udp.get("InErrors"),
                     udp_sndbuf_errors=udp.get("SndbufErrors"),
                     backlog_drops=parse_softnet_dropped(softnet) if softnet else None,
                     nic_rx_drops=nic)


def iface_of_address(address: str) -> str | None:
    """The interface that holds ``address`` in this network namespace (psutil), else None."""
    import psutil

    want = address.split("%", 1)[0]
    try:
        table = psutil.net_if_addrs()
    except OSError:
        return None
    for name, addrs in table.items():
        if any(a.address.split("%", 1)[0] == want for a in addrs):
            return name
    return None
