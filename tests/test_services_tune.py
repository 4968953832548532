"""The tune service (wanprobe/services/tune.py) on a /proc/sys tree: dry run → apply → status →
rollback through one TuneSession, the messages it hands its caller, and the checks that come
before anything changes (--persist from a container namespace, --report-out without --verify)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_tuners_transaction import GOOD, plan_of, snapshot
from tuner_cases import make_proc

from wanprobe.errors import ConfigError, UsageError
from wanprobe.services import tune


@pytest.fixture
def session(tmp_path: Path):
    proc = make_proc(tmp_path / "proc")
    (tmp_path / "sys").mkdir()
    said: list[str] = []
    s = tune.TuneSession.open(netns=None, proc_root=str(proc), sys_root=str(tmp_path / "sys"),
                              state_dir=str(tmp_path / "state"), say=said.append)
    return s, proc, said


def test_dry_run_changes_nothing_then_apply_status_rollback(session) -> None:
    s, proc, said = session
    before = snapshot(proc)
    plan = plan_of(*GOOD)
    prep = s.dry_run(plan)
    assert {c.key for c in prep.changes} == {k for k, _ in GOOD} and snapshot(proc) == before
    done = s.apply(plan)
    assert done.checked is None                     # no --verify: no re-measure
    doc = done.to_json()
    assert doc["verify"] is None and len(doc["journal"]["entries"]) == len(GOOD)
    assert snapshot(proc)["sys/net/ipv4/tcp_congestion_control"] == "bbr"
    rows = s.status()
    assert len(rows) == 1 and rows[0]["journal"] == done.journal.id and not rows[0]["drift"]
    back = s.rollback(None)
    assert back.state == "rolled_back" and snapshot(proc) == before
    assert said == []


def test_an_apply_already_in_place_has_no_journal(session) -> None:
    s, proc, _ = session
    live = " ".join((proc / "sys/net/ipv4/tcp_rmem").read_text().split())
    done = s.apply(plan_of(("net.ipv4.tcp_rmem", live)))
    assert done.journal is None and done.to_json()["journal"] is None


def test_verify_without_a_peer_is_none_and_a_failed_measure_is_one_line(session) -> None:
    s, _, said = session
    assert s.verify(None) is None
    # nothing listens on loopback's port 862 here: the re-measure fails, the apply stands, and
    # the loop's error comes back as one line
    assert s.verify("127.0.0.1") is None
    assert len(said) == 1 and said[0].startswith("wanprobe: applied, but --verify could not measure")


def test_persist_from_a_container_namespace_needs_its_own_directory(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("WANPROBE_SYSCTL_D", raising=False)
    monkeypatch.setattr("tuners.netns.is_init_netns", lambda: False)
    assert tune.persist_dir(False, None) is None
    with pytest.raises(ConfigError, match="non-init network namespace"):
        tune.persist_dir(True, None)
    assert tune.persist_dir(True, str(tmp_path)) == tmp_path


def test_report_out_is_checked_before_anything_changes(tmp_path) -> None:
    plan = plan_of(*GOOD)
    with pytest.raises(UsageError, match="needs --verify"):
        tune.source_report(plan, str(tmp_path / "out.json"), None)
    with pytest.raises(ConfigError, match="names no source report"):
        tune.source_report(plan, str(tmp_path / "out.json"), "198.18.0.2")


def test_write_verified_report_without_a_result_says_so_and_writes_nothing(tmp_path) -> None:
    said: list[str] = []
    out = tmp_path / "r.json"
    tune.write_verified_report(json.loads("{}"), None, str(out), said.append)
    assert not out.exists() and said == [f"wanprobe: --report-out {out} not written: no verify result"]
