"""SIOCETHTOOL codecs against the struct layouts of include/uapi/linux/ethtool.h."""

from __future__ import annotations

import struct

from collectors.ethtool_ioctl import (
    ETHTOOL_GSTATS,
    ETHTOOL_GSTRINGS,
    pack_drvinfo,
    pack_gstats,
    pack_gstrings,
    pack_ringparam,
    pack_sset_info,
    unpack_drvinfo,
    unpack_gstats,
    unpack_gstrings,
    unpack_ringparam,
    unpack_sset_info,
)
from collectors.ethtool_text import counterset_from_pairs


def test_sset_info_layout():
    b = pack_sset_info()
    # u32 cmd=0x37, u32 reserved, u64 sset_mask = 1<<ETH_SS_STATS(1), u32 data[0]
    assert b == bytes([0x37, 0, 0, 0]) + bytes(4) + (2).to_bytes(8, "little") + bytes(4)
    filled = b[:16] + (42).to_bytes(4, "little")
    assert unpack_sset_info(filled) == 42
    assert unpack_sset_info(b[:8] + bytes(8) + (42).to_bytes(4, "little")) is None  # set absent


def test_gstrings_layout():
    b = pack_gstrings(2, slack=3)
    assert struct.unpack_from("=III", b) == (ETHTOOL_GSTRINGS, 1, 2) and len(b) == 12 + 5 * 32
    filled = struct.pack("=III", ETHTOOL_GSTRINGS, 1, 2) + b"rx_packets".ljust(32, b"\0") \
        + b"rx_prio3_pause_duration".ljust(32, b"\0") + bytes(96)
    assert unpack_gstrings(filled) == ["rx_packets", "rx_prio3_pause_duration"]


def test_gstats_layout():
    b = pack_gstats(2)
    assert struct.unpack_from("=II", b) == (ETHTOOL_GSTATS, 2) and len(b) == 8 + 16
    filled = struct.pack("=IIQQ", ETHTOOL_GSTATS, 2, 2**64 - 1, 7)
    assert unpack_gstats(filled) == [2**64 - 1, 7]


def test_ringparam_and_drvinfo_layout():
    assert len(pack_ringparam()) == 36                     # cmd + 8 × u32
    r = unpack_ringparam(struct.pack("=9I", 0x10, 8192, 0, 0, 8192, 1024, 0, 0, 512))
    assert r["rx_max_pending"] == 8192 and r["rx_pending"] == 1024 and r["tx_pending"] == 512
    assert len(pack_drvinfo()) == 196                      # sizeof(struct ethtool_drvinfo)
    raw = struct.pack("=I32s32s32s32s32s12s5I", 3, b"mlx5_core", b"6.8", b"28.39", b"0000:17:00.0",
                      b"", b"", 0, 88, 0, 0, 0)
    info = unpack_drvinfo(raw)
    assert info["driver"] == "mlx5_core" and info["n_stats"] == 88


def test_counterset_units_and_duplicates():
    cs = counterset_from_pairs([("rx_prio3_pause_duration", 5), ("rx_bytes_phy", 9), ("q", 1),
                                ("q", 2)], "x")
    assert cs.units == {"rx_prio3_pause_duration": "us", "rx_bytes_phy": "bytes"}
    assert cs.values == {"rx_prio3_pause_duration": 5, "rx_bytes_phy": 9, "q": 1, "q#2": 2}
    assert cs.width("q") == 64
