"""Who this daemon is and whom it probes: the config with its identity settled and the peers
it resolves to (``[[peers]]`` plus, with a mesh file, the ones this host picks from it)."""

from __future__ import annotations

import logging
import socket
from dataclasses import replace
from pathlib import Path

from wanprobe.daemon import budget
from wanprobe.daemon import logging as dlog
from wanprobe.daemon.config import DaemonConfig, load_config
from wanprobe.daemon.state_dir import check_state_dir
from wanprobe.httpd.web_config import WebConfig, load_web_config
from wanprobe.mesh import topology
from wanprobe.mesh.peer import Peer


def resolve_runtime(cfg: DaemonConfig, *, hostname: str | None = None,
                    local_addresses: list[str] | None = None) -> tuple[DaemonConfig, tuple[Peer, ...]]:
    """The config with this host's site and name settled, and its peers: ``[[peers]]`` plus,
    with a mesh file, the peers this host picks from it (config wins), within the daemon's
    series budget (budget.py). The mesh entry names the host and its site; a ``daemon.site`` or
    a peer's ``site`` the mesh does not know is an error."""
    host = cfg.hostname or (hostname or socket.gethostname()).split(".")[0]
    site, selected = cfg.site, []
    if cfg.mesh_file is not None:
        m = topology.load_mesh(cfg.mesh_file)
        me = topology.find_self(m, hostname=cfg.hostname or hostname or socket.gethostname(),
                                local_addresses=local_addresses if local_addresses is not None
                                else topology.local_addresses())
        topology.check_sites(m, me, cfg.site, cfg.peers, source=cfg.source)
        host, site = me.name, me.site
        selected = [replace(p, port=cfg.probe.port, flows=cfg.probe.flows)
                    for p in topology.select_peers(m, me)]
    peers, note = budget.fit(cfg.peers, selected, site=site, host=host, source=cfg.source)
    if note:  # one line, at start, --check and each reload
        dlog.log(logging.WARNING, note, config=cfg.source)
    return replace(cfg, hostname=host, site=site), tuple(peers)


def resolve_peers(cfg: DaemonConfig, *, hostname: str | None = None,
                  local_addresses: list[str] | None = None) -> tuple[Peer, ...]:
    """The peers of :func:`resolve_runtime`."""
    return resolve_runtime(cfg, hostname=hostname, local_addresses=local_addresses)[1]


def load_runtime(path: Path, web_config_file: Path | None = None
                 ) -> tuple[DaemonConfig, tuple[Peer, ...]]:
    """Config (identity settled) and resolved peers, both validated; raises before anything
    takes effect. ``web_config_file`` (``daemon --web-config-file``) replaces the config's."""
    cfg = load_config(path)
    if web_config_file is not None:
        cfg = replace(cfg, web_config_file=web_config_file)
    return resolve_runtime(cfg)


def check_runtime(path: Path, web_config_file: Path | None = None
                  ) -> tuple[DaemonConfig, tuple[Peer, ...], WebConfig]:
    """Everything ``daemon --check`` refuses, and SIGHUP runs before it applies anything: the
    config, its key files and the mesh (:func:`load_runtime`), then the state dir as the daemon
    uses it (state_dir.py), and the listener's web config (httpd/web_config.py: certificates load,
    bcrypt hashes only). One function, so a reload never accepts what the next start would
    refuse with exit 2 (``RestartPreventExitStatus=2`` would leave the daemon down, issue 37).
    Returns the web config it loaded, for the listener to serve under."""
    cfg, peers = load_runtime(path, web_config_file)
    check_state_dir(cfg.state_dir, cfg.reports_dir)
    return cfg, peers, load_web_config(cfg.web_config_file)
