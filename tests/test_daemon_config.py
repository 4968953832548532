"""Daemon config and mesh file: the minimal config works, every bad key is one line naming it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from wanprobe.daemon.config import load_config, parse_config
from wanprobe.daemon.runtime import resolve_peers
from wanprobe.errors import ConfigInvalid
from wanprobe.mesh import topology

REPO = Path(__file__).resolve().parent.parent

MINIMAL = """\
[daemon]
state_dir = "/var/lib/wanprobe"
metrics_listen = "127.0.0.1:9862"
[[peers]]
name = "tokyo-1"
address = "198.18.0.2"
"""


def test_minimal_config_from_the_issue_works_as_is(tmp_path):
    path = tmp_path / "wanprobe.toml"
    path.write_text(MINIMAL)
    cfg = load_config(path)
    assert cfg.state_dir == Path("/var/lib/wanprobe")
    assert cfg.metrics_listen == ("127.0.0.1", 9862)
    assert [(p.name, p.address, p.methods, p.port) for p in cfg.peers] == [
        ("tokyo-1", "198.18.0.2", ("stamp",), 862)]
    assert cfg.probe.interval_s == 10.0 and cfg.throughput.enabled is False
    assert cfg.auto_apply.enabled is False, "auto-apply must be off by default"
    assert cfg.reflector_listen == (("0.0.0.0", 862),)
    assert cfg.db_path == Path("/var/lib/wanprobe/history.sqlite3")


def test_shipped_example_config_is_valid(tmp_path):
    text = (REPO / "systemd" / "wanprobe.toml.example").read_text()
    # the example points at the shipped mesh example; resolve it from the repo
    text = text.replace('"/etc/wanprobe/mesh.toml"', json.dumps(str(REPO / "systemd" / "mesh.toml.example")))
    path = tmp_path / "wanprobe.toml"
    path.write_text(text)
    cfg = load_config(path)
    assert cfg.throughput.windows and cfg.throughput.budget_bytes_per_day > 0
    m = topology.load_mesh(REPO / "systemd" / "mesh.toml.example")
    assert len(m.hosts) >= 4


def test_full_config_parses_units(tmp_path):
    cfg = parse_config({
        "daemon": {"state_dir": str(tmp_path), "reflector_listen": ["198.18.0.1:862", "[::]:862"],
                   "hmac_key": "0123456789abcdef0123", "log_format": "logfmt"},
        "probe": {"interval": "2s", "jitter": "250ms", "count": 20, "packet_interval": "10ms",
                  "timeout": "500ms", "dscp": "AF31", "methods": ["stamp", "icmp"]},
        "throughput": {"enabled": True, "interval": "1h", "duration": "3s", "streams": 2,
                       "budget_per_day": "5GiB", "max_bytes_per_test": "500MiB",
                       "windows": ["22:00-04:00", "12:00-12:30"]},
        "counters": {"interval": "5s"},
        "retention": {"raw": "48h", "downsampled": "720h", "bucket": "10m"},
        "baseline": {"rtt_increase": "20%", "loss_increase": "0.5%", "recent": 3},
        "peers": [{"name": "t1", "address": "198.18.0.2", "site": "tokyo", "port": 8620}],
    })
    assert cfg.probe.interval_s == 2.0 and cfg.probe.jitter_s == 0.25 and cfg.probe.dscp == 26
    assert cfg.reflector_listen == (("198.18.0.1", 862), ("::", 862))
    assert cfg.throughput.budget_bytes_per_day == 5 * 2**30
    assert cfg.throughput.windows[0].contains(23 * 60) and cfg.throughput.windows[0].contains(60)
    assert not cfg.throughput.windows[0].contains(12 * 60)
    assert cfg.retention.raw_s == 48 * 3600 and cfg.retention.bucket_s == 600
    assert cfg.baseline.loss_increase == pytest.approx(0.005)
    assert cfg.peers[0].methods == ("stamp", "icmp") and cfg.peers[0].port == 8620
    assert cfg.hmac_key == b"0123456789abcdef0123"


BAD_KEYS = [
    ({"daemon": {"colour": 1}}, "daemon.colour"),
    ({"daemon": {"metrics_listen": "localhost"}}, "daemon.metrics_listen"),
    ({"daemon": {"metrics_listen": "127.0.0.1:99999"}}, "daemon.metrics_listen"),
    ({"daemon": {"reflector_listen": ["1.2.3:862"]}}, "daemon.reflector_listen"),
    ({"daemon": {"log_format": "xml"}}, "daemon.log_format"),
    ({"daemon": {"hmac_key": "short"}}, "daemon.hmac_key"),
    ({"probe": {"interval": "fast"}}, "probe.interval"),
    ({"probe": {"interval": "0s"}}, "probe.interval"),
    ({"probe": {"jitter": "20s", "interval": "10s"}}, "probe.jitter"),
    ({"probe": {"count": 0}}, "probe.count"),
    ({"probe": {"dscp": "AF99"}}, "probe.dscp"),
    ({"probe": {"dscp": 62}}, "probe.dscp"),  # network control is never sent (issue 37)
    ({"probe": {"methods": ["udp"]}}, "probe.methods"),
    ({"probe": {"timeout": True}}, "probe.timeout"),
    ({"throughput": {"budget_per_day": "lots"}}, "throughput.budget_per_day"),
    ({"throughput": {"windows": ["25:00-26:00"]}}, "throughput.windows[0]"),
    ({"throughput": {"enabled": "yes"}}, "throughput.enabled"),
    ({"throughput": {"streams": 1000}}, "throughput.streams"),
    ({"counters": {"interval": "-1s"}}, "counters.interval"),
    ({"retention": {"raw": "720h", "downsampled": "24h"}}, "retention.downsampled"),
    ({"baseline": {"loss_increase": "150%"}}, "baseline.loss_increase"),
    ({"auto_apply": {"enabled": True, "tuners": ["sysctl"], "plan": "/p.json"}}, "auto_apply.plan_sha256"),
    ({"auto_apply": {"tuners": ["kernel"]}}, "auto_apply.tuners"),
    ({"peers": [{"name": "x", "address": "not-an-ip"}]}, "peers[0].address"),
    ({"peers": [{"address": "198.18.0.2"}]}, "peers[0].name"),
    ({"peers": [{"name": "x", "address": "198.18.0.2", "port": 70000}]}, "peers[0].port"),
    ({"peers": [{"name": "x", "address": "198.18.0.2"}, {"name": "x", "address": "198.18.0.3"}]},
     "peers[1].name"),
    ({"peers": [{"name": "x", "address": "198.18.0.2", "via": "a"}]}, "peers[0].via"),
    ({"probes": {}}, "probes"),
]


@pytest.mark.parametrize(("patch", "key"), BAD_KEYS, ids=[k for _, k in BAD_KEYS])
def test_each_bad_key_is_one_line_naming_it(patch, key):
    doc = {"daemon": {"state_dir": "/var/lib/wanprobe"},
           "peers": [{"name": "tokyo-1", "address": "198.18.0.2"}]}
    for section, body in patch.items():
        if isinstance(body, dict) and isinstance(doc.get(section), dict):
            doc[section] = {**doc[section], **body}
        else:
            doc[section] = body
    with pytest.raises(ConfigInvalid) as info:
        parse_config(doc)
    problems = info.value.problems
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{key}: "), problems
    assert "\n" not in problems[0]


@pytest.mark.parametrize(("content", "words"), [("short\n", "at least 16 characters (got 5)"),
                                               (b"\xff" * 20, "not UTF-8"), (None, "cannot read")])
def test_the_daemon_reads_its_key_file_as_the_cli_does(tmp_path, content, words):
    """Issue 38: one reader of the key file (userfiles.read_key_file), one length rule."""
    from wanprobe.errors import UsageError
    from wanprobe.userfiles import read_hmac_key_file

    key = tmp_path / "hmac.key"
    if content is not None:
        key.write_bytes(content if isinstance(content, bytes) else content.encode())
    doc = {"daemon": {"state_dir": "/var/lib/wanprobe", "hmac_key_file": str(key)},
           "peers": [{"name": "tokyo-1", "address": "198.18.0.2"}]}
    with pytest.raises(ConfigInvalid) as info:
        parse_config(doc)
    assert len(info.value.problems) == 1 and words in info.value.problems[0]
    assert info.value.problems[0].startswith("daemon.hmac_key_file: ")
    with pytest.raises(UsageError, match=re.escape(words)):
        read_hmac_key_file(str(key))
    key.write_text("  0123456789abcdef0123\n")
    assert parse_config(doc).hmac_key == read_hmac_key_file(str(key)) == b"0123456789abcdef0123"


def test_all_problems_reported_together():
    with pytest.raises(ConfigInvalid) as info:
        parse_config({"daemon": {}, "probe": {"interval": "x", "count": -1}, "peers": []})
    keys = {p.split(":")[0] for p in info.value.problems}
    assert {"daemon.state_dir", "probe.interval", "probe.count", "peers"} <= keys


def test_cli_prints_one_line_per_bad_key_and_exits_2(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(MINIMAL.replace('metrics_listen = "127.0.0.1:9862"',
                                    'metrics_listen = "127.0.0.1:9862"\n[probe]\ninterval = "soon"\ndscp = "XX"'))
    r = subprocess.run([sys.executable, "-m", "wanprobe", "daemon", "--config", str(path), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in r.stderr, r.stderr
    assert "probe.interval" in lines[0] and "probe.dscp" in lines[1]


def test_cli_not_toml_and_missing_file(tmp_path):
    bad = tmp_path / "x.toml"
    bad.write_text("[daemon\nstate_dir=")
    for path in (bad, tmp_path / "missing.toml"):
        r = subprocess.run([sys.executable, "-m", "wanprobe", "daemon", "--config", str(path), "--check"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr


MESH = """\
representatives = 2
[sites.taipei]
hosts = [
  { name = "tpe-1", address = "10.1.0.1" },
  { name = "tpe-2", address = "10.1.0.2" },
  { name = "tpe-3", address = "10.1.0.3" },
]
[sites.tokyo]
hosts = [
  { name = "tyo-1", address = "10.2.0.1" },
  { name = "tyo-2", address = "10.2.0.2" },
  { name = "tyo-3", address = "10.2.0.3" },
  { name = "tyo-4", address = "10.2.0.4" },
]
[sites.uswest]
hosts = [{ name = "usw-1", address = "10.3.0.1" }]
"""


def test_mesh_full_inside_site_representatives_across(tmp_path):
    path = tmp_path / "mesh.toml"
    path.write_text(MESH)
    m = topology.load_mesh(path)
    me = topology.find_self(m, hostname="tpe-2.example.net", local_addresses=[])
    peers = topology.select_peers(m, me)
    names = [p.name for p in peers]
    assert {"tpe-1", "tpe-3"} <= set(names) and "tpe-2" not in names
    assert sum(n.startswith("tyo") for n in names) == 2
    assert names.count("usw-1") == 1
    # representatives rotate with the prober, so all of tokyo gets probed by taipei as a whole
    picked = set()
    for h in ("tpe-1", "tpe-2", "tpe-3"):
        picked |= {p.name for p in topology.select_peers(m, topology.find_self(
            m, hostname=h, local_addresses=[])) if p.site == "tokyo"}
    assert len(picked) >= 3


def test_mesh_finds_self_by_address_and_json(tmp_path):
    data = {"sites": {"a": {"hosts": [{"name": "h1", "address": "198.18.0.1"},
                                      {"name": "h2", "address": "198.18.0.2"}]}}}
    path = tmp_path / "mesh.json"
    path.write_text(json.dumps(data))
    m = topology.load_mesh(path)
    me = topology.find_self(m, hostname="unrelated", local_addresses=["127.0.0.1", "198.18.0.2"])
    assert me.name == "h2"
    assert [p.name for p in topology.select_peers(m, me)] == ["h1"]
    with pytest.raises(Exception, match="not in the mesh"):
        topology.find_self(m, hostname="nobody", local_addresses=["127.0.0.1"])


def test_mesh_bad_entries_named(tmp_path):
    path = tmp_path / "mesh.toml"
    path.write_text('[sites.a]\nhosts = [{ name = "h1", address = "x" }, { address = "10.0.0.1" }]\n')
    with pytest.raises(ConfigInvalid) as info:
        topology.load_mesh(path)
    assert [p.split(":")[0] for p in info.value.problems] == ["sites.a.hosts[0].address",
                                                             "sites.a.hosts[1].name"]


def test_config_with_mesh_file_resolves_peers(tmp_path):
    (tmp_path / "mesh.toml").write_text(MESH)
    cfg = parse_config({"daemon": {"state_dir": str(tmp_path), "mesh_file": "mesh.toml",
                                   "hostname": "usw-1"}}, base_dir=tmp_path)
    peers = resolve_peers(cfg, local_addresses=[])
    assert sum(p.site == "taipei" for p in peers) == 2 and sum(p.site == "tokyo" for p in peers) == 2
