"""Plans per host (issue 13): knobs go to the host they name, a plan is bound to that host's
address, and bad input — a plan for another host, a report without capacity, a peer that sent no
host facts — is one clear line with nothing applied."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuners.from_report import build_plan, check_capacity
from tuners.plan import Plan, check_address
from wanprobe.cli import main
from wanprobe.errors import ConfigError

RMEM = {"tuner": "sysctl", "key": "net.ipv4.tcp_rmem", "value": "4096 131072 8000000",
        "reason": "r", "host": "peer", "side": "peer"}
WMEM = {"tuner": "sysctl", "key": "net.ipv4.tcp_wmem", "value": "4096 16384 8000000",
        "reason": "w", "host": "local", "side": "local"}


def report(capacity: float | None = 100e6, peer_facts: dict | None = None) -> dict:
    return {"schema_version": "1.1", "id": "r13", "host": {"hostname": "a", "address": "198.18.0.1"},
            "peer": {"address": "198.18.0.2", "port": 862},
            "measurements": {"path": {"capacity_bits_per_second": capacity,
                                      "capacity_source": "udp_burst" if capacity else
                                      "not measured: the peer's reflector did not answer"},
                             "peer_facts": peer_facts,
                             "errors": {} if peer_facts else {"peer_facts": "peer 198.18.0.2 "
                                                              "sent no host facts"}},
            "findings": [{"id": "path.window_limited", "severity": "critical", "title": "t",
                          "knobs": [RMEM, WMEM]}]}


def test_each_host_gets_its_own_knobs_and_address():
    rep = report()
    peer = build_plan(rep, {}, host_id="m/a", side="peer", local_addresses=frozenset({"198.18.0.1"}))
    assert [c.key for c in peer.changes] == ["net.ipv4.tcp_rmem"]
    assert (peer.for_host, peer.host_address, peer.host_id) == ("peer", "198.18.0.2", "")
    assert "validated when applied" in peer.changes[0].reason
    assert [s.key for s in peer.skipped] == ["net.ipv4.tcp_wmem"]
    assert "--host local" in peer.skipped[0].reason
    # what the planner could not know about a peer that sent no facts is in the plan
    assert peer.unknown and "sent no host facts" in peer.unknown[0]
    again = Plan.from_json(json.loads(json.dumps(peer.to_json())))
    assert again.host_address == "198.18.0.2" and again.unknown == peer.unknown


def test_plan_for_another_address_is_refused():
    rep = report()
    plan = build_plan(rep, {}, host_id="", side="peer", local_addresses=frozenset())
    with pytest.raises(ConfigError, match="not an address of this host"):
        check_address(plan, frozenset({"198.18.0.1", "127.0.0.1"}))
    check_address(plan, frozenset({"198.18.0.2"}))  # on the peer itself: accepted


def test_report_without_capacity_is_refused_for_buffers():
    with pytest.raises(ConfigError, match="no path capacity"):
        check_capacity(report(capacity=None), "R.json")
    check_capacity(report())
    old = {**report(capacity=None), "schema_version": "1.0"}
    check_capacity(old)  # a 1.0 report never had one


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """The real entry point in this process (its error handling included)."""
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_cli_one_line_each(tmp_path: Path, capsys):
    bad = tmp_path / "nocap.json"
    bad.write_text(json.dumps(report(capacity=None)))
    code, _, err = cli(capsys, "tune", "plan", "-r", str(bad), "--proc-root", str(tmp_path))
    assert code != 0 and "no path capacity" in err and len(err.strip().splitlines()) == 1
    good = tmp_path / "r.json"
    good.write_text(json.dumps(report()))
    plan = tmp_path / "peer.json"
    state = tmp_path / "s"
    code, _, err = cli(capsys, "tune", "plan", "-r", str(good), "--host", "peer", "-o",
                       str(plan), "--proc-root", str(tmp_path), "--state-dir", str(state))
    assert code == 0, err
    assert "could not know the peer's current tcp_rmem" in err
    code, _, err = cli(capsys, "tune", "apply", str(plan), "--yes", "--proc-root",
                       str(tmp_path), "--state-dir", str(state))
    assert code != 0 and "not an address of this host" in err, err
    assert len(err.strip().splitlines()) == 1
    journals = state / "journal"
    assert not journals.exists() or not any(journals.iterdir())  # nothing journalled or set


def test_a_slow_nic_is_read_from_the_typed_report() -> None:
    """R-29: at <= 100 Mbit/s big buffers hurt; the interface is the MTU search's toward the
    peer, and its speed the host's interface facts (diagnose/host_inputs.py)."""
    from tuners.from_report import slow_nic

    doc = {"host": {"ifaces": {"eth0": {"speed_mbps": 100}, "eth1": {"speed_mbps": 25000}}},
           "measurements": {"mtu": {"iface": "eth0"}}}
    assert "eth0 runs at 100 Mbit/s" in slow_nic(doc)
    doc["measurements"]["mtu"]["iface"] = "eth1"
    assert slow_nic(doc) is None
    assert slow_nic({"host": doc["host"], "measurements": {}}) is None   # no interface known


def test_what_a_peer_plan_cannot_know_names_why() -> None:
    from tuners.from_report import unknown_of

    said = unknown_of({"measurements": {"peer_facts": None,
                                        "errors": {"peer_facts": "the peer runs wanprobe 0.9"}}},
                      "peer")
    assert len(said) == 1 and "(the peer runs wanprobe 0.9)" in said[0]
    assert unknown_of({"measurements": {}}, "peer") == ()          # 1.0: one host only
    assert unknown_of({"measurements": {"peer_facts": None}}, "local") == ()
