"""Rates: counter wrap at the declared width, reset detection, never a negative rate."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collectors.rates import counter_delta, group_rates, rates
from collectors.sample import CounterSet
from collectors.snapshot import Netdev, Snapshot
from wanprobe.errors import WanprobeError

WIDTHS = st.sampled_from([32, 64])


@given(width=WIDTHS, data=st.data())
def test_wrap_gives_exact_delta(width, data):
    modulus = 1 << width
    prev = data.draw(st.integers(0, modulus - 1))
    delta = data.draw(st.integers(0, (modulus >> 1) - 1))
    cur = (prev + delta) % modulus
    got, status = counter_delta(prev, cur, width)
    assert got == delta
    assert status == ("wrapped" if cur < prev else "ok")


@given(width=st.one_of(st.none(), WIDTHS), prev=st.integers(0, 2**64 - 1),
       cur=st.integers(0, 2**64 - 1))
def test_never_negative(width, prev, cur):
    delta, status = counter_delta(prev, cur, width)
    if delta is None:
        assert status == "reset"
    else:
        assert delta >= 0 and status in ("ok", "wrapped")


@given(width=WIDTHS, data=st.data())
def test_decrease_that_cannot_be_a_wrap_is_reset(width, data):
    """A drop whose wrapped distance would be ≥ half the range (e.g. 1000 → 5 after a driver
    reload) cannot be told from a reset, so it is reported as one."""
    modulus = 1 << width
    prev = data.draw(st.integers(1, modulus - 1))
    cur = data.draw(st.integers(max(0, prev - (modulus >> 1)), prev - 1))
    assert counter_delta(prev, cur, width) == (None, "reset")


def test_non_wrapping_counter_decrease_is_reset():
    # IB PMA counters saturate (no width declared): any decrease is a reset
    assert counter_delta(1000, 3, None) == (None, "reset")
    assert counter_delta(2**32 - 2, 5, 32) == (7, "wrapped")
    assert counter_delta(2**64 - 1, 0, 64) == (1, "wrapped")


def _snap(mono, values, widths, ifindex=7):
    cs = CounterSet("/x/statistics", values, widths=widths)
    nd = Netdev(name="e0", path="/x", ifindex=ifindex, mtu=1500, operstate="up", speed_mbps=None,
                carrier_changes=0, tx_queue_len=None, driver=None, qos_trust=None, stats=cs)
    return Snapshot(taken_at_s=0, monotonic_s=mono, sys_root="/s", proc_root="/p", netns=None,
                    netdevs={"e0": nd})


def test_rates_json_marks_reset_and_wrap():
    a = _snap(100.0, {"rx_bytes": 2**32 - 100, "tx_bytes": 5000, "gone": 1}, {"rx_bytes": 32})
    b = _snap(102.0, {"rx_bytes": 300, "tx_bytes": 10, "new": 4}, {"rx_bytes": 32})
    r = rates(a, b)
    j = r.to_json()
    assert j["interval_s"] == 2.0
    assert j["netdevs"]["e0"]["stats"]["rx_bytes"] == 200.0          # 400 bytes over 2 s
    assert j["netdevs"]["e0"]["stats"]["tx_bytes"] == "reset"
    assert "new" not in j["netdevs"]["e0"]["stats"] and "gone" not in j["netdevs"]["e0"]["stats"]
    assert j["resets"] == ["netdevs.e0.stats.tx_bytes"]


def test_ifindex_change_resets_whole_device():
    a = _snap(1.0, {"rx_packets": 10}, {"rx_packets": 64}, ifindex=7)
    b = _snap(2.0, {"rx_packets": 20}, {"rx_packets": 64}, ifindex=9)
    assert rates(a, b).get(("netdevs", "e0", "stats"), "rx_packets").status == "reset"


def test_gauges_get_no_rate():
    a = CounterSet("/p", {"CurrEstab": 5, "OutSegs": 1}, gauges=frozenset({"CurrEstab"}))
    b = dataclasses.replace(a, values={"CurrEstab": 2, "OutSegs": 11})
    out = group_rates(a, b, 1.0)
    assert set(out) == {"OutSegs"} and out["OutSegs"].per_s == 10.0


def test_out_of_order_samples_refused():
    a = _snap(5.0, {"rx_packets": 1}, {})
    with pytest.raises(WanprobeError):
        rates(a, a)


@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
                          st.sampled_from([None, 32, 64])), min_size=1, max_size=20),
       st.floats(0.001, 100.0))
def test_rates_over_snapshots_never_negative(triples, interval):
    prev = {f"c{i}": p % (1 << w) if w else p for i, (p, _, w) in enumerate(triples)}
    cur = {f"c{i}": c % (1 << w) if w else c for i, (_, c, w) in enumerate(triples)}
    widths = {f"c{i}": w for i, (_, _, w) in enumerate(triples)}
    r = rates(_snap(10.0, prev, widths), _snap(10.0 + interval, cur, widths))
    for name, sample in r.groups[("netdevs", "e0", "stats")].items():
        j = sample.to_json()
        assert j == "reset" or (j >= 0 and sample.delta >= 0)
        if cur[name] >= prev[name]:
            assert sample.delta == cur[name] - prev[name]
