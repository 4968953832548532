import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wanprobe import units
from wanprobe.errors import UsageError


@pytest.mark.parametrize(
    "text,seconds",
    [("60ms", 0.060), ("1.5s", 1.5), ("200us", 200e-6), ("2m", 120.0), (" 10 ms ", 0.010), ("0ms", 0.0),
     ("14d", 14 * 86400.0)],
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


def test_limits_are_named_and_bad_text_is_cut():
    """Issue 14: NaN/inf and values beyond a limit are refused naming the limit; a long bad
    value is quoted cut to ~80 characters."""
    with pytest.raises(UsageError, match="above the limit of 24h"):
        units.parse_duration_s("1000h", maximum_s=86400)
    with pytest.raises(UsageError, match="not a finite number"):
        units.parse_duration_s("1e999s")
    with pytest.raises(UsageError, match="above the limit of 65535 bytes"):
        units.parse_bytes("70000", maximum=65535)
    with pytest.raises(UsageError, match="above the limit"):
        units.parse_rate_bps("1e30gbit")
    with pytest.raises(UsageError) as err:
        units.parse_rate_bps("9" * 10_000)
    assert len(str(err.value)) < 160 and "10000 characters" in str(err.value)
    assert units.parse_bytes("131072") == 131072  # a bare size is bytes, as iperf3 -w


def test_interface_names():
    assert units.parse_ifname("eth0") == "eth0"
    for bad in ("", "a" * 16, "a/b", "a:b", "a b", "a\nb", "ü"):
        with pytest.raises(UsageError):
            units.parse_ifname(bad)


def test_cli_value_gate():
    """cli.check_value: every parsed option passes it before a command runs."""
    from wanprobe.cli import check_value

    for bad in (float("nan"), float("inf"), 2**63, -(2**63) - 1, "peer-\udcff", ["ok", "\udcfe"]):
        with pytest.raises(UsageError):
            check_value("--x", bad)
    for good in (1.5, 2**63 - 1, "peer", True, None, ["a", "b"]):
        check_value("--x", good)
