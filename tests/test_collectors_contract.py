"""The collector contract: every collector is one function ``(roots, got) -> Reading`` with a
status (ok / no_data / error with its path); a collector that raises is reported, never fatal."""

from __future__ import annotations

import inspect
from pathlib import Path

from conftest import FIXTURE_TREES

from collectors import contract
from collectors.snapshot import Collector

SYS = FIXTURE_TREES / "synthetic" / "sys"
PROC = FIXTURE_TREES / "procfs" / "proc"
ETHTOOL = Path(__file__).parent / "fixtures" / "collectors" / "ethtool"


def test_every_collector_has_the_one_signature():
    for name, fn in contract.COLLECTORS:
        params = list(inspect.signature(fn).parameters)
        assert params == ["roots", "got"], (name, params)
        assert fn.__doc__, name


def test_statuses_on_the_synthetic_tree():
    with Collector(SYS, PROC, ETHTOOL) as c:
        snap = c.sample()
        got = c.readings
    status = {n: r.status for n, r in got.items()}
    assert status == {"rdma": "ok", "netlink_link": "no_data", "sysfs_net": "ok", "ethtool": "ok",
                      "sysfs_ecn": "ok", "dcb": "no_data", "procfs_netstat": "ok",
                      "procfs_sysctl": "no_data"}  # the procfs capture has no /proc/sys
    assert got["procfs_sysctl"].path == str(PROC / "sys")
    assert snap.netdevs["ens1f0np0"].ecn is not None and snap.tcp is not None


def test_missing_roots_are_no_data_not_errors(tmp_path):
    with Collector(tmp_path / "nosys", tmp_path / "noproc") as c:
        snap = c.sample()
        got = c.readings
    assert snap.netdevs == {} and snap.rdma == {}
    assert {r.status for r in got.values()} <= {"no_data", "error"}
    assert got["rdma"].status == "no_data" and got["sysfs_net"].status == "no_data"


def test_a_raising_collector_is_an_error_reading_and_the_rest_still_runs(monkeypatch):
    def broken(roots, got):
        raise OSError(5, "Input/output error")

    table = tuple((n, broken if n == "sysfs_ecn" else fn) for n, fn in contract.COLLECTORS)
    monkeypatch.setattr(contract, "COLLECTORS", table)
    with Collector(SYS, PROC, ETHTOOL) as c:
        snap = c.sample()
        got = c.readings
    assert got["sysfs_ecn"].status == "error" and "Input/output error" in got["sysfs_ecn"].errors[0].reason
    assert snap.netdevs["ens1f0np0"].ecn is None            # that reading is missing ...
    assert snap.netdevs["ens1f0np0"].ethtool is not None    # ... the others are there
    assert any(e.source == "sysfs_ecn" for e in snap.errors)
