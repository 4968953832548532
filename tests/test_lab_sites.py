"""The multi-site lab (wanprobe/lab/sites.py, ``wanprobe lab sites``): profiles, topology files
and their one-line errors, the address plan and interface names (unit); then a real lab of 2
sites x 2 hosts at 100 Mbit/s, 35 ms: LAN and WAN RTTs, and two flows between the sites sharing
the one delay line (netns)."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import sys
import time
from statistics import median

import pytest
from clirun import invoke, one_line_error
from conftest import RATE_RERUNS, netns_unavailable_reason, new_lab_name, require, require_tool

from wanprobe.errors import UsageError
from wanprobe.lab import registry
from wanprobe.lab.settings import LinkSettings
from wanprobe.lab.sites import (
    SitesLab,
    SiteSpec,
    load_topology,
    parse_topology,
    sites_profile,
)

BENCH_BLOCK = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544
EXAMPLE = """
[sites.tpe]
hosts = 2
[sites.tyo]
hosts = 3
[[links]]
between = ["tpe", "tyo"]
rtt_ms = 35
loss = 0.001
rate = "200Mbit"
"""


def topology(tmp_path, text: str):
    path = tmp_path / "sites.toml"
    path.write_text(text)
    return load_topology(path)


def pairs_text(sites: list[str], rtt: float = 10) -> str:
    out = "".join(f"[sites.{s}]\n" for s in sites)
    for i, a in enumerate(sites):
        for b in sites[i + 1:]:
            out += f'[[links]]\nbetween = ["{a}", "{b}"]\nrtt_ms = {rtt}\n'
    return out


# -- profiles ----------------------------------------------------------------------------------
def test_profile_tpe_tyo():
    sites, links = sites_profile("tpe-tyo")
    assert [(s.name, s.hosts) for s in sites] == [("tpe", 2), ("tyo", 2)]
    assert list(links) == [("tpe", "tyo")]
    assert links[("tpe", "tyo")].rtt_ms == 35
    assert links[("tpe", "tyo")].rate_bps <= 200e6


def test_profile_tpe_tyo_usw():
    sites, links = sites_profile("tpe-tyo-usw", hosts=3)
    assert [(s.name, s.hosts) for s in sites] == [("tpe", 3), ("tyo", 3), ("usw", 3)]
    rtts = {pair: s.rtt_ms for pair, s in links.items()}
    assert rtts[("tpe", "tyo")] == 35 and rtts[("tpe", "usw")] == 130
    assert 90 <= rtts[("tyo", "usw")] <= 110
    assert all(s.rate_bps <= 200e6 for s in links.values())
    lab = SitesLab("t0", sites, links)
    assert lab.pairs() == [("tpe", "tyo"), ("tpe", "usw"), ("tyo", "usw")]


def test_unknown_profile_is_a_usage_error():
    with pytest.raises(UsageError, match="tpe-tyo-usw"):
        sites_profile("tpe-sin")


# -- topology files ----------------------------------------------------------------------------
def test_topology_example(tmp_path):
    sites, links = topology(tmp_path, EXAMPLE)
    assert [(s.name, s.hosts) for s in sites] == [("tpe", 2), ("tyo", 3)]
    s = links[("tpe", "tyo")]
    assert (s.rtt_ms, s.loss_ab, s.loss_ba, s.rate_bps) == (35, 0.001, 0.001, 200e6)
    lab = SitesLab("t0", sites, links)
    assert [h.name for h in lab.hosts] == ["tpe1", "tpe2", "tyo1", "tyo2", "tyo3"]
    assert lab.host("tyo3").site == "tyo"


def test_topology_per_direction_loss_and_reversed_pair(tmp_path):
    text = """
[sites.tpe]
[sites.tyo]
[[links]]
between = ["tyo", "tpe"]
profile = "taipei-tokyo"
loss_ab = "1%"
"""
    sites, links = topology(tmp_path, text)
    assert [s.hosts for s in sites] == [2, 2]  # the default
    s = links[("tpe", "tyo")]  # keyed in site order, directions turned with it
    assert (s.loss_ab, s.loss_ba, s.rtt_ms, s.rate_bps) == (0.0, 0.01, 35.0, 200e6)
    lab = SitesLab("t0", sites, links)
    assert lab.link("tyo", "tpe").loss_ab == 0.01 and lab.link("tpe", "tyo").loss_ab == 0.0


@pytest.mark.parametrize("text, words", [
    (pairs_text(["tpe", "tyo", "usw"]).rsplit("[[links]]", 1)[0], "no link between tyo and usw"),
    (EXAMPLE + "color = 1\n", "links[0]: color: unknown key"),
    ("[sites.tpe]\nhost = 2\n" + pairs_text(["tyo"]), "sites.tpe.host: unknown key"),
    (EXAMPLE.replace('"200Mbit"', '"fast"'), "links[0]: cannot parse rate 'fast'"),
    (EXAMPLE.replace('"200Mbit"', "200"), "links[0]: rate: must be a rate"),
    (EXAMPLE.replace("loss = 0.001", "loss = 2"), "links[0]: loss: ratio"),
    (EXAMPLE.replace("rtt_ms = 35", "rtt_ms = -3"), "rtt must be ≥ 0"),
    (EXAMPLE.replace("rtt_ms = 35", 'rtt_ms = "35ms"'), "rtt_ms: must be a number"),
    (EXAMPLE.replace("rtt_ms = 35", ""), "rtt_ms: is required"),
    (EXAMPLE.replace("hosts = 3", "hosts = 9"), "site tyo: hosts must be 1-8"),
    (EXAMPLE.replace("hosts = 3", "hosts = true"), "site tyo: hosts must be 1-8"),
    (EXAMPLE.replace("sites.tyo", "sites.Tokyo"), "bad site name 'Tokyo'"),
    (EXAMPLE.replace('"tyo"]', '"osa"]'), "unknown site 'osa'"),
    (EXAMPLE.replace('"tyo"]', '"tpe"]'), "joins two different sites"),
    (EXAMPLE + '[[links]]\nbetween = ["tyo", "tpe"]\nrtt_ms = 3\n', "a second link between tyo and tpe"),
    (EXAMPLE.replace('["tpe", "tyo"]', '"tpe"'), "between: must name two sites"),
    (EXAMPLE.replace("rtt_ms = 35", 'profile = "nope"'), "unknown lab profile 'nope'"),
    ("[[links]]\nbetween = [\"a\", \"b\"]\nrtt_ms = 1\n", "sites: give a [sites.NAME] table"),
    ("[sites.tpe]\n", "links: give one [[links]] table"),
    (pairs_text(["tpe"]) + "[[links]]\nbetween = [\"tpe\", \"tyo\"]\nrtt_ms = 1\n",
     "2-4 sites, got 1"),
    (pairs_text(["a", "b", "c", "d", "e"]), "2-4 sites, got 5"),
    ("x = [", "not valid TOML"),
])
def test_topology_errors_are_one_usage_error_line(tmp_path, text, words):
    with pytest.raises(UsageError) as err:
        topology(tmp_path, text)
    message = str(err.value)
    assert words in message and "\n" not in message
    assert message.startswith(f"topology file {tmp_path / 'sites.toml'}: ")
    assert err.value.exit_code == 2


def test_missing_or_unreadable_topology_file(tmp_path):
    for path in (tmp_path / "none.toml", tmp_path):
        with pytest.raises(UsageError, match="cannot read"):
            load_topology(path)
    with pytest.raises(UsageError, match="not valid TOML"):
        topology(tmp_path, "\ufffe\x00")


def test_parse_topology_takes_a_document():
    sites, links = parse_topology({"sites": {"a": {}, "b": {"hosts": 1}},
                                   "links": [{"between": ["a", "b"], "rtt_ms": 5}]})
    assert [s.hosts for s in sites] == [2, 1] and links[("a", "b")].rtt_ms == 5


@pytest.mark.parametrize("args, words", [
    (["--topology", "/nonexistent/sites.toml"], "cannot read"),
    (["--profile", "tpe-tyo", "--topology", "x.toml"], "not both"),
    (["--profile", "nope"], "unknown sites profile 'nope'"),
    (["--hosts-per-site", "9"], "hosts must be 1-8"),
    (["--rate", "fast"], "cannot parse rate"),
])
def test_cli_errors_are_one_line_exit_2(args, words):
    r = invoke("lab", "sites", "t0", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert words in one_line_error(r)


# -- names and addresses -----------------------------------------------------------------------
def biggest_lab() -> SitesLab:
    names = ["tokyoa", "osakab", "taipei", "uswest"]  # the longest site names allowed
    links = {(a, b): LinkSettings(rtt_ms=1) for i, a in enumerate(names) for b in names[i + 1:]}
    return SitesLab("a" * 40, [SiteSpec(n, 8) for n in names], links)


def test_address_plan_inside_198_18_0_0_15():
    from wanprobe.lab.sites import lan_prefix, pair_addrs, router_addr

    lab = biggest_lab()
    lans = [ipaddress.ip_network(lan_prefix(i)) for i in range(4)]
    p2p = [a for i in range(4) for k in range(i + 1, 4) for a in pair_addrs(i, k)]
    routers = [router_addr(i) for i in range(4)]
    addrs = [h.addr for h in lab.hosts] + routers + p2p
    assert len(set(addrs)) == len(addrs) == 32 + 4 + 12
    assert all(ipaddress.ip_address(a) in BENCH_BLOCK for a in addrs)
    assert all(n.subnet_of(BENCH_BLOCK) for n in lans)
    assert not any(a.overlaps(b) for i, a in enumerate(lans) for b in lans[i + 1:])
    assert not any(ipaddress.ip_address(a) in n for a in p2p for n in lans)
    for i, site in enumerate(lab.sites):  # each host inside its own site's LAN
        assert all(ipaddress.ip_address(h.addr) in lans[i] for h in lab.hosts if h.site == site.name)


def test_interface_and_namespace_names():
    lab = biggest_lab()
    names = [n for ifs in lab.interfaces().values() for n in ifs]
    assert max(len(n) for n in names) <= 15
    assert all(re.fullmatch(r"[a-z0-9-]+", n) for n in names)
    assert all(len(set(ifs)) == len(ifs) for ifs in lab.interfaces().values())
    assert len(set(lab.namespaces())) == len(lab.namespaces()) == 4 + 32
    assert lab.hosts[0].ns == "wp-" + "a" * 40 + "-tokyoa1"


@pytest.mark.parametrize("sites, links, words", [
    ([SiteSpec("a1", 1), SiteSpec("a", 1)], {("a1", "a"): LinkSettings()}, "bad site name 'a1'"),
    ([SiteSpec("tpe"), SiteSpec("tpe")], {("tpe", "tpe"): LinkSettings()}, "site names repeat"),
    ([SiteSpec("tpe", 0), SiteSpec("tyo")], {}, "hosts must be 1-8"),
    ([SiteSpec("toolong"), SiteSpec("tyo")], {}, "bad site name 'toolong'"),
    ([SiteSpec("tpe"), SiteSpec("tyo")], {("tpe", "tyo"): LinkSettings(rtt_ms=-1)}, "rtt"),
])
def test_lab_checks_its_arguments(sites, links, words):
    with pytest.raises(UsageError, match=re.escape(words)):
        SitesLab("t0", sites, links)


def test_hosts_get_an_allowed_congestion_control(tmp_path, monkeypatch):
    """A non-init namespace may only default to an allowed control: one that is not allowed
    is replaced in every host (never in the root namespace); an allowed one is kept."""
    from wanprobe.lab import sites

    allowed = tmp_path / "allowed"
    monkeypatch.setattr(sites, "CC_FILE", allowed)
    set_in: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(sites.netns, "sysctl", lambda ns, settings: set_in.append((ns, settings)))
    monkeypatch.setattr(sites.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(
        argv, 0, "bbr\n", ""))
    lab = SitesLab("t0", *sites_profile("tpe-tyo"))
    allowed.write_text("reno cubic\n")
    lab._host_congestion_control()
    assert set_in == [(h.ns, ["net.ipv4.tcp_congestion_control=cubic"]) for h in lab.hosts]
    set_in.clear()
    allowed.write_text("reno bbr\n")
    lab._host_congestion_control()
    assert set_in == []


def test_attach_needs_a_sites_lab():
    from wanprobe.errors import LabError

    with pytest.raises(LabError, match="no sites lab"):
        SitesLab.attach("t0-no-such-lab")


# -- a real lab ----------------------------------------------------------------------------------
RTT_MS = 35.0
RATE_BPS = 100e6


@pytest.fixture(scope="module")
def two_sites():
    require(netns_unavailable_reason())
    lab = SitesLab(new_lab_name(), [SiteSpec("tpe", 2), SiteSpec("tyo", 2)],
                   {("tpe", "tyo"): LinkSettings(rtt_ms=RTT_MS, rate_bps=RATE_BPS)})
    try:
        yield lab.up()
    finally:
        lab.down()


def ping_ms(lab: SitesLab, src: str, dst: str) -> list[float]:
    r = lab.host(src).run(["ping", "-c", "5", "-i", "0.2", "-W", "2", lab.host(dst).addr],
                          capture_output=True, text=True, timeout=20)
    rtts = [float(x) for x in re.findall(r"time=([\d.]+) ms", r.stdout)]
    assert len(rtts) == 5, r.stdout + r.stderr
    return rtts


@pytest.mark.netns
def test_lan_and_wan_rtts(two_sites):
    lab = two_sites
    lan = ping_ms(lab, "tpe1", "tpe2") + ping_ms(lab, "tyo2", "tyo1")
    wan = ping_ms(lab, "tpe1", "tyo1") + ping_ms(lab, "tyo2", "tpe2")
    print(f"same site RTTs {lan} ms; cross-site RTTs {wan} ms (set {RTT_MS} ms); "
          f"offsets {lab.offsets_ns} ns")
    assert max(lan) < 2.0
    assert abs(median(wan) - RTT_MS) <= 0.15 * RTT_MS
    assert all(abs(x - RTT_MS) <= 0.15 * RTT_MS for x in wan[1:5] + wan[6:])  # not the ARP ones
    stats = lab.stats("tyo", "tpe")
    assert stats["ab"]["packets"] >= 5 and stats["ba"]["packets"] >= 5


def iperf3_flows(lab: SitesLab, pairs: list[tuple[str, str]], seconds: int = 4) -> list[float]:
    """Received bit/s of simultaneous iperf3 flows src -> dst (omitting the first second)."""
    require_tool("iperf3")
    servers = [lab.host(dst).popen(["iperf3", "-s", "-1", "-B", lab.host(dst).addr],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _src, dst in pairs]
    clients = []
    try:
        for _src, dst in pairs:
            for _ in range(100):
                if lab.host(dst).run(["ss", "-ltnH", "sport = :5201"], capture_output=True,
                                     text=True).stdout.strip():
                    break
                time.sleep(0.05)
        clients = [lab.host(src).popen(["iperf3", "-c", lab.host(dst).addr, "-t", str(seconds),
                                        "-O", "1", "-w", "4M", "-J"],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for src, dst in pairs]
        out = []
        for c in clients:
            stdout, stderr = c.communicate(timeout=seconds + 30)
            assert c.returncode == 0, stdout[-500:] + stderr
            out.append(json.loads(stdout)["end"]["sum_received"]["bits_per_second"])
        return out
    finally:
        for p in clients + servers:
            if p.poll() is None:
                p.kill()
            p.wait()


@RATE_RERUNS
@pytest.mark.netns
def test_hosts_of_a_site_share_its_wan_link(two_sites):
    lab = two_sites
    [alone] = iperf3_flows(lab, [("tpe1", "tyo1")])
    both = iperf3_flows(lab, [("tpe1", "tyo1"), ("tpe2", "tyo2")])
    shares = [b / RATE_BPS for b in both]
    print(f"one flow {alone / 1e6:.1f} Mbit/s; two flows {both[0] / 1e6:.1f} + "
          f"{both[1] / 1e6:.1f} = {sum(both) / 1e6:.1f} Mbit/s of {RATE_BPS / 1e6:.0f}")
    assert alone >= 0.8 * RATE_BPS
    assert all(0.35 <= s <= 0.65 for s in shares), shares
    assert sum(shares) >= 0.8


@pytest.mark.netns
def test_cli_brings_up_lists_and_takes_down():
    name = new_lab_name()
    r = invoke("lab", "sites", name, "--profile", "tpe-tyo-usw", "--hosts-per-site", "1",
               "--rate", "50mbit", "--json")
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        state = json.loads(r.stdout)
        assert state["kind"] == "sites" and registry.read(name)["kind"] == "sites"
        assert [h["name"] for h in state["hosts"]] == ["tpe1", "tyo1", "usw1"]
        assert {x["settings"]["rate_bps"] for x in state["links"]} == {50e6}
        ls = json.loads(invoke("lab", "ls", "--json").stdout)
        assert [x["status"] for x in ls if x["name"] == name] == ["up"]
        clash = invoke("lab", "up", name)  # a two-namespace lab must not take the name over
        assert clash.returncode == 3 and "is a sites lab" in one_line_error(clash)
        assert registry.read(name)["kind"] == "sites"
        ex = subprocess.run([sys.executable, "-m", "wanprobe", "lab", "exec", name, "usw1", "--",
                             "ping", "-c", "1", "-W", "2", state["hosts"][0]["addr"]],
                            capture_output=True, text=True, timeout=30)
        assert ex.returncode == 0, ex.stdout + ex.stderr
        rtt = float(re.search(r"time=([\d.]+) ms", ex.stdout).group(1))
        assert 110 <= rtt <= 150  # tpe-usw, 130 ms
    finally:
        down = invoke("lab", "down", name)
    assert down.returncode == 0 and "removed" in down.stdout, down.stdout + down.stderr
    assert registry.read(name) is None
    assert not any(name in ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                       text=True).stdout.split())
