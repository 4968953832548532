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
