"""TUN devices with virtio-net headers and TCP and UDP segmentation offload.

Constants from include/uapi/linux/if_tun.h and include/uapi/linux/virtio_net.h. With
IFF_VNET_HDR and TUNSETOFFLOAD(TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO_ECN | TUN_F_USO4 | TUN_F_USO6)
the kernel hands the reader whole TCP and UDP GSO super-packets (up to 64 KiB; UDP from a sender
using ``UDP_SEGMENT``, udp(7)) preceded by a 10-byte ``struct virtio_net_hdr``; writing the same
header + packet into the peer TUN injects it unchanged. Without USO (a kernel before 6.2) the
kernel cuts a UDP GSO packet into datagrams before the TUN, and the delay line moves each one.
"""

from __future__ import annotations

import fcntl
import os
import struct
from dataclasses import dataclass

TUNSETIFF = 0x400454CA
TUNSETOFFLOAD = 0x400454D0
TUNSETVNETHDRSZ = 0x400454D8
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000
TUN_F_CSUM = 0x01
TUN_F_TSO4 = 0x02
TUN_F_TSO6 = 0x04
TUN_F_TSO_ECN = 0x08
TUN_F_USO4 = 0x20  # UDP segmentation offload (Linux 6.2); the kernel takes USO4 and USO6 only
TUN_F_USO6 = 0x40  # together (tun_set_offload in drivers/net/tun.c)

VNET_HDR = struct.Struct("=BBHHHH")  # flags, gso_type, hdr_len, gso_size, csum_start, csum_offset
VNET_HDR_LEN = VNET_HDR.size  # 10
VIRTIO_NET_HDR_F_NEEDS_CSUM = 1
VIRTIO_NET_HDR_GSO_NONE = 0
VIRTIO_NET_HDR_GSO_TCPV4 = 1
VIRTIO_NET_HDR_GSO_TCPV6 = 4
VIRTIO_NET_HDR_GSO_UDP_L4 = 5
VIRTIO_NET_HDR_GSO_ECN = 0x80
NO_VNET_HDR = bytes(VNET_HDR_LEN)


@dataclass(frozen=True)
class VnetHdr:
    """struct virtio_net_hdr (legacy, native endian), as the TUN driver reads/writes it."""

    flags: int
    gso_type: int
    hdr_len: int
    gso_size: int
    csum_start: int
    csum_offset: int

    @classmethod
    def unpack(cls, data: bytes) -> VnetHdr:
        return cls(*VNET_HDR.unpack_from(data))

    def pack(self) -> bytes:
        return VNET_HDR.pack(self.flags, self.gso_type, self.hdr_len, self.gso_size,
                             self.csum_start, self.csum_offset)


def open_tun(ifname: str, *, offload: bool = True) -> int:
    """Create TUN ``ifname`` in the calling thread's network namespace; return its fd.

    The device is not persistent: it disappears when the fd is closed (e.g. the forwarder dies).
    """
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    try:
        flags = IFF_TUN | IFF_NO_PI | (IFF_VNET_HDR if offload else 0)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", ifname.encode(), flags))
        if offload:
            fcntl.ioctl(fd, TUNSETVNETHDRSZ, struct.pack("i", VNET_HDR_LEN))
            tso = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO_ECN
            try:
                fcntl.ioctl(fd, TUNSETOFFLOAD, tso | TUN_F_USO4 | TUN_F_USO6)
            except OSError:  # a kernel before 6.2: UDP GSO is segmented before the TUN
                fcntl.ioctl(fd, TUNSETOFFLOAD, tso)
        os.set_blocking(fd, False)
        return fd
    except BaseException:
        os.close(fd)
        raise
