"""Prometheus ``file_sd_configs`` targets for every daemon in a mesh file.

The format is a JSON list of ``{"targets": ["host:port"], "labels": {...}}`` groups
(https://prometheus.io/docs/prometheus/latest/configuration/configuration/#file_sd_config).
Each daemon is its own group so it carries its ``site`` and ``host``; these are target labels,
not ``src_site``/``src_host``, because a target label that a scraped series also carries is
renamed ``exported_*`` (honor_labels: false), and every path series already has ``src_*``.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from wanprobe.daemon.mesh import Mesh


def host_port(address: str, port: int) -> str:
    """``10.0.0.1:9862`` or ``[2001:db8::1]:9862`` (RFC 3986 §3.2.2 brackets IPv6)."""
    return f"[{address}]:{port}" if ipaddress.ip_address(address).version == 6 else f"{address}:{port}"


def file_sd(mesh: Mesh, *, site: str | None = None) -> list[dict[str, Any]]:
    """One target group per daemon (of ``site`` only, if given), in mesh order."""
    return [{"targets": [host_port(h.address, h.metrics_port)],
             "labels": {"site": h.site, "host": h.name}}
            for h in mesh.hosts if site is None or h.site == site]
