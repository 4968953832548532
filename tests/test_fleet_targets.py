"""`wanprobe fleet targets` and the mesh checks it shares with `wanprobe daemon --check`: file_sd
JSON for every daemon, and one clear error for each kind of bad mesh file."""

from __future__ import annotations

import json

import pytest

from wanprobe.cli import main

MESH = """
metrics_port = 9100
[sites.taipei]
metrics_port = 9200
hosts = [
  { name = "tpe-1", address = "10.1.0.1" },
  { name = "tpe-2", address = "10.1.0.2", metrics_port = 9300 },
]
[sites.tokyo]
hosts = [{ name = "tyo-1", address = "2001:db8::1" }]
[[hosts]]
name = "tyo-2"
address = "10.2.0.2"
site = "tokyo"
"""

BAD = {
    "duplicate host": ('[sites.a]\nhosts = [{ name = "h1", address = "10.0.0.1" },\n'
                       '         { name = "h1", address = "10.0.0.2" }]\n',
                       "sites.a.hosts[1].name: duplicate host 'h1'"),
    "unknown site": ('[sites.a]\nhosts = [{ name = "h1", address = "10.0.0.1" }]\n'
                     '[[hosts]]\nname = "h2"\naddress = "10.0.0.2"\nsite = "b"\n',
                     "hosts[0].site: unknown site 'b'"),
    "host in two sites": ('[sites.a]\nhosts = [{ name = "h1", address = "10.0.0.1" }]\n'
                          '[sites.b]\nhosts = [{ name = "h1", address = "10.0.0.2" }]\n',
                          "sites.b.hosts[0].name: host 'h1' is in two sites, 'a'"),
    "address in two hosts": ('[sites.a]\nhosts = [{ name = "h1", address = "10.0.0.1" }]\n'
                             '[sites.b]\nhosts = [{ name = "h2", address = "10.0.0.1" }]\n',
                             "sites.b.hosts[0].address: 10.0.0.1 is also host 'h1'"),
}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ex:
        main(list(argv))
    out = capsys.readouterr()
    return ex.value.code, out.out, out.err


def scrape_warnings(err: str) -> str:
    """stderr without the warning about a listener off loopback without a web config (issue
    37, tests/test_secure_scrape.py): every non-loopback listener here draws it."""
    return "".join(ln for ln in err.splitlines(keepends=True)
                   if "no daemon.web_config_file secures it" not in ln)


def test_targets_file_sd_has_every_daemon_with_site_and_host(capsys, tmp_path):
    mesh = tmp_path / "mesh.toml"
    mesh.write_text(MESH)
    rc, out, err = run(capsys, "fleet", "targets", "--mesh", str(mesh))
    assert rc == 0, err
    assert json.loads(out) == [
        {"targets": ["10.1.0.1:9200"], "labels": {"site": "taipei", "host": "tpe-1"}},
        {"targets": ["10.1.0.2:9300"], "labels": {"site": "taipei", "host": "tpe-2"}},
        {"targets": ["[2001:db8::1]:9100"], "labels": {"site": "tokyo", "host": "tyo-1"}},
        {"targets": ["10.2.0.2:9100"], "labels": {"site": "tokyo", "host": "tyo-2"}},
    ]
    rc, out, err = run(capsys, "fleet", "targets", "--mesh", str(mesh), "--site", "tokyo")
    assert rc == 0 and [g["labels"]["host"] for g in json.loads(out)] == ["tyo-1", "tyo-2"]
    rc, out, err = run(capsys, "fleet", "targets", "--mesh", str(mesh), "--site", "osaka")
    assert rc == 2 and "--site: 'osaka' is not a site" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_mesh_is_one_clear_error_from_targets_and_daemon_check(capsys, tmp_path, case):
    text, expected = BAD[case]
    mesh = tmp_path / "mesh.toml"
    mesh.write_text(text)
    rc, out, err = run(capsys, "fleet", "targets", "--mesh", str(mesh))
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1, err
    assert expected in lines[0] and "Traceback" not in err

    cfg = tmp_path / "wanprobe.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\nmesh_file = "{mesh}"\nhostname = "h1"\n')
    rc, out, err = run(capsys, "daemon", "--config", str(cfg), "--check")
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert expected in lines[0] and "Traceback" not in err


def test_daemon_check_refuses_a_site_the_mesh_does_not_declare(capsys, tmp_path):
    mesh = tmp_path / "mesh.toml"
    mesh.write_text(MESH)
    cfg = tmp_path / "wanprobe.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\nmesh_file = "{mesh}"\n'
                   f'hostname = "tpe-1"\nsite = "osaka"\n')
    rc, _, err = run(capsys, "daemon", "--config", str(cfg), "--check")
    assert rc == 2 and "daemon.site: unknown site 'osaka'" in err and len(err.strip().splitlines()) == 1
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\nmesh_file = "{mesh}"\n'
                   f'hostname = "tpe-1"\nsite = "tokyo"\n')
    rc, _, err = run(capsys, "daemon", "--config", str(cfg), "--check")
    assert rc == 2 and "mesh puts host 'tpe-1' in site 'taipei'" in err
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\nmesh_file = "{mesh}"\n'
                   f'hostname = "tpe-1"\nsite = "taipei"\n')
    rc, out, err = run(capsys, "daemon", "--config", str(cfg), "--check")
    assert rc == 0 and "host tpe-1 in site taipei" in out and "tyo-1=2001:db8::1 (tokyo)" in out, err


@pytest.mark.parametrize("listen, warned", [
    (None, "127.0.0.1:9862 answers on loopback only"),          # the default
    ("127.0.0.1:9200", "127.0.0.1:9200 answers on loopback only"),
    ("0.0.0.0:9200", None), ("10.1.0.1:9200", None), ("[::]:9200", None),
    ("10.1.0.9:9200", "10.1.0.9:9200 is bound to another address"),
    ("0.0.0.0:9862", "0.0.0.0:9862 listens on port 9862"),
    ("[::1]:9100", "answers on loopback only and listens on port 9100")])
def test_daemon_check_warns_when_prometheus_could_not_scrape_it(capsys, tmp_path, listen, warned):
    """`fleet targets` has Prometheus scrape tpe-1 at 10.1.0.1:9200 (its mesh address and
    port): a daemon whose /metrics listens elsewhere is fine itself, but every scrape of it
    fails. `daemon --check` says so in one warning line and still exits 0."""
    mesh = tmp_path / "mesh.toml"
    mesh.write_text(MESH)
    rc, out, _ = run(capsys, "fleet", "targets", "--mesh", str(mesh), "--site", "taipei")
    assert json.loads(out)[0] == {"targets": ["10.1.0.1:9200"],
                                  "labels": {"site": "taipei", "host": "tpe-1"}}
    cfg = tmp_path / "wanprobe.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\nmesh_file = "{mesh}"\n'
                   f'hostname = "tpe-1"\n' + (f'metrics_listen = "{listen}"\n' if listen else ""))
    rc, out, err = run(capsys, "daemon", "--config", str(cfg), "--check")
    assert rc == 0 and "host tpe-1 in site taipei" in out, err
    err = scrape_warnings(err)
    if warned is None:
        assert err == ""
        return
    (line,) = err.strip().splitlines()
    assert line.startswith(f"wanprobe: warning: {cfg}: daemon.metrics_listen ") and warned in line
    assert "Prometheus scrapes this host at 10.1.0.1:9200" in line
    assert "listen on 10.1.0.1:9200 or 0.0.0.0:9200" in line


def test_daemon_check_warns_for_an_ipv6_mesh_address_on_an_ipv4_wildcard(capsys, tmp_path):
    mesh = tmp_path / "mesh.toml"
    mesh.write_text(MESH)
    cfg = tmp_path / "wanprobe.toml"
    said = {}
    for listen in ("0.0.0.0:9100", "[::]:9100", "[2001:db8::1]:9100"):
        cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\nmesh_file = "{mesh}"\n'
                       f'hostname = "tyo-1"\nmetrics_listen = "{listen}"\n')
        rc, _, said[listen] = run(capsys, "daemon", "--config", str(cfg), "--check")
        assert rc == 0, said[listen]
        said[listen] = scrape_warnings(said[listen])
    assert said["[::]:9100"] == said["[2001:db8::1]:9100"] == ""
    (line,) = said["0.0.0.0:9100"].strip().splitlines()
    assert ("daemon.metrics_listen 0.0.0.0:9100 takes IPv4 only, but Prometheus scrapes this "
            "host at [2001:db8::1]:9100") in line and line.endswith("or [::]:9100")


def test_daemon_check_without_a_mesh_does_not_warn_about_loopback(capsys, tmp_path):
    """Without a mesh file nothing says where Prometheus scrapes: loopback may be intended (a
    Prometheus on the same host, or a scrape through an SSH tunnel)."""
    cfg = tmp_path / "wanprobe.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n[[peers]]\nname = "p"\n'
                   'address = "198.18.0.2"\n')
    rc, out, err = run(capsys, "daemon", "--config", str(cfg), "--check")
    assert rc == 0 and err == "" and "1 peers" in out
