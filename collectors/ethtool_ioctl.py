"""``ethtool -S`` / ``-g`` / ``-i`` equivalents through the SIOCETHTOOL ioctl, without the binary.

Sequence (``include/uapi/linux/ethtool.h``, ``net/ethtool/ioctl.c``; reference §3.1):
``ETHTOOL_GSSET_INFO`` (0x37, mask 1<<ETH_SS_STATS) → n; ``ETHTOOL_GSTRINGS`` (0x1b) → n names
of ETH_GSTRING_LEN=32 NUL-padded bytes; ``ETHTOOL_GSTATS`` (0x1d) → n u64 values aligned with
the names. These (and GDRVINFO 0x03, GRINGPARAM 0x10) need no privilege.

The set may change between calls (mlx5 adds ``rx_prio<p>_pause*`` when PFC is enabled). Recent
kernels answer a length that no longer matches with ``len = 0``; older ones copy the driver's
current count whatever the caller asked for. So buffers get slack and any count mismatch between
the three calls is retried.

The ``pack_*``/``unpack_*`` functions are pure codecs over bytes; :class:`EthtoolIoctl` does the
I/O on one reusable socket.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
from dataclasses import dataclass

SIOCETHTOOL = 0x8946
ETHTOOL_GDRVINFO = 0x03
ETHTOOL_GRINGPARAM = 0x10
ETHTOOL_SRINGPARAM = 0x11  # needs CAP_NET_ADMIN (tuners/link.py sets rings through this)
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_GSTATS = 0x1D
ETHTOOL_GSSET_INFO = 0x37
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
IFNAMSIZ = 16
IFREQ_SIZE = 40  # struct ifreq on LP64: 16-byte name + 24-byte union
SLACK = 64       # extra entries for a set that grows between calls
ABSENT_ERRNOS = (errno.EOPNOTSUPP, errno.ENODEV, errno.ENOENT)


class EthtoolError(OSError):
    """An ioctl failed; ``absent`` is True when the device has no such data (EOPNOTSUPP,
    ENODEV), which callers report as no_data rather than an error."""

    @property
    def absent(self) -> bool:
        return self.errno in ABSENT_ERRNOS


# ---- pure codecs --------------------------------------------------------------------------

def pack_sset_info(sset: int = ETH_SS_STATS) -> bytes:
    """``struct ethtool_sset_info {u32 cmd; u32 reserved; u64 sset_mask; u32 data[1]}``."""
    return struct.pack("=IIQI", ETHTOOL_GSSET_INFO, 0, 1 << sset, 0)


def unpack_sset_info(buf: bytes, sset: int = ETH_SS_STATS) -> int | None:
    """Number of strings in ``sset``, or None when the driver does not report that set."""
    _cmd, _res, mask, count = struct.unpack_from("=IIQI", buf)
    return count if mask & (1 << sset) else None


def pack_gstrings(count: int, sset: int = ETH_SS_STATS, slack: int = 0) -> bytes:
    """``struct ethtool_gstrings {u32 cmd; u32 string_set; u32 len; u8 data[len*32]}`` with
    room for ``slack`` more entries (older kernels overwrite ``len`` with the current count)."""
    return (struct.pack("=III", ETHTOOL_GSTRINGS, sset, count)
            + bytes((count + slack) * ETH_GSTRING_LEN))


def unpack_gstrings(buf: bytes) -> list[str]:
    """Names from a filled gstrings buffer (``len`` as the kernel wrote it)."""
    _cmd, _sset, count = struct.unpack_from("=III", buf)
    out = []
    for i in range(count):
        raw = buf[12 + i * ETH_GSTRING_LEN: 12 + (i + 1) * ETH_GSTRING_LEN]
        out.append(raw.split(b"\0", 1)[0].decode("utf-8", "replace"))
    return out


def pack_gstats(count: int, slack: int = 0) -> bytes:
    """``struct ethtool_stats {u32 cmd; u32 n_stats; u64 data[n_stats]}`` (+ ``slack``)."""
    return struct.pack("=II", ETHTOOL_GSTATS, count) + bytes(8 * (count + slack))


def unpack_gstats(buf: bytes) -> list[int]:
    _cmd, count = struct.unpack_from("=II", buf)
    return list(struct.unpack_from(f"={count}Q", buf, 8))


RING_FIELDS = ("rx_max_pending", "rx_mini_max_pending", "rx_jumbo_max_pending",
               "tx_max_pending", "rx_pending", "rx_mini_pending", "rx_jumbo_pending", "tx_pending")


def pack_ringparam(values: dict[str, int] | None = None, cmd: int = ETHTOOL_GRINGPARAM) -> bytes:
    """``struct ethtool_ringparam``: cmd + 8 u32 fields (zero for a GET, the wanted sizes with
    the maxima as read for ETHTOOL_SRINGPARAM)."""
    v = values or {}
    return struct.pack("=9I", cmd, *(v.get(f, 0) for f in RING_FIELDS))


def unpack_ringparam(buf: bytes) -> dict[str, int]:
    return dict(zip(RING_FIELDS, struct.unpack_from("=9I", buf)[1:], strict=True))


def pack_drvinfo() -> bytes:
    """``struct ethtool_drvinfo``: cmd, 5×32-byte strings, 12 reserved, 5 u32 (196 bytes)."""
    return struct.pack("=I", ETHTOOL_GDRVINFO) + bytes(192)


def unpack_drvinfo(buf: bytes) -> dict[str, object]:
    fields = struct.unpack_from("=I32s32s32s32s32s12s5I", buf)
    text = [f.split(b"\0", 1)[0].decode("utf-8", "replace") for f in fields[1:6]]
    return {"driver": text[0], "version": text[1], "fw_version": text[2], "bus_info": text[3],
            "n_stats": fields[8]}


# ---- I/O ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class RingParams:
    rx_pending: int
    tx_pending: int
    rx_max_pending: int
    tx_max_pending: int

    def to_json(self) -> dict:
        return {"rx": self.rx_pending, "tx": self.tx_pending,
                "rx_max": self.rx_max_pending, "tx_max": self.tx_max_pending}


class EthtoolIoctl:
    """SIOCETHTOOL on one datagram socket (created in the caller's network namespace)."""

    def __init__(self, sock: socket.socket | None = None) -> None:
        self._own = sock is None
        self.sock = sock or socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def close(self) -> None:
        if self._own:
            self.sock.close()

    def __enter__(self) -> EthtoolIoctl:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, ifname: str, request: bytes) -> bytes:
        name = ifname.encode()
        if not name or len(name) >= IFNAMSIZ:
            raise EthtoolError(errno.ENODEV, f"bad interface name {ifname!r}")
        data = ctypes.create_string_buffer(request, len(request))
        ifreq = struct.pack(f"@{IFNAMSIZ}sP", name, ctypes.addressof(data))
        ifreq += bytes(IFREQ_SIZE - len(ifreq))
        try:
            fcntl.ioctl(self.sock.fileno(), SIOCETHTOOL, ifreq)
        except OSError as exc:
            raise EthtoolError(exc.errno, f"SIOCETHTOOL {ifname}: {os.strerror(exc.errno)}") from None
        return data.raw

    def stats_count(self, ifname: str) -> int | None:
        return unpack_sset_info(self._call(ifname, pack_sset_info()))

    def statistics(self, ifname: str, attempts: int = 3) -> list[tuple[str, int]]:
        """``ethtool -S``: ``[(name, value), ...]`` in driver order (names may repeat).

        Raises :class:`EthtoolError` (``absent`` for EOPNOTSUPP/ENODEV, or when the driver
        reports no statistics set at all)."""
        for _ in range(attempts):
            count = self.stats_count(ifname)
            if not count:
                raise EthtoolError(errno.EOPNOTSUPP, f"{ifname}: no statistics")
            names = unpack_gstrings(self._call(ifname, pack_gstrings(count, slack=SLACK)))
            values = unpack_gstats(self._call(ifname, pack_gstats(count, slack=SLACK)))
            if len(names) == len(values) == count:
                return list(zip(names, values, strict=True))
        raise EthtoolError(errno.EAGAIN, f"{ifname}: statistics set kept changing")

    def rings(self, ifname: str) -> RingParams:
        """``ethtool -g``: current and maximum RX/TX ring sizes."""
        r = unpack_ringparam(self._call(ifname, pack_ringparam()))
        return RingParams(r["rx_pending"], r["tx_pending"], r["rx_max_pending"],
                          r["tx_max_pending"])

    def ring_fields(self, ifname: str) -> dict[str, int]:
        """All eight ``struct ethtool_ringparam`` fields, as the driver reports them."""
        return unpack_ringparam(self._call(ifname, pack_ringparam()))

    def set_rings(self, ifname: str, *, rx: int | None = None, tx: int | None = None) -> None:
        """``ethtool -G IF rx N tx M``: read the ring parameters, change the given sizes, write
        them back (the kernel validates against the maxima, ``ethtool_set_ringparam``)."""
        fields = self.ring_fields(ifname)
        if rx is not None:
            fields["rx_pending"] = rx
        if tx is not None:
            fields["tx_pending"] = tx
        self._call(ifname, pack_ringparam(fields, ETHTOOL_SRINGPARAM))

    def driver_info(self, ifname: str) -> dict[str, object]:
        """``ethtool -i``: driver, version, firmware, bus info, n_stats."""
        return unpack_drvinfo(self._call(ifname, pack_drvinfo()))
