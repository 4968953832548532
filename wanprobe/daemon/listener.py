"""The daemon's HTTP listener as its config says: the routes of metrics.py on the bounded server
(httpd/server.py) under the web config (httpd/web_config.py), swapped whole on SIGHUP."""

from __future__ import annotations

import logging
from collections.abc import Callable

from wanprobe.daemon import logging as dlog
from wanprobe.daemon.config import DaemonConfig
from wanprobe.daemon.metrics import DaemonMetrics, MetricsServer
from wanprobe.httpd.web_config import WebConfig, load_web_config


def open_paths(cfg: DaemonConfig) -> frozenset[str]:
    """Routes served without authentication: ``/healthz`` when ``web_healthz_open`` (a kubelet
    probe carries no password; it reads only ok/not ok and counts)."""
    return frozenset({"/healthz"}) if cfg.web_healthz_open else frozenset()


def build(metrics: DaemonMetrics, health: Callable, cfg: DaemonConfig) -> MetricsServer:
    server = MetricsServer(metrics, health)
    server.http.set_web(load_web_config(cfg.web_config_file))
    server.http.open_paths = open_paths(cfg)
    return server


def reload(server: MetricsServer | None, cfg: DaemonConfig, web: WebConfig) -> None:
    """New connections under ``web``, the web config the reload checked (runtime.check_runtime);
    connections under way finish under the old one."""
    if server is None:
        return
    if web != server.http.web:
        dlog.log(logging.INFO, "listener web config loaded", web=web.source or "-",
                 serves=web.describe())
    server.http.set_web(web)
    server.http.open_paths = open_paths(cfg)
