"""DSCP marking: classifier validation and rule text (unit), and live marking between two
namespaces joined by a veth pair, checked on the far end with IP_RECVTOS (netns)."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import new_lab_name

from tuners import dscp_nft
from tuners.dscp import DscpTuner, canonical, ipt_rules, ipt_values, nft_ruleset
from wanprobe.errors import ConfigError, UsageError

A_ADDR, B_ADDR, PORT = "198.18.77.1", "198.18.77.2", 47001


def test_canonical_and_rules() -> None:
    spec = canonical({"dscp": "AF41", "daddr": ["198.18.0.2", "fd00::/8"], "proto": "udp", "dport": "5000-5100"})
    assert spec[0]["dscp"] == 34 and spec[0]["daddr"] == ["198.18.0.2/32", "fd00::/8"]
    cmds = nft_ruleset(spec, replace=False)["nftables"]
    assert cmds[1] == {"add": {"chain": {"family": "inet", "table": "wanprobe", "name": "out",
                                         "type": "filter", "hook": "output", "prio": -150,
                                         "policy": "accept"}}}
    rules = [c["add"]["rule"] for c in cmds if "rule" in c["add"]]
    assert [dscp_nft.rule_values(r["expr"]) for r in rules] == [
        ("ip", ("198.18.0.2/32",), ("udp",), "5000-5100", None, None, 34),
        ("ip6", ("fd00::/8",), ("udp",), "5000-5100", None, None, 34)]
    assert rules[0]["expr"][-1] == {"mangle": {"key": {"payload": {"protocol": "ip", "field": "dscp"}},
                                               "value": 34}}
    assert nft_ruleset(spec, replace=True)["nftables"][1] == {"delete": {"table": dscp_nft.TABLE}}
    uid = canonical([{"dscp": 26, "uid": 1000}, {"dscp": "CS1", "cgroup": "/training.slice/job"}])
    rules = ipt_rules(uid)
    assert ("ip", ["-A", "WANPROBE", "-m", "owner", "--uid-owner", "1000", "-m", "comment", "--comment",
                   rules[0][1][9], "-j", "DSCP", "--set-dscp", "0x1a"]) == rules[0]
    assert rules[0][1][9].startswith("wanprobe:")
    cg = [c["add"]["rule"]["expr"] for c in nft_ruleset(uid, replace=False)["nftables"]
          if "rule" in c["add"]][-1]
    assert {"match": {"op": "==", "left": {"socket": {"key": "cgroupv2", "level": 2}},
                      "right": "training.slice/job"}} in cg


def test_listing_normalisation_decodes_to_the_same_values() -> None:
    """What nft 1.0.6 lists for a rule it was given (implied nfproto/l4proto gone, /32 as an
    address, one-element set unwrapped, DSCP by name) decodes to the values it was given."""
    listed = [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}},
                         "right": {"set": [{"prefix": {"addr": "10.0.0.0", "len": 8}}, "198.18.0.2"]}}},
              {"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}},
                         "right": 47001}},
              {"mangle": {"key": {"payload": {"protocol": "ip", "field": "dscp"}}, "value": "af41"}}]
    spec = canonical({"dscp": 34, "daddr": ["198.18.0.2", "10.0.0.0/8"], "proto": "udp", "dport": 47001})
    given = [c["add"]["rule"]["expr"] for c in nft_ruleset(spec, replace=False)["nftables"]
             if "rule" in c["add"]]
    assert [dscp_nft.rule_values(e) for e in given] == [dscp_nft.rule_values(listed)]
    listed[-1]["mangle"]["value"] = "af42"
    assert [dscp_nft.rule_values(e) for e in given] != [dscp_nft.rule_values(listed)]


def test_iptables_lines_compare_by_value() -> None:
    spec = canonical({"dscp": "AF41", "daddr": "198.18.77.2", "proto": "udp", "dport": "47001-47011"})
    mine = {"ip": ["-N WANPROBE"] + [" ".join(a) for f, a in ipt_rules(spec) if f == "ip"]}
    live = {"ip": ["-N WANPROBE", "-A WANPROBE -d 198.18.77.2/32 -p udp -m udp --dport 47001:47011 "
                   "-m comment --comment wanprobe:x -j DSCP --set-dscp 0x22"]}
    assert ipt_values(mine) == ipt_values(live)
    live["ip"][1] = live["ip"][1].replace("0x22", "0x24")
    assert ipt_values(mine) != ipt_values(live)


@pytest.mark.parametrize("bad,why", [
    ({"dscp": 64, "uid": 1}, "DSCP"),
    ({"dscp": True, "uid": 1}, "dscp must be"),
    ({"dscp": 26}, "never mark everything"),
    ({"dscp": 26, "daddr": "300.1.1.1"}, "daddr"),
    ({"dscp": 26, "daddr": [5]}, "daddr"),
    ({"dscp": 26, "dport": "6000-5000"}, "reversed"),
    ({"dscp": 26, "dport": "5000;6000"}, "dport"),
    ({"dscp": 26, "uid": True}, "uid"),
    ({"dscp": 26, "uid": 2**32}, "uid"),
    ({"dscp": 26, "uid": 1, "color": "red"}, "unknown dscp classifier"),
    ({"dscp": 26, "cgroup": "training.slice/job\nrm -rf"}, "cgroup"),
    ({"dscp": 26, "cgroup": 'a"b'}, "cgroup"),
    ({"dscp": 26, "cgroup": "a/../b"}, "cgroup"),
    ({"dscp": 26, "cgroup": "a b"}, "cgroup"),
    ({"dscp": 26, "cgroup": "/"}, "cgroup"),
])
def test_canonical_refuses(bad, why) -> None:
    with pytest.raises((ConfigError, UsageError)) as err:
        canonical(bad)
    assert why.lower() in str(err.value).lower()


@pytest.mark.parametrize("daddr", ["0.0.0.0/0", "::/0", ["0.0.0.0/1", "128.0.0.0/1"],
                                   ["198.18.0.2", "0.0.0.0/0"]])
def test_a_prefix_covering_a_whole_family_is_everything(daddr) -> None:
    """Issue 19: daddr 0.0.0.0/0 with CS7 was applied (all IPv4 egress marked CS7) past the
    "never mark everything" check; prefixes that add up to a family count too."""
    with pytest.raises(ConfigError, match="never mark everything"):
        canonical({"dscp": "AF41", "daddr": daddr})
    assert canonical({"dscp": "AF41", "daddr": daddr, "dport": 47001})  # narrowed by port


def test_network_control_dscp_needs_the_operator(tmp_path) -> None:
    """The one DSCP policy (probe/access.py): no CS6/CS7 in a plan unless allowed."""
    from tuners.knob import Change, Skip
    from wanprobe.probe.access import DscpPolicy

    cs7 = json.dumps([{"dscp": 56, "daddr": ["198.18.0.2/32"]}])
    tuner = DscpTuner(nft=None, iptables=str(tmp_path / "absent"), ip6tables=str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="CS7.*not permitted"):
        tuner.validate(Change("dscp", "iptables:mangle WANPROBE", None, cs7))
    skipped = tuner.plan("iptables:mangle WANPROBE", json.loads(cs7), "r")
    assert isinstance(skipped, Skip) and "allow-network-control-dscp" in skipped.reason
    allowed = DscpTuner(nft=None, iptables=str(tmp_path / "absent"),
                        ip6tables=str(tmp_path / "absent"), permitted=DscpPolicy(frozenset(range(64))))
    allowed.validate(Change("dscp", "iptables:mangle WANPROBE", None, cs7))


ALL_PORTS = "1-65535"


@pytest.mark.parametrize("spec,named", [
    # issue 37's bypasses: each classifier passed alone, the plan marks (nearly) all egress
    ([{"dscp": 26, "daddr": ["0.0.0.0/0", "::/0"], "dport": ALL_PORTS}], ["#1"]),
    ([{"dscp": 26, "daddr": "0.0.0.0/1"}, {"dscp": 26, "daddr": "128.0.0.0/1"}], ["#1", "#2"]),
    ([{"dscp": 26, "dport": ALL_PORTS}], ["#1"]),
    ([{"dscp": 26, "uid": 0}], ["uid 0"]),
    ([{"dscp": 26, "uid": 0, "dport": ALL_PORTS}], ["uid 0"]),
    # split over classifiers by port, by protocol, or all but one address
    ([{"dscp": 26, "dport": "1-30000"}, {"dscp": 26, "proto": "tcp", "dport": "30001-65535"},
      {"dscp": 26, "uid": 1000}], ["#1", "#2"]),
    ([{"dscp": 26, "daddr": "::/1", "proto": "udp"}, {"dscp": 26, "daddr": "8000::/1"}], ["#2"]),
    ([{"dscp": 26, "daddr": [str(n) for n in ipaddress.ip_network("0.0.0.0/0")
                             .address_exclude(ipaddress.ip_network("198.18.0.1/32"))]}], ["#1"]),
])
def test_the_union_of_a_plans_classifiers_is_judged(spec, named) -> None:
    """Issue 37: "everything" is judged over all of a plan's classifiers together (address
    coverage per family, ports, protocols; uid 0 narrows nothing), naming those involved."""
    with pytest.raises(ConfigError, match="never mark everything") as err:
        canonical(spec)
    assert all(n in str(err.value) for n in named) and "\n" not in str(err.value)
    narrowed = [{**c, "daddr": "198.18.0.2"} for c in spec]  # one host: a job, not the host
    assert canonical(narrowed)


@pytest.mark.parametrize("spec", [
    [{"dscp": 26, "daddr": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                            "fc00::/7"]}],  # every private block (RFC 1918, 6598, 4193)
    [{"dscp": 26, "daddr": "0.0.0.0/0", "dport": 47001}, {"dscp": 26, "dport": "29500-29510"}],
    [{"dscp": 26, "uid": 1000}, {"dscp": 26, "cgroup": "training.slice"}],
    [{"dscp": 26, "uid": 0, "daddr": "198.18.0.0/15"}],
])
def test_narrow_plans_still_pass(spec) -> None:
    assert len(canonical(spec)) == len(spec)


@pytest.mark.parametrize("dscp", range(48, 64))
def test_the_whole_network_control_range_needs_the_operator(tmp_path, dscp) -> None:
    """IP precedence 6 and 7 (RFC 791, RFC 2474 §4.2.2.2) are 48-63, not just CS6/CS7: issue
    37 applied DSCP 62. The refusal is one line naming the classifier and the value."""
    from tuners.knob import Change

    plan = json.dumps([{"dscp": 26, "uid": 1000}, {"dscp": dscp, "daddr": ["198.18.0.2/32"]}])
    tuner = DscpTuner(nft=None, iptables=str(tmp_path / "absent"), ip6tables=str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match=f"classifier #2 .*DSCP .*{dscp}.* not permitted"):
        tuner.validate(Change("dscp", "iptables:mangle WANPROBE", None, plan))
    tuner.validate(Change("dscp", "iptables:mangle WANPROBE", None, plan.replace(f": {dscp},", ": 47,")))


def test_cgroup_classifiers_fall_back_to_iptables_when_nft_json_lacks_cgroupv2(tmp_path) -> None:
    """nftables 1.0.6's JSON parser has no ``socket cgroupv2`` ("Invalid socket key value"):
    a plan with a cgroup classifier then uses the iptables backend (xt_cgroup) instead of
    failing at apply; other classifiers stay on nftables. Fake binaries, nothing is changed."""
    nft = tmp_path / "nft"
    nft.write_text("#!/bin/sh\nif grep -q cgroupv2; then echo 'Error: Invalid socket key value.' >&2; "
                   "exit 1; fi\nexit 1\n")
    nft.chmod(0o755)
    absent = tmp_path / "iptables"
    absent.write_text("#!/bin/sh\nexit 1\n")
    absent.chmod(0o755)
    tuner = DscpTuner(nft=str(nft), iptables=str(absent), ip6tables=str(absent))
    assert tuner.plan("t", {"dscp": 26, "cgroup": "training.slice"}, "r").key == "iptables:mangle WANPROBE"
    assert tuner.plan("t", {"dscp": 26, "uid": 1000}, "r").key == "nft:inet wanprobe"


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
import os, socket, sys
os.setuid(65534)  # nobody: a uid classifier names a job's user, never root (issue 37)
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
@pytest.mark.parametrize("classifier", [PORT_CLASSIFIER, json.dumps({"dscp": "AF41", "uid": 65534})],
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


@pytest.mark.netns
def test_verify_compares_values_not_comments(veth_pair, tmp_path: Path) -> None:
    """A rule edited behind wanprobe's back (same comment tag, another DSCP) fails verify, so
    rollback leaves it alone unless forced; the previous state saved as nft JSON comes back
    exactly on rollback."""
    a, b = veth_pair
    subprocess.run(["ip", "netns", "exec", a, "nft", "add table inet wanprobe"], check=True)
    subprocess.run(["ip", "netns", "exec", a, "nft",
                    "add chain inet wanprobe out { type filter hook output priority mangle; }"], check=True)
    subprocess.run(["ip", "netns", "exec", a, "nft", "add rule inet wanprobe out meta skuid 4242 "
                    "ip dscp set cs1"], check=True)
    plan = plan_and_apply(a, tmp_path, {})
    change = plan["changes"][0]
    assert json.loads(change["old"])[2]["rule"]["expr"][-1]["mangle"]["value"] == "cs1"
    assert received_tos(a, b, ecn=0) == 34 << 2
    probe = VERIFY % (change["new"], "")
    assert run_in(a, probe) == "True"
    # the same tag, AF42 instead of AF41: a comment count would still say "applied"
    listing = subprocess.run(["ip", "netns", "exec", a, "nft", "-a", "list", "table", "inet", "wanprobe"],
                             capture_output=True, text=True, check=True).stdout
    handle = [ln.split("# handle ")[1] for ln in listing.splitlines() if "dscp set af41" in ln][0]
    tag = listing.split('comment "')[1].split('"')[0]
    subprocess.run(["ip", "netns", "exec", a, "nft", "replace rule inet wanprobe out handle " + handle
                    + f' ip daddr {B_ADDR} udp dport {PORT}-{PORT + 10} ip dscp set af42 comment "{tag}"'],
                   check=True)
    assert run_in(a, probe) == "False"
    r = wanprobe(a, "tune", "rollback", "--state-dir", str(tmp_path / "st"))
    assert r.returncode != 0 and "changed by someone else" in r.stderr  # by value, not by tag
    r = wanprobe(a, "tune", "rollback", "--force", "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 0, r.stderr
    assert run_in(a, VERIFY % (change["old"], "")) == "True"
    out = subprocess.run(["ip", "netns", "exec", a, "nft", "list", "table", "inet", "wanprobe"],
                         capture_output=True, text=True).stdout
    assert "meta skuid 4242 ip dscp set cs1" in out and "af4" not in out


VERIFY = """
from tuners.dscp import DscpTuner, NFT_KEY
print(DscpTuner().verify(NFT_KEY, %r)%s)
"""


def run_in(ns: str, code: str) -> str:
    r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.netns
@pytest.mark.parametrize("bad,says", [
    ([{"dscp": 62, "daddr": ["0.0.0.0/0", "::/0"], "dport": "1-65535"}], "never mark everything"),
    ([{"dscp": 62, "daddr": [f"{B_ADDR}/32"]}], "DSCP 62 is not permitted"),
], ids=["everything", "dscp-62"])
def test_a_hand_edited_plan_past_the_policy_is_refused_at_apply(veth_pair, tmp_path: Path, bad,
                                                                says) -> None:
    """Issue 37: a plan edited to mark all egress with DSCP 62 was applied. ``tune apply``
    judges the plan file as it would a report: exit 2, one line, nothing marked."""
    a, b = veth_pair
    rep = {"schema_version": "1.0", "id": "d1", "host": {}, "peer": {"address": B_ADDR},
           "measurements": {}, "findings": [{"id": "dscp-bleached", "severity": "medium",
                                             "title": "unmarked", "knobs": [
               {"tuner": "dscp", "key": "training", "reason": "r", "value": PORT_CLASSIFIER}]}]}
    (tmp_path / "r.json").write_text(json.dumps(rep))
    r = wanprobe(a, "tune", "plan", "-r", str(tmp_path / "r.json"), "-o", str(tmp_path / "p.json"))
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "p.json").read_text())
    plan["changes"][0]["new"] = json.dumps(bad)
    (tmp_path / "p.json").write_text(json.dumps(plan))
    r = wanprobe(a, "tune", "apply", str(tmp_path / "p.json"), "--yes", "--state-dir",
                 str(tmp_path / "st"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == UsageError.exit_code and len(lines) == 1 and says in lines[0], r.stderr
    assert "wanprobe" not in subprocess.run(["ip", "netns", "exec", a, "nft", "list", "tables"],
                                            capture_output=True, text=True).stdout
    assert received_tos(a, b, ecn=0) == 0
