"""Issue 19, break 2: planted journals were obeyed as root.

A journal's sysctl key ``net.ipv4./tmp/x`` became the path ``/tmp/x``, its saved nft objects
and persist path were restored unchecked, and ``tune status`` recovers "applying" journals, so an
admin's status check wrote the file. Now every journal field passes the plan's allow-lists
first (a journal that fails is one line and left alone), the tuner's state dir must be root's
own, and it is not the daemon's."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from clirun import invoke, one_line_error
from tuner_cases import make_proc

from tuners import journal_check
from tuners.journal import DEFAULT_STATE_DIR, JournalStore
from wanprobe.errors import ConfigError
from wanprobe.probe.access import DscpPolicy

REPO = Path(__file__).resolve().parent.parent
JID = "20250101T000000.000000000-abcd"
RMEM = "net.ipv4.tcp_rmem"


def journal(entries: list[dict], *, state: str = "applying", persist: dict | None = None) -> dict:
    return {"journal_version": 1, "id": JID, "state": state,
            "netns_inode": os.stat("/proc/thread-self/ns/net").st_ino, "netns_cookie": None,
            "host_id": "h", "plan_id": "p", "created_at": "x", "updated_at": "x", "pid": 1,
            "persist": persist or {}, "message": "", "entries": entries}


def entry(tuner: str, key: str, old: str | None, new: str, status: str = "writing") -> dict:
    return {"tuner": tuner, "key": key, "old": old, "new": new, "reason": "", "netns_inode": 0,
            "status": status, "note": ""}


def plant(state_dir: Path, doc: dict) -> Path:
    (state_dir / "journal").mkdir(parents=True, exist_ok=True, mode=0o700)
    state_dir.chmod(0o700)
    path = state_dir / "journal" / f"{doc['id']}.json"
    path.write_text(json.dumps(doc))
    path.chmod(0o600)
    return path


def tune(tmp_path: Path, *args: str):
    proc = tmp_path / "proc"
    if not proc.exists():
        make_proc(proc)
    return invoke("tune", *args, "--proc-root", str(proc), "--state-dir", str(tmp_path / "st"))


def test_status_does_not_obey_a_sysctl_key_that_is_a_path(tmp_path):
    target = tmp_path / "written-by-root"
    plant(tmp_path / "st", journal([entry("sysctl", f"net.ipv4.{target}", "pwned", "x")]))
    r = tune(tmp_path, "status")
    assert not target.exists(), "a journal key wrote outside /proc/sys"
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "refused, left alone" in lines[0] and "sysctl key" in lines[0]
    assert json.loads((tmp_path / "st/journal" / f"{JID}.json").read_text())["state"] == "applying"


def test_rollback_does_not_restore_a_persist_file_outside_sysctl_d(tmp_path):
    cron = tmp_path / "cron.d" / "x"
    cron.parent.mkdir()
    doc = journal([entry("sysctl", RMEM, "4096 131072 6291456", "4096 131072 6291456", "written")],
                  state="applied", persist={"path": str(cron), "previous": "* * * * * root sh\n"})
    plant(tmp_path / "st", doc)
    r = tune(tmp_path, "rollback", JID)
    assert "refused, left alone" in one_line_error(r) and "persist path" in r.stderr
    assert not cron.exists()


@pytest.mark.parametrize("old,why", [
    # another table: restoring it would add a firewall rule of the attacker's choosing
    ([{"table": {"family": "inet", "name": "filter"}},
      {"chain": {"family": "inet", "table": "filter", "name": "input", "type": "filter",
                 "hook": "input", "prio": 0, "policy": "drop"}}], "not inet wanprobe"),
    # the tuner's table, but marking all IPv4 egress CS7
    ([{"table": {"family": "inet", "name": "wanprobe"}},
      {"chain": {"family": "inet", "table": "wanprobe", "name": "out", "type": "filter",
                 "hook": "output", "prio": -150, "policy": "accept"}},
      {"rule": {"family": "inet", "table": "wanprobe", "chain": "out", "expr": [
          {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}},
                     "right": {"prefix": {"addr": "0.0.0.0", "len": 0}}}},
          {"mangle": {"key": {"payload": {"protocol": "ip", "field": "dscp"}}, "value": "cs7"}}]}}],
     "never mark everything"),
    # issue 37: two halves of IPv4, each harmless alone, judged together as a plan is
    ([{"table": {"family": "inet", "name": "wanprobe"}},
      {"chain": {"family": "inet", "table": "wanprobe", "name": "out", "type": "filter",
                 "hook": "output", "prio": -150, "policy": "accept"}}]
     + [{"rule": {"family": "inet", "table": "wanprobe", "chain": "out", "expr": [
         {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}},
                    "right": {"prefix": {"addr": half, "len": 1}}}},
         {"mangle": {"key": {"payload": {"protocol": "ip", "field": "dscp"}}, "value": "af41"}}]}}
        for half in ("0.0.0.0", "128.0.0.0")], "together mark"),
    # a statement the tuner never writes
    ([{"rule": {"family": "inet", "table": "wanprobe", "chain": "out",
                "expr": [{"accept": None}]}}], "not one the tuner writes"),
])
def test_dscp_saved_state_is_held_to_the_tuners_schema(old, why):
    new = json.dumps([{"dscp": 34, "daddr": ["198.18.0.2/32"]}])
    doc = journal([entry("dscp", "nft:inet wanprobe", json.dumps(old), new)])
    with pytest.raises(ConfigError, match=why):
        journal_check.check(doc, jid=JID, sysctl_dirs=(Path("/etc/sysctl.d"),),
                            permitted=DscpPolicy())


def test_a_journal_the_tuner_wrote_passes():
    listed = [{"table": {"family": "inet", "name": "wanprobe"}},
              {"chain": {"family": "inet", "table": "wanprobe", "name": "out", "type": "filter",
                         "hook": "output", "prio": -150, "policy": "accept"}},
              {"rule": {"family": "inet", "table": "wanprobe", "chain": "out", "comment": "wanprobe:0a",
                        "expr": [{"match": {"op": "==", "left": {"meta": {"key": "skuid"}}, "right": 4242}},
                                 {"mangle": {"key": {"payload": {"protocol": "ip", "field": "dscp"}},
                                             "value": "cs1"}}]}}]
    ipt = {"ip": ["-N WANPROBE", "-A WANPROBE -d 198.18.0.2/32 -p udp -m udp --dport 5000:5010 "
                  "-m comment --comment wanprobe:0a1b -j DSCP --set-dscp 0x22"]}
    new = json.dumps([{"dscp": 34, "daddr": ["198.18.0.2/32"]}])
    doc = journal([entry("dscp", "nft:inet wanprobe", json.dumps(listed), new),
                   entry("dscp", "iptables:mangle WANPROBE", json.dumps(ipt), new),
                   entry("sysctl", RMEM, "4096\t131072\t6291456", "4096 131072 67108864"),
                   entry("link", "eth0/mtu", "1500", "9000"), entry("roce", "mlx5_0/pfc", None,
                                                                   "0,0,0,1,0,0,0,0")],
                  persist={"path": "/etc/sysctl.d/90-wanprobe.conf",
                           "previous": f"# wanprobe\n{RMEM} = 4096 131072 6291456\n"})
    journal_check.check(doc, jid=JID, sysctl_dirs=(Path("/etc/sysctl.d"),),
                        permitted=DscpPolicy())


@pytest.mark.parametrize("key", ["../../etc/x/mtu", "../mtu", "a b/mtu"])
def test_link_and_roce_keys_cannot_walk_out_of_their_tree(key):
    for tuner, tail in (("link", ""), ("roce", "")):
        doc = journal([entry(tuner, key.replace("mtu", "trust") if tuner == "roce" else key + tail,
                             "1", "2")])
        with pytest.raises(ConfigError):
            journal_check.check(doc, jid=JID, sysctl_dirs=(), permitted=DscpPolicy())


def test_state_dir_not_owned_by_us_or_writable_by_others_is_refused(tmp_path):
    st = tmp_path / "st"
    plant(st, journal([entry("sysctl", RMEM, "4096 131072 6291456", "4096 131072 67108864")],
                      state="applied"))
    st.chmod(0o777)
    line = one_line_error(tune(tmp_path, "status"))
    assert "writable by group or others" in line
    st.chmod(0o700)
    if os.geteuid() == 0:
        os.chown(st, 65534, 65534)  # a DynamicUser's directory, as the daemon's is
        line = one_line_error(tune(tmp_path, "status"))
        assert "owned by uid 65534" in line
        os.chown(st, 0, 0)
    r = tune(tmp_path, "status")  # accepted: read, and the planted values are not live (drift)
    assert r.returncode == 9 and "net.ipv4.tcp_rmem live" in one_line_error(r)


def test_tuner_state_is_not_the_daemons():
    """The tuner's default state dir is wanprobe-tune.service's StateDirectory, root's; the
    daemon (a DynamicUser) has its own, and `daemon --check-plan` (root's ExecCondition) does
    not write into the daemon's."""
    units = REPO / "systemd"
    daemon = (units / "wanprobe.service").read_text()
    tuner = (units / "wanprobe-tune.service").read_text()
    assert re.search(r"^StateDirectory=wanprobe$", daemon, re.M)
    assert re.search(r"^StateDirectory=wanprobe-tune$", tuner, re.M)
    assert re.search(r"^StateDirectoryMode=0755$", tuner, re.M)   # readable, never writable
    assert DEFAULT_STATE_DIR == Path("/var/lib/wanprobe-tune")
    assert f"--state-dir {DEFAULT_STATE_DIR}" in tuner
    assert DEFAULT_STATE_DIR != Path("/var/lib/wanprobe")


def test_check_plan_does_not_write_the_daemons_state_dir(tmp_path):
    state = tmp_path / "daemon-state"
    cfg = tmp_path / "wanprobe.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{state}"\nreflector = false\n'
                   '[[peers]]\nname = "p"\naddress = "127.0.0.1"\n')
    r = invoke("daemon", "--config", str(cfg), "--check-plan")
    assert r.returncode != 0 and "auto_apply is off" in r.stderr
    assert not state.exists()


def test_store_loads_only_checked_journals(tmp_path):
    st = tmp_path / "st"
    good = journal([entry("sysctl", RMEM, "4096 131072 6291456", "4096 131072 67108864")],
                   state="applied")
    plant(st, good)
    bad = {**good, "id": "20250101T000000.000000001-beef",
           "entries": [entry("sysctl", "kernel.core_pattern", "x", "|/tmp/evil")]}
    plant(st, bad)
    store = JournalStore(st)
    assert [j.id for j in store.all()] == [JID]
    assert "kernel.core_pattern" in store.refused[bad["id"]]
