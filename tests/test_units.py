import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wanprobe import units
from wanprobe.errors import UsageError


@pytest.mark.parametrize(
    "text,seconds",
    [("60ms", 0.060), ("1.5s", 1.5), ("200us", 200e-6), ("2m", 120.0), (" 10 ms ", 0.010), ("0ms", 0.0)],
)
def test_duration(text, seconds):
    assert math.isclose(units.parse_duration_s(text), seconds)


def test_duration_default_unit_and_errors():
    assert units.parse_duration_ms("5", default_unit="s") == 5000
    for bad in ("5", "-1ms", "abc", "10 parsecs", "nanms", "inf s"):
        with pytest.raises(UsageError):
            units.parse_duration_s(bad)


@pytest.mark.parametrize(
    "text,bps", [("100mbit", 100e6), ("10gbit", 10e9), ("2.5Gbps", 2.5e9), ("500kbit/s", 500e3), ("1g", 1e9)]
)
def test_rate(text, bps):
    assert units.parse_rate_bps(text) == bps


def test_rate_errors():
    for bad in ("100", "0mbit", "-5mbit", "fast", "10 furlongs"):
        with pytest.raises(UsageError):
            units.parse_rate_bps(bad)


def test_ratio():
    assert units.parse_ratio("0.5%") == 0.005
    assert units.parse_ratio("0.25") == 0.25
    assert units.parse_ratio("100%") == 1.0
    for bad in ("101%", "-1%", "1.5", "x"):
        with pytest.raises(UsageError):
            units.parse_ratio(bad)


def test_bytes():
    assert units.parse_bytes("64MiB") == 64 * 2**20
    assert units.parse_bytes("4M") == 4_000_000
    assert units.parse_bytes("1500") == 1500
    with pytest.raises(UsageError):
        units.parse_bytes("1500", allow_bare=False)
    with pytest.raises(UsageError):
        units.parse_bytes("12 parsecs")


def test_dscp_names_match_rfc_values():
    # RFC 2597 AF table and RFC 3246 EF
    assert units.parse_dscp("AF31") == 26
    assert units.parse_dscp("af41") == 34
    assert units.parse_dscp("EF") == 46
    assert units.parse_dscp("CS6") == 48
    assert units.parse_dscp("26") == 26
    assert units.dscp_name(26) == "AF31"
    for bad in ("64", "-1", "AF51", "GOLD"):
        with pytest.raises(UsageError):
            units.parse_dscp(bad)


@given(st.integers(min_value=0, max_value=63))
def test_dscp_roundtrip(v):
    assert units.parse_dscp(units.dscp_name(v)) == v


def test_port():
    assert units.parse_port("862") == 862
    for bad in ("0", "65536", "x"):
        with pytest.raises(UsageError):
            units.parse_port(bad)


def test_format():
    assert units.format_rate(123_456_789) == "123.5 Mbit/s"
    assert units.format_bytes(6 * 2**20) == "6.0 MiB"
