"""`wanprobe preflight` without a lab (issue 24): host lists as Slurm and the launchers write
them, bad lists refused in one line (garbage, duplicates, 10,000 entries), every no-go reason
judged from measurements (MTU, buffers, congestion control, a reroute in the daemon's real
history), per-site NCCL settings, and the time bound held against a host that trickles bytes
and never answers a probe (loopback only)."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import replace

import pytest
from clirun import invoke, one_line_error
from conftest import FIXTURE_TREES

from collectors.host_facts import HostFacts
from wanprobe.history.store import ProbeRow, Store
from wanprobe.preflight.history import read_history
from wanprobe.preflight.hostlist import HostEntry, parse_host_list
from wanprobe.preflight.judge import Thresholds, verdicts
from wanprobe.preflight.measure import HostMeasure, ProbePlan, fit
from wanprobe.preflight.run import PreflightOptions, _nccl
from wanprobe.probe.result import DscpReport, LossStats, MtuResult, ProbeResult, RttStats
from wanprobe.probe.stats import wilson_interval

TH = Thresholds(loss_slo_ratio=0.01, rtt_slo_ms=None, rate_bps=10e9, floor_step_ratio=0.2,
                floor_step_min_ms=1.0)


def hosts(text: str) -> list[tuple[str, int]]:
    return [(e.host, e.port) for e in parse_host_list(text, max_hosts=1024)]


def test_slurm_torchrun_and_plain_host_lists():
    assert hosts("gpu[01-03,07]") == [("gpu01", 862), ("gpu02", 862), ("gpu03", 862),
                                      ("gpu07", 862)]
    assert hosts("r[1-2]-n[8-9]:9000,login1") == [("r1-n8", 9000), ("r1-n9", 9000),
                                                   ("r2-n8", 9000), ("r2-n9", 9000),
                                                   ("login1", 862)]
    # DeepSpeed/OpenMPI hostfile lines (torchrun jobs launched by DeepSpeed), comments, blanks
    text = "# hostfile\nworker-1 slots=8\n\nworker-2 slots=8 max_slots=8  # second\n"
    assert hosts(text) == [("worker-1", 862), ("worker-2", 862)]
    assert hosts("10.0.0.1\n[2001:db8::1]:863\n2001:db8::2\nnode-a.example.net.") == [
        ("10.0.0.1", 862), ("2001:db8::1", 863), ("2001:db8::2", 862), ("node-a.example.net.", 862)]


@pytest.mark.parametrize("text, words", [
    ("gpu01\ngpu 02\n", "line 2"), ("node[a-b]", "Slurm host range"), ("h:0", "host:port"),
    ("h:99999", "host:port"), ("n[4-1]", "line 1"), ("x" * 5000, "longer than"),
    ("gpu01\ngpu[00-02]\n", "listed twice (also line 1)"), ("GPU01\ngpu01", "listed twice"),
    ("n[1-99999999]", "more than 1,024 hosts"), ("\n# nothing\n", "no hosts"),
    ("\x00\x1b[31m", "is not a host")])
def test_bad_host_lists_are_one_line(tmp_path, text, words):
    f = tmp_path / "hosts"
    f.write_text(text)
    line = one_line_error(invoke("preflight", "--hosts", f, "--timeout", "2s"))
    assert words in line


def test_ten_thousand_entries_one_line_before_anything_is_sent(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("".join(f"198.18.{i // 250}.{i % 250 + 1}\n" for i in range(10_000)))
    r = invoke("preflight", "--hosts", f, "--json")
    assert r.returncode == 2 and r.stdout == ""
    assert "more than 1,024 hosts (at line 1025)" in one_line_error(r)
    f.write_bytes(b"\xff\xfe not text\n")
    assert "not UTF-8" in one_line_error(invoke("preflight", "--hosts", f))
    for args, words in [(("--timeout", "0s"), "--timeout"), (("--count", "0"), "--count"),
                        (("--max-hosts", "5000"), "--max-hosts"), (("--loss-slo", "x"), "--loss-slo"),
                        (("--rate", "fast"), "--rate"), (("--nccl-version", "two"), "NCCL version")]:
        assert words in one_line_error(invoke("preflight", "--hosts", f, *args))


def probe(sent: int, received: int, rtt_min: float = 10.0, p50: float = 10.5,
          p99: float = 12.0, method: str = "stamp") -> ProbeResult:
    rtt = RttStats(rtt_min, p50, p50, p99, p99, p50, 0.3) if received else None
    loss = LossStats(sent, received, wilson_interval(sent - received, sent))
    return ProbeResult(method, "x", 862, "2026-01-01T00:00:00Z", 2.0, 0.01, None, rtt, loss,
                       DscpReport(0))


def facts(mtu: int = 1500, rmem: int = 64 * 2**20, cc: str = "cubic") -> HostFacts:
    return HostFacts.from_json({"version": 1, "cc_current": cc, "cc_allowed": ["reno", "bbr"],
                                "tcp_rmem_bytes": [4096, 131072, rmem],
                                "tcp_wmem_bytes": [4096, 16384, 64 * 2**20],
                                "iface": "eth0", "iface_mtu_bytes": mtu})


def measure(host: str, p: ProbeResult | None, f: HostFacts | None = None, *,
            mtu: MtuResult | None = None, address: str | None = None) -> HostMeasure:
    return HostMeasure(HostEntry(host, 862, 1), address=address or host, stamp=p, facts=f,
                       mtu=mtu, finished=True)


def codes(results) -> dict[str, list[str]]:
    return {m.entry.host: [r.code for r in rs] for m, rs in results}


def test_every_reason_from_its_measurement():
    ms = [measure("ok1", probe(400, 400), facts()),
          measure("ok2", probe(400, 400, p50=80.0, p99=85.0), facts()),
          measure("jumbo", probe(400, 400), facts(mtu=9000)),
          measure("hole", probe(400, 400), facts(),
                  mtu=MtuResult("hole", 862, 1400, 1500, "stamp-df-probe", "search", 0.2)),
          measure("smallbuf", probe(400, 400), facts(rmem=1 * 2**20)),
          measure("lossycc", probe(1000, 996), facts(cc="reno")),
          measure("lossy", probe(400, 380), facts())]
    got = codes(verdicts(ms, TH, None, 30.0))
    assert got == {"ok1": [], "ok2": [], "jumbo": ["mtu_mismatch"], "hole": ["mtu_mismatch"],
                   "smallbuf": ["buffers_below_need"], "lossycc": ["cc_below_need"],
                   "lossy": ["loss_over_slo", "cc_below_need"]}
    res = {m.entry.host: rs for m, rs in verdicts(ms, TH, None, 30.0)}
    assert "MTU 9000, the job's hosts 1500" in res["jumbo"][0].text
    assert "path MTU 1400" in res["hole"][0].text
    # the longest measured path (80 ms, to ok2) sets what a buffer must carry
    assert "80 ms, to ok2" in res["smallbuf"][0].text
    assert "bbr is allowed here" in res["lossycc"][0].text
    # an RTT SLO is judged only when given
    slo = Thresholds(**{**TH.__dict__, "rtt_slo_ms": 50.0})
    assert codes(verdicts(ms[:2], slo, None, 30.0)) == {"ok1": [], "ok2": ["rtt_over_slo"]}


def test_unreachable_and_timed_out():
    silent = HostMeasure(HostEntry("silent", 862, 1), address="198.18.0.9",
                         stamp=probe(200, 0), icmp=probe(200, 0, method="icmp"), finished=True)
    noicmp = HostMeasure(HostEntry("noicmp", 862, 2), address="198.18.0.8", stamp=probe(200, 0),
                         icmp_error="Operation not permitted (ICMP needs root or CAP_NET_RAW)",
                         finished=True)
    late = HostMeasure(HostEntry("late", 862, 3), address="198.18.0.7")
    dns = HostMeasure(HostEntry("nx", 862, 4), error="nx does not resolve", finished=True)
    res = {m.entry.host: rs for m, rs in verdicts([silent, noicmp, late, dns], TH, None, 30.0)}
    assert [r.code for r in res["silent"]] == ["unreachable"]
    assert "200 ICMP echoes unanswered" in res["silent"][0].text
    assert "CAP_NET_RAW" in res["noicmp"][0].text
    assert [r.code for r in res["late"]] == ["timed_out"] and "30 s" in res["late"][0].text
    assert res["nx"][0].text == "nx does not resolve"


def test_reroute_from_the_daemons_history(tmp_path):
    db = tmp_path / "history.sqlite3"
    store = Store(db)
    now = time.time()
    store.add_finding(now - 600, {"id": "path.rerouted", "severity": "warning",
                                  "title": "Path to tpe-2 rerouted: RTT floor 10.00 → 31.00 ms",
                                  "evidence": {"address": "10.0.0.2"}}, peer="tpe-2")
    store.add_finding(now - 7200, {"id": "path.rerouted", "severity": "warning",
                                   "title": "old", "evidence": {"address": "10.0.0.3"}},
                      peer="tpe-3")
    for peer, floor in (("tpe-3", 10.0), ("tpe-4", 10.0)):
        store.add_probe(ProbeRow(ts=now - 300, peer=peer, method="stamp", rtt_min_ms=floor))
    store.close()
    history = read_history(db, now - 3600)
    ms = [measure("tpe-2", probe(400, 400), address="10.0.0.2"),
          measure("tpe-3", probe(400, 400, rtt_min=10.4), address="10.0.0.3"),
          measure("tpe-4", probe(400, 400, rtt_min=14.0, p50=14.2), address="10.0.0.4")]
    res = {m.entry.host: rs for m, rs in verdicts(ms, TH, history, 30.0)}
    assert [r.code for r in res["tpe-2"]] == ["rerouted"] and "31.00 ms" in res["tpe-2"][0].text
    assert res["tpe-3"] == []        # its reroute is older than the hour, its floor unchanged
    assert [r.code for r in res["tpe-4"]] == ["rerouted"] and "WanprobeRttFloorStep" in \
        res["tpe-4"][0].text
    assert db.stat().st_size > 0 and not (tmp_path / "history.sqlite3-journal").exists()


def test_nccl_settings_per_site_when_the_job_spans_two(tmp_path):
    mesh = tmp_path / "mesh.toml"
    mesh.write_text('[sites.tpe]\nhosts = [{ name = "tpe-1", address = "10.0.0.1" }]\n'
                    '[sites.tyo]\nhosts = [{ name = "tyo-1", address = "10.1.0.1" }]\n')
    from wanprobe.mesh.topology import load_mesh

    ms = [measure("tpe-1", probe(400, 400), facts(), address="10.0.0.1"),
          measure("tyo-1", probe(400, 400, rtt_min=30.0, p50=30.5, p99=32.0), facts(),
                  address="10.1.0.1")]
    opts = PreflightOptions(plan=None, thresholds=TH, nccl_version=(2, 27),
                            sys_root=FIXTURE_TREES / "synthetic" / "sys")
    env = _nccl(ms, opts, load_mesh(mesh), 10e9, "ens1f0np0")
    common = {v["name"]: v["value"] for v in env["variables"]}
    assert common["NCCL_ALLNET_ENABLE"] == "1" and common["NCCL_IB_TIMEOUT"] == "20"
    assert {s: {v["name"]: v["value"] for v in vs} for s, vs in env["by_site"].items()} == {
        "tpe": {"NCCL_IB_HCA": "=mlx5_0:1:0"}, "tyo": {"NCCL_IB_HCA": "=mlx5_0:1:1"}}
    assert "NCCL_IB_HCA" not in common


class Trickler:
    """A TCP listener on loopback that accepts and sends one byte every 0.2 s, never a full
    line: a host-facts request to it would never finish on its own."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.2", 0))
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        conns = []
        while not self.stop.is_set():
            try:
                conns.append(self.sock.accept()[0])
            except OSError:
                pass
            for c in conns:
                try:
                    c.send(b"x")
                except OSError:
                    pass
        for c in conns:
            c.close()
        self.sock.close()


@pytest.mark.slow
def test_time_bound_holds_whatever_the_host_does(tmp_path):
    """A host whose control channel trickles a byte every 0.2 s (the facts request would never
    end) and whose STAMP port is closed, with a 3 s bound and 5,000 probes asked for."""
    t = Trickler()
    try:
        f = tmp_path / "hosts"
        f.write_text(f"127.0.0.2:{t.port}\n")
        r = invoke("preflight", "--hosts", f, "--timeout", "3s", "--count", "5000",
                   "--interval", "10ms", "--json", "--history", tmp_path / "none")
    finally:
        t.stop.set()
    doc = json.loads(r.stdout)
    (host,) = doc["hosts"]
    assert doc["elapsed_s"] <= 3.0 and r.returncode == (0 if doc["go"] else 1)
    assert host["errors"]["facts"] == "no answer before the deadline"
    # as root the kernel answers ICMP on loopback (go, without facts); otherwise nothing does
    assert {x["code"] for x in host["reasons"]} <= {"timed_out", "unreachable"}
    assert not (tmp_path / "none").exists()  # a missing history is not created


def test_probe_plan_fits_rate_and_bound():
    plan = ProbePlan(count=200, interval_s=0.01)
    assert fit(plan, 64, 28.5) == (plan, 0.032)             # 64 × 31 probes/s ≤ 2,000/s
    small, interval = fit(plan, 1024, 28.5)                 # 0.512 s apart: 18 fit a third
    assert interval == 0.512 and small.count == 20          # ... but never below 20
    assert fit(plan, 3, 2.7)[0].count == 90


def test_buffers_are_judged_against_what_the_path_carries_never_the_nic(tmp_path):
    """tpe-2's path carried 940 Mbit/s in the local daemon's network-limited test (a faster
    test its window held back and one older than the week say nothing); its buffers carry that
    over the job's 130 ms, not 10 Gbit/s: go. tpe-3 has no such test: not judged without
    --link-rate, no-go with --link-rate 10gbit; a job needing less than the path is judged at
    its own --rate. The launching host is judged at the job's fastest path."""
    from wanprobe.models.bdp import window_from_buffer_bytes, window_limited_rate_bps
    from wanprobe.preflight.judge import host_rates

    buf, rtt_ms, path_bps, nic_bps = 4 * 2**20, 130.0, 940e6, 10e9
    sockets = 64 * window_limited_rate_bps(window_from_buffer_bytes(buf), rtt_ms / 1e3)
    assert path_bps < sockets < nic_bps  # the figures straddle what 64 sockets carry
    db = tmp_path / "history.sqlite3"
    store, now = Store(db), time.time()
    for ts, bps, verdict in ((now - 86400, path_bps, "network"),
                             (now - 3600, 2 * path_bps, "receive_window"),
                             (now - 8 * 86400, nic_bps, "network")):
        store.add_throughput(ts, "tpe-2", {"bits_per_second": bps, "duration_s": 5.0,
                                           "limited_by": {"verdict": verdict}})
    store.close()
    history = read_history(db, now - 3600, now - 7 * 86400)
    p130 = probe(400, 400, rtt_min=129.0, p50=rtt_ms, p99=rtt_ms + 2)
    ms = [measure("tpe-2", p130, facts(rmem=buf)), measure("tpe-3", p130, facts(rmem=buf)),
          HostMeasure(HostEntry("tpe-1", 862, 3), address="10.0.0.1", local=True,
                      facts=facts(rmem=buf), finished=True)]
    th = Thresholds(loss_slo_ratio=0.01, rtt_slo_ms=None, rate_bps=None, floor_step_ratio=0.2,
                    floor_step_min_ms=1.0)
    rates = host_rates(ms, th, history)
    assert [(r.source, r.bits_per_second) if r else None for r in rates] == [
        ("measured", path_bps), None, ("measured", path_bps)]
    assert "the local daemon's throughput test at" in rates[0].text
    assert codes(verdicts(ms, th, history, 30.0)) == {"tpe-2": [], "tpe-3": [], "tpe-1": []}

    linked = replace(th, link_rate_bps=nic_bps)
    res = {m.entry.host: rs for m, rs in verdicts(ms, linked, history, 30.0)}
    assert res["tpe-2"] == []  # measured wins over the operator's figure
    assert [r.code for r in res["tpe-3"]] == ["buffers_below_need"]
    assert "of the 10.0 Gbit/s the paths carry (--link-rate)" in res["tpe-3"][0].text
    assert [r.code for r in res["tpe-1"]] == ["buffers_below_need"]  # the fastest: 10 Gbit/s

    needs = replace(linked, rate_bps=path_bps / 2)
    assert [(r.source, r.bits_per_second) for r in host_rates(ms, needs, history)] == [
        ("job_rate", path_bps / 2)] * 3
    assert codes(verdicts(ms, needs, history, 30.0)) == {"tpe-2": [], "tpe-3": [], "tpe-1": []}


def test_names_resolve_through_the_mesh_before_dns(tmp_path):
    """Job hosts named in the mesh take its address, name and site without DNS (names no DNS
    here knows: the old code said "does not resolve"), an FQDN by its first label, an address
    by the mesh's entry for it. The first is this host (read, not probed); the other two are
    loopback addresses nothing answers on, probed briefly."""
    mesh = tmp_path / "mesh.toml"
    mesh.write_text('[sites.tpe]\nhosts = [{ name = "wp-test-gpu-01", address = "127.0.0.1" },\n'
                    '           { name = "wp-test-gpu-02", address = "127.0.0.3" }]\n'
                    '[sites.tyo]\nhosts = [{ name = "wp-test-gpu-03", address = "127.0.0.4" }]\n')
    hosts = tmp_path / "hosts"
    hosts.write_text("WP-TEST-GPU-01\nwp-test-gpu-02.example.invalid:9\n127.0.0.4:9\n")
    r = invoke("preflight", "--hosts", hosts, "--mesh", mesh, "--json", "--count", "3",
               "--interval", "1ms", "--reply-timeout", "100ms", "--timeout", "10s",
               "--history", tmp_path / "none")
    doc = json.loads(r.stdout)
    got = {h["host"]: (h["address"], h["resolved"], h["mesh_name"], h["site"])
           for h in doc["hosts"]}
    assert got == {"WP-TEST-GPU-01": ("127.0.0.1", "mesh", "wp-test-gpu-01", "tpe"),
                   "wp-test-gpu-02.example.invalid": ("127.0.0.3", "mesh", "wp-test-gpu-02", "tpe"),
                   "127.0.0.4": ("127.0.0.4", "address", "wp-test-gpu-03", "tyo")}, r.stderr
    assert doc["hosts"][0]["local"] is True
    assert not any("does not resolve" in x["text"] for h in doc["hosts"] for x in h["reasons"])


def test_text_to_a_file_is_never_wrapped(tmp_path, monkeypatch):
    """Written to a file (not a terminal), with COLUMNS=80: every NCCL line as computed and each
    reason on one line. rich folded them at 80 columns, and a folded `# reason` line in a file
    a shell sources runs its second half as a command."""
    from wanprobe.commands.preflight import _print

    reason = ("tcp_rmem/tcp_wmem max 4,194,304 B allow ~129 Mbit/s per socket at the job's "
              "longest RTT (130 ms, to gpu-07.example.net); NCCL's 64 sockets reach 8.3 Gbit/s "
              "of the 10.0 Gbit/s the paths carry (--link-rate)")
    nccl = ("# generated by wanprobe preflight\n# note: " + "x" * 150 + "\n"
            "# one socket tops out at ~129 Mbit/s (window/RTT) at 130 ms; 16×4=64 sockets "
            "(NCCL's cap of 64) reach ~8.3 of 10 Gbit/s; 78 would be needed: raise tcp_rmem/"
            "tcp_wmem max, or mend the slow path\nNCCL_SOCKET_NTHREADS=16\n")
    doc = {"go": False, "elapsed_s": 6.4, "bound_s": 30.0, "notes": ["n" * 120],
           "hosts": [{"host": "gpu-07.example.net", "go": False, "rtt_ms": {"p50": 130.0},
                      "loss_ratio": 0.0, "reasons": [{"code": "buffers_below_need",
                                                      "text": reason + " [sic]"}]}],
           "nccl_env": {"notes": [], "text": nccl}}
    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "preflight.txt"
    with out.open("w") as f:
        monkeypatch.setattr("sys.stdout", f)
        _print(doc)
    text = out.read_text()
    assert text.endswith(nccl), text
    assert f"buffers_below_need: {reason} [sic]" in text  # one line, markup-like text kept
    assert "note: " + "n" * 120 + "\n" in text
