"""DSCP marking: classifier validation and rule text (unit), and live marking between two
namespaces joined by a veth pair, checked on the far end with IP_RECVTOS (netns)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import new_lab_name

from tuners.dscp import canonical, ipt_rules, nft_script
from wanprobe.errors import ConfigError, UsageError

A_ADDR, B_ADDR, PORT = "198.18.77.1", "198.18.77.2", 47001


def test_canonical_and_rules() -> None:
    spec = canonical({"dscp": "AF41", "daddr": ["198.18.0.2", "fd00::/8"], "proto": "udp", "dport": "5000-5100"})
    assert spec[0]["dscp"] == 34 and spec[0]["daddr"] == ["198.18.0.2/32", "fd00::/8"]
    text = nft_script(spec, replace=False)
    assert "ip daddr { 198.18.0.2/32 } meta l4proto udp udp dport 5000-5100 ip dscp set 34" in text
    assert "ip6 daddr { fd00::/8 }" in text and "ip6 dscp set 34" in text
    assert "priority mangle" in text
    uid = canonical([{"dscp": 26, "uid": 1000}, {"dscp": "CS1", "cgroup": "/training.slice/job"}])
    rules = ipt_rules(uid)
    assert ("ip", ["-A", "WANPROBE", "-m", "owner", "--uid-owner", "1000", "-m", "comment", "--comment",
                   rules[0][1][9], "-j", "DSCP", "--set-dscp", "0x1a"]) == rules[0]
    assert rules[0][1][9].startswith("wanprobe:")
    assert 'socket cgroupv2 level 2 "training.slice/job"' in nft_script(uid, replace=True)


@pytest.mark.parametrize("bad,why", [
    ({"dscp": 64, "uid": 1}, "DSCP"),
    ({"dscp": 26}, "never mark everything"),
    ({"dscp": 26, "daddr": "300.1.1.1"}, "daddr"),
    ({"dscp": 26, "dport": "6000-5000"}, "reversed"),
    ({"dscp": 26, "uid": 1, "color": "red"}, "unknown dscp classifier"),
])
def test_canonical_refuses(bad, why) -> None:
    with pytest.raises((ConfigError, UsageError)) as err:
        canonical(bad)
    assert why.lower() in str(err.value).lower()


# -- live ---------------------------------------------------------------------------------------

RECEIVER = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.settimeout(10)
print("ready", flush=True)
data, anc, flags, addr = s.recvmsg(2048, socket.CMSG_SPACE(4))
tos = [c[2][0] for c in anc if c[0] == socket.IPPROTO_IP and c[1] == socket.IP_TOS]
print(tos[0] if tos else -1, flush=True)
"""
SENDER = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, int(sys.argv[3]))  # ECN bits the marking must keep
for _ in range(3):
    s.sendto(b"x", (sys.argv[1], int(sys.argv[2])))
"""


@pytest.fixture
def veth_pair():
    """Two namespaces a, b joined by a veth pair (198.18.77.1/24 - .2/24); deleted afterwards."""
    a, b = new_lab_name() + "da", new_lab_name() + "db"
    made = []
    try:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "add", ns], check=True)
            made.append(ns)
        subprocess.run(["ip", "-n", a, "link", "add", "wp0", "type", "veth", "peer", "name", "wp1", "netns", b], check=True)
        for ns, dev, addr in ((a, "wp0", A_ADDR), (b, "wp1", B_ADDR)):
            subprocess.run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev], check=True)
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
            subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        yield a, b
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def received_tos(a: str, b: str, ecn: int = 2) -> int:
    rx = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, "-c", RECEIVER, B_ADDR, str(PORT)],
                          stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout.readline().strip() == "ready"
        subprocess.run(["ip", "netns", "exec", a, sys.executable, "-c", SENDER, B_ADDR, str(PORT), str(ecn)], check=True)
        return int(rx.stdout.readline())
    finally:
        rx.kill()
        rx.wait()


def wanprobe(ns: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "wanprobe", *args],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


PORT_CLASSIFIER = {"dscp": "AF41", "daddr": [f"{B_ADDR}/32"], "proto": "udp", "dport": f"{PORT}-{PORT + 10}"}


def plan_and_apply(ns: str, tmp_path: Path, env: dict, classifier=PORT_CLASSIFIER) -> dict:
    rep = {"schema_version": "1.0", "id": "d1", "host": {}, "peer": {"address": B_ADDR}, "measurements": {},
           "findings": [{"id": "dscp-bleached", "severity": "medium", "title": "unmarked",
                         "knobs": [{"tuner": "dscp", "key": "training", "reason": "mark training traffic AF41",
                                    "value": classifier}]}]}
    (tmp_path / "r.json").write_text(json.dumps(rep))
    r = wanprobe(ns, "tune", "plan", "-r", str(tmp_path / "r.json"), "-o", str(tmp_path / "p.json"), "--json", env=env)
    assert r.returncode == 0, r.stderr
    r = wanprobe(ns, "tune", "apply", str(tmp_path / "p.json"), "--yes", "--state-dir", str(tmp_path / "st"), env=env)
    assert r.returncode == 0, r.stderr
    return json.loads((tmp_path / "p.json").read_text())


@pytest.mark.netns
@pytest.mark.parametrize("classifier", [PORT_CLASSIFIER, json.dumps({"dscp": "AF41", "uid": 0})],
                         ids=["prefix-port", "uid-as-json-string"])  # report knob values are strings
def test_nft_table_marks_and_rollback_removes_it(veth_pair, tmp_path: Path, classifier) -> None:
    a, b = veth_pair
    assert received_tos(a, b) == 2
    plan = plan_and_apply(a, tmp_path, {}, classifier)
    assert plan["changes"][0]["key"] == "nft:inet wanprobe"
    assert received_tos(a, b, ecn=2) == 34 << 2 | 2  # AF41, ECT(0) kept
    assert received_tos(a, b, ecn=3) == 34 << 2 | 3
    assert "table inet wanprobe" in subprocess.run(["ip", "netns", "exec", a, "nft", "list", "tables"],
                                                   capture_output=True, text=True).stdout
    r = wanprobe(a, "tune", "rollback", "--print", "--state-dir", str(tmp_path / "st"))
    # issue 14: a namespace journal's rollback acts on that namespace, not on the host
    assert r.stdout.splitlines()[-1] == f"ip netns exec {a} nft delete table inet wanprobe"
    r = wanprobe(a, "tune", "rollback", "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 0, r.stderr
    assert "wanprobe" not in subprocess.run(["ip", "netns", "exec", a, "nft", "list", "tables"],
                                            capture_output=True, text=True).stdout
    assert received_tos(a, b) == 2


@pytest.mark.netns
def test_iptables_fallback_when_nft_is_missing(veth_pair, tmp_path: Path) -> None:
    a, b = veth_pair
    env = {"WANPROBE_NFT": ""}  # as if nft were not installed
    plan = plan_and_apply(a, tmp_path, env)
    assert plan["changes"][0]["key"] == "iptables:mangle WANPROBE"
    assert received_tos(a, b, ecn=0) == 34 << 2
    assert received_tos(a, b, ecn=1) == 34 << 2 | 1  # xt_DSCP keeps the ECN bits too
    rules = subprocess.run(["ip", "netns", "exec", a, "iptables", "-t", "mangle", "-S"], capture_output=True, text=True).stdout
    assert "-A OUTPUT -j WANPROBE" in rules and "--set-dscp 0x22" in rules
    r = wanprobe(a, "tune", "rollback", "--state-dir", str(tmp_path / "st"), env=env)
    assert r.returncode == 0, r.stderr
    rules = subprocess.run(["ip", "netns", "exec", a, "iptables", "-t", "mangle", "-S"], capture_output=True, text=True).stdout
    assert "WANPROBE" not in rules
    assert received_tos(a, b, ecn=0) == 0
