"""``wanprobe counters`` end to end: golden JSON on the synthetic RoCE tree, live --interval,
human view, one-line usage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import invoke
from conftest import FIXTURE_TREES

HERE = Path(__file__).parent / "fixtures" / "collectors"
GOLDEN = HERE / "golden_counters_synthetic.json"
SYS = FIXTURE_TREES / "synthetic" / "sys"
PROC = FIXTURE_TREES / "procfs" / "proc"
ETHTOOL = HERE / "ethtool"


def run(*args):
    """`wanprobe counters ARGS` in process (CliRunner)."""
    return invoke("counters", *args)


def normalise(text: str) -> dict:
    for root, mark in ((SYS, "$SYS"), (PROC, "$PROC"), (ETHTOOL.resolve(), "$ETHTOOL")):
        text = text.replace(str(root), mark)
    doc = json.loads(text)
    doc.pop("taken_at_s")
    return doc


def test_golden_json_on_synthetic_roce_tree():
    r = run("--sys-root", str(SYS), "--proc-root", str(PROC), "--ethtool-root", str(ETHTOOL.resolve()),
            "--json")
    assert r.returncode == 0, r.stderr
    got = normalise(r.stdout)
    if os.environ.get("WANPROBE_REGEN_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    expected = json.loads(GOLDEN.read_text())
    assert got == expected
    # independent spot checks against the fixture files themselves
    port = got["rdma"]["mlx5_0"]["ports"]["1"]
    words = int((SYS / "devices/pci0000:00/0000:00:02.0/0000:17:00.0/infiniband/mlx5_0/ports/1/"
                        "counters/port_xmit_data").read_text())
    assert port["counters"]["port_xmit_data"] == words and port["data_bytes"]["xmit"] == 4 * words
    assert port["roce_v2_gid_index"] == 3 and port["link_layer"] == "Ethernet"
    assert port["active_mtu"] == 4096
    nd = got["netdevs"]["ens1f0np0"]
    assert nd["mtu"] == 4200 and nd["ethtool"]["rx_prio3_pause_duration"] == 815745
    assert nd["units"]["rx_prio3_pause_duration"] == "us" and nd["ethtool_source"] == "text"
    assert got["tcp"]["RetransSegs"] == 348 and got["rates"] is None
    assert got["errors"] == [] and got["findings"] == []


@pytest.mark.netns
def test_live_interval_json_has_rates_and_findings():
    r = run("--interval", "300ms", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert 0.25 < doc["rates"]["interval_s"] < 5
    assert isinstance(doc["findings"], list) and doc["tcp"]["OutSegs"] >= 0
    some = next(iter(doc["rates"]["netdevs"].values()))["stats"]
    assert all(v == "reset" or v >= 0 for v in some.values())


def test_human_view_groups_by_device():
    r = run("--sys-root", str(SYS), "--proc-root", str(PROC), "--ethtool-root", str(ETHTOOL))
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "RDMA mlx5_0 port 1" in out and "roce_v2_gid_index=3" in out
    assert "netdev ens1f0np0" in out and "rx_prio3_pause_duration" in out and "RetransSegs" in out


@pytest.mark.parametrize("args,needle", [
    (("--sys-root", "/nonexistent/wanprobe"), "--sys-root"),
    (("--interval", "fast"), "duration"),
    (("--interval", "0"), "> 0"),
    (("--watch", "--json"), "--watch"),
])
def test_bad_options_are_one_line_errors(args, needle):
    r = run(*args)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


def test_watch_refreshes_in_place_until_ctrl_c():
    """On a terminal (a pty here) --watch redraws with rates; Ctrl-C ends it cleanly."""
    import os
    import pty
    import select
    import signal
    import time

    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "LINES": "60", "TERM": "xterm"}
    p = subprocess.Popen([sys.executable, "-m", "wanprobe", "counters", "--watch", "--interval",
                          "200ms"], stdin=slave, stdout=slave, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while seen.count(b"window") < 2 and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(master, 65536)
                except OSError:
                    break
        assert seen.count(b"window") >= 2, "no refresh with rates seen"
        p.send_signal(signal.SIGINT)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    err = p.stderr.read().decode()
    assert p.returncode == 0, err
    assert b"netdev" in seen and b"\x1b[" in seen          # cursor movement: redrawn in place
    assert "Traceback" not in err
