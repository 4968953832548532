"""link tuner (MTU, txqueuelen, rings) in a namespace with a veth pair, and the RoCE tuner on a
writable copy of the synthetic RoCE sysfs tree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURE_TREES, new_lab_name

from tuners import transaction
from tuners.from_report import build_plan
from tuners.journal import JournalStore
from tuners.knob import Change, Skip
from tuners.link import split_key
from tuners.plan import host_id
from tuners.roce import RoceTuner, pfc_value
from wanprobe.errors import ConfigError

DEV = "devices/pci0000:00/0000:00:02.0/0000:17:00.0"


def test_link_keys() -> None:
    assert split_key("eth0/mtu") == ("eth0", "mtu")
    assert split_key("ens1f0np0.100/rx_ring") == ("ens1f0np0.100", "rx_ring")
    for bad in ("eth0/speed", "mtu", "averyveryverylongname/mtu"):
        with pytest.raises(ConfigError):
            split_key(bad)


@pytest.mark.netns
def test_link_mtu_txqueuelen_apply_rollback_and_ring_skip(tmp_path: Path) -> None:
    ns = new_lab_name() + "lk"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "wl0", "type", "veth", "peer", "name", "wl1"], check=True)
        rep = {"schema_version": "1.0", "id": "l1", "host": {}, "peer": {"address": "198.18.0.2"},
               "measurements": {}, "findings": [{"id": "queue", "severity": "low", "title": "short queue", "knobs": [
                   {"tuner": "link", "key": "wl0/mtu", "value": 9000, "reason": "jumbo after DF probe"},
                   {"tuner": "link", "key": "wl0/txqueuelen", "value": 10000, "reason": "R-18"},
                   {"tuner": "link", "key": "wl0/txqueuelen", "value": 20000, "reason": "second choice"},
                   {"tuner": "link", "key": "wl0/rx_ring", "value": 8192, "reason": "R-18"},
                   {"tuner": "link", "key": "wl9/mtu", "value": 9000, "reason": "no such device"}]}]}
        (tmp_path / "r.json").write_text(json.dumps(rep))

        def wp(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "wanprobe", *args],
                                  capture_output=True, text=True, timeout=60, env={**os.environ})

        r = wp("tune", "plan", "-r", str(tmp_path / "r.json"), "-o", str(tmp_path / "p.json"), "--json")
        assert r.returncode == 0, r.stderr
        plan = json.loads(r.stdout)
        assert [(c["key"], c["old"], c["new"]) for c in plan["changes"]] == [
            ("wl0/mtu", "1500", "9000"), ("wl0/txqueuelen", "1000", "10000")]
        skipped = {s["key"]: s["reason"] for s in plan["skipped"]}
        assert "driver" in skipped["wl0/rx_ring"] and "absent" in skipped["wl9/mtu"]
        assert wp("tune", "apply", str(tmp_path / "p.json"), "--yes", "--state-dir", str(tmp_path / "st")).returncode == 0
        show = subprocess.run(["ip", "-n", ns, "link", "show", "wl0"], capture_output=True, text=True).stdout
        assert "mtu 9000" in show and "qlen 10000" in show
        # an out-of-range MTU in a hand-edited plan is refused before anything changes
        bad = json.loads((tmp_path / "p.json").read_text())
        bad["changes"] = [{"tuner": "link", "key": "wl0/mtu", "old": "1500", "new": "70000"}]
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        r = wp("tune", "apply", str(tmp_path / "bad.json"), "--yes", "--state-dir", str(tmp_path / "st"))
        assert r.returncode == 2 and "outside the device's range 68..65535" in r.stderr
        assert wp("tune", "rollback", "--state-dir", str(tmp_path / "st")).returncode == 0
        show = subprocess.run(["ip", "-n", ns, "link", "show", "wl0"], capture_output=True, text=True).stdout
        assert "mtu 1500" in show and "qlen 1000" in show
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture
def roce_tree(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURE_TREES / "synthetic" / "sys", root, symlinks=True)
    for p in root.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return root


def test_pfc_value_forms() -> None:
    assert pfc_value(3) == "0,0,0,1,0,0,0,0" == pfc_value([3]) == pfc_value("0,0,0,1,0,0,0,0")
    with pytest.raises(ConfigError):
        pfc_value("0,1")


def test_roce_plan_apply_rollback_on_sysfs_copy(roce_tree: Path, tmp_path: Path) -> None:
    tuner = RoceTuner(roce_tree, dcb=None)
    ecn = roce_tree / DEV / "net/ens1f0np0/ecn"
    assert tuner.current("ens1f0np0/ecn_np/3") == "1" and tuner.current("ens1f0np0/trust") == "dscp"
    rep = {"schema_version": "1.0", "findings": [{"id": "roce-ecn-off", "severity": "high", "title": "ECN off",
           "knobs": [{"tuner": "roce", "key": "ens1f0np0/ecn_np/4", "value": 1, "reason": "DCQCN on prio 4"},
                     {"tuner": "roce", "key": "ens1f0np0/ecn_rp/4", "value": 1, "reason": "DCQCN on prio 4"},
                     {"tuner": "roce", "key": "ens1f0np0/trust", "value": "dscp", "reason": "trust L3"},
                     {"tuner": "roce", "key": "ens1f0np0/pfc", "value": [3], "reason": "lossless prio 3"}]}]}
    plan = build_plan(rep, {"roce": tuner}, host_id=host_id())
    assert [(c.key, c.old, c.new) for c in plan.changes] == [
        ("ens1f0np0/ecn_np/4", "0", "1"), ("ens1f0np0/ecn_rp/4", "0", "1")]
    assert plan.skipped == (Skip("roce", "ens1f0np0/trust", "already dscp"),)
    pfc = plan.manual[0]
    assert pfc.key == "ens1f0np0/pfc" and pfc.commands == (
        "dcb pfc set dev ens1f0np0 prio-pfc all:off 3:on", "mlnx_qos -i ens1f0np0 --pfc 0,0,0,1,0,0,0,0")
    store = JournalStore(tmp_path / "st")
    transaction.apply_plan(plan, {"roce": tuner}, store, host_id=host_id())
    assert (ecn / "roce_np/enable/4").read_text().strip() == "1" == (ecn / "roce_rp/enable/4").read_text().strip()
    transaction.rollback(store, {"roce": tuner})
    assert (ecn / "roce_np/enable/4").read_text().strip() == "0" == (ecn / "roce_rp/enable/4").read_text().strip()


def test_roce_refuses_bad_values(roce_tree: Path) -> None:
    tuner = RoceTuner(roce_tree, dcb=None)
    for key, value, why in (("ens1f0np0/trust", "vlan", "dscp or pcp"), ("ens1f0np0/ecn_np/9", "1", "unknown roce key"),
                            ("ens1f0np0/ecn_rp/3", "5", "0 or 1")):
        with pytest.raises(ConfigError, match=why):
            tuner.validate(Change("roce", key, None, value))
