"""`wanprobe ring` in a two-site lab (issue 39): two hosts per site, one WAN link each way
(wanprobe/lab/sites.py). The naive order tpe1 → tyo1 → tpe2 → tyo2 crosses the WAN on every
edge, two edges per direction through one link: the ring gets about half of what each edge gets
alone, the shared bottlenecks are named, and the proposed order (each site's hosts adjacent)
measures at least 0.85 × the link. Bad input and an interrupted ring leave nothing sending."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import time

import pytest
from conftest import TEST_LAB_PREFIX, netns_unavailable_reason, require

from wanprobe.lab import netns
from wanprobe.lab.sites import SitesLab, sites_profile

pytestmark = pytest.mark.netns
RATE_BPS = 100e6
KEY = "ring-lab-shared-key-0123456789"
PORT = 862
NAIVE = ("tpe1", "tyo1", "tpe2", "tyo2")


def _reflector(host, key_file, allow="198.18.0.0/15", port=PORT):
    argv = [sys.executable, "-m", "wanprobe", "reflect", "--bind", host.addr, "--port", str(port),
            "--allow", allow, "--hmac-key-file", str(key_file)]
    proc = host.popen(argv, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stderr], [], [], 30)
    line = proc.stderr.readline() if ready else ""
    assert "STAMP on udp" in line, f"reflector on {host.name} did not start: {line!r}"
    return proc


@pytest.fixture(scope="module")
def ring_lab(tmp_path_factory):
    require(netns_unavailable_reason())
    key_file = tmp_path_factory.mktemp("ring") / "key"
    key_file.write_text(KEY)
    key_file.chmod(0o600)
    sites, links = sites_profile("tpe-tyo", hosts=2)
    links = {k: v.changed(rate_bps=RATE_BPS) for k, v in links.items()}
    lab = SitesLab(f"{TEST_LAB_PREFIX}rg", sites, links)
    procs = []
    try:
        lab.up()
        procs = [_reflector(h, key_file) for h in lab.hosts]
        yield lab, key_file
    finally:
        for p in procs:
            netns.stop(p, 10)
        lab.down()


def _ring(lab, key_file, *hosts, extra=(), timeout=120):
    addrs = [lab.host(h).addr if h in {x.name for x in lab.hosts} else h for h in hosts]
    argv = [sys.executable, "-m", "wanprobe", "ring", *addrs, "--hmac-key-file", str(key_file),
            "--duration", "3s", "--omit", "1s", "--streams", "4", "--json", *extra]
    return lab.host("tpe1").run(argv, capture_output=True, text=True, timeout=timeout)


def _names(lab) -> dict[str, str]:
    return {h.addr: h.name for h in lab.hosts}


def _sending(lab) -> int:
    """Established TCP connections to or from the reflectors' port, over every host."""
    total = 0
    for h in lab.hosts:
        out = h.run(["ss", "-Htn", "state", "established", f"( sport = :{PORT} or dport = :{PORT} )"],
                    capture_output=True, text=True).stdout
        total += len([ln for ln in out.splitlines() if ln.strip()])
    return total


def _quiet_within(lab, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _sending(lab) == 0:
            return True
        time.sleep(0.1)
    return _sending(lab) == 0


def test_the_naive_ring_gets_half_and_the_proposed_order_the_link(ring_lab):
    lab, key_file = ring_lab
    r = _ring(lab, key_file, *NAIVE)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    name = _names(lab)
    assert [name[h] for h in doc["order"]] == list(NAIVE)
    wan = [e for e in doc["edges"] if e["wan"]]
    assert len(wan) == 4  # every edge of the naive order crosses
    alone = [e["alone_bits_per_second"] for e in wan]
    together = [e["bits_per_second"] for e in wan]
    ring = doc["ring_bits_per_second"]
    # alone, each edge has the link; together two edges share each direction's link
    assert min(alone) >= 0.8 * RATE_BPS, alone
    assert 0.35 <= ring / (sum(alone) / len(alone)) <= 0.65, (ring, alone, together)
    groups = [sorted((name[g["from"]], name[g["to"]]) for g in grp)
              for grp in doc["shared_bottlenecks"]]
    assert sorted(groups) == [[("tpe1", "tyo1"), ("tpe2", "tyo2")],
                              [("tyo1", "tpe2"), ("tyo2", "tpe1")]], groups
    best = [name[h] for h in doc["best_order"]]
    sites = [h[:3] for h in best]
    assert sum(sites[i] != sites[(i + 1) % 4] for i in range(4)) == 2, best
    assert doc["best_ring_bits_per_second"] >= 0.85 * RATE_BPS, doc["best_ring_bits_per_second"]
    for e in doc["edges"]:  # NCCL's view never above the sum, per-stream figures present
        assert e["min_stream_bits_per_second"] * e["streams"] <= e["bits_per_second"] * 1.02
    assert _quiet_within(lab, 2.0)


@pytest.mark.parametrize("case", ["twice", "unreachable", "one host"])
def test_bad_hosts_are_one_line_and_nothing_sends(ring_lab, case):
    lab, key_file = ring_lab
    hosts = {"twice": ("tpe1", "tyo1", "tpe1"), "unreachable": ("tpe1", "198.18.41.77"),
             "one host": ("tpe1",)}[case]
    r = _ring(lab, key_file, *hosts, timeout=60)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert {"twice": "listed twice", "unreachable": "198.18.41.77",
            "one host": "at least two hosts"}[case] in lines[0], lines
    assert _quiet_within(lab, 1.0)


def test_a_far_end_without_the_key_or_outside_the_allow_list_refuses(ring_lab, tmp_path):
    lab, key_file = ring_lab
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-ring-key-0123456789")
    wrong.chmod(0o600)
    r = lab.host("tpe1").run([sys.executable, "-m", "wanprobe", "ring", lab.host("tpe1").addr,
                              lab.host("tyo1").addr, "--hmac-key-file", str(wrong), "--json"],
                             capture_output=True, text=True, timeout=60)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 7 and len(lines) == 1 and "authentication failed" in lines[0], r.stderr
    # reflectors on another port, tyo2's allowing its own site only (and the orchestrator,
    # tyo1): tpe1 is outside its list, so the edge tyo2 -> tpe1 is refused before any traffic
    extra = []
    try:
        for h in ("tyo1", "tpe1"):
            extra.append(_reflector(lab.host(h), key_file, port=PORT + 1))
        extra.append(_reflector(lab.host("tyo2"), key_file, allow="198.18.41.0/24",
                                port=PORT + 1))
        r = lab.host("tyo1").run(
            [sys.executable, "-m", "wanprobe", "ring", *[lab.host(h).addr for h in
                                                         ("tyo1", "tyo2", "tpe1")],
             "--hmac-key-file", str(key_file), "--port", str(PORT + 1), "--json"],
            capture_output=True, text=True, timeout=60)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 7 and len(lines) == 1, r.stderr
        assert lab.host("tpe1").addr in lines[0] and "outside this reflector's --allow" in lines[0]
        assert _quiet_within(lab, 1.0)
    finally:
        for p in extra:
            netns.stop(p, 10)


def test_ctrl_c_stops_every_edge_within_a_second(ring_lab):
    lab, key_file = ring_lab
    argv = [sys.executable, "-m", "wanprobe", "ring", *[lab.host(h).addr for h in NAIVE],
            "--hmac-key-file", str(key_file), "--duration", "20s", "--omit", "0s"]
    proc = lab.host("tpe1").popen(argv, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the edges run
            ready, _, _ = select.select([proc.stderr], [], [], 1.0)
            if ready and "at once" in proc.stderr.readline():
                break
        time.sleep(2.0)
        assert _sending(lab) >= 8  # 4 edges x (control + streams) at least
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        assert _quiet_within(lab, 1.0), f"still sending {time.monotonic() - t0:.1f} s later"
        proc.wait(10)
        assert proc.returncode == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
