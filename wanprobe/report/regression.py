"""The daemon's ticket: a report document (the ``diagnose`` schema) for a regression or a path
event of one peer, with the last probe, the peer's baseline, the regressions and the findings
(diagnose/regressions.py, diagnose/path_findings.py). A document that fails the schema is still
written, with the reason under ``measurements.errors.schema``: a ticket is more use than none."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from wanprobe.diagnose.finding import Finding
from wanprobe.errors import WanprobeError


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _host_json() -> dict[str, Any]:
    """This host's configuration (diagnose/host_config.py, without live socket reads); its name
    and kernel alone when it cannot be read."""
    try:
        from wanprobe.diagnose.host_config import read_host_config

        return read_host_config(live=False).to_json()
    except (ImportError, OSError, WanprobeError):
        return {"hostname": socket.gethostname(), "kernel": os.uname().release, "sysctls": {},
                "available_cc": [], "allowed_cc": [], "ifaces": {}}


class TicketPeer(Protocol):
    """The peer a ticket is about (``mesh.peer.Peer`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def site(self) -> str: ...


def regression_report(peer: TicketPeer, transitions: list[dict[str, Any]],
                      last_probe: dict[str, Any] | None, baseline: dict[str, Any], *,
                      started: float, finished: float,
                      findings: Sequence[Finding]) -> dict[str, Any]:
    """The document for ``peer`` (a ``mesh.peer.Peer``: name, address, port, site)."""
    from wanprobe import __version__
    from wanprobe.report.document import SCHEMA_VERSION, validate

    measurements: dict[str, Any] = {"path": last_probe, "mtu": None, "throughput": None,
                                    "counters": None, "baseline": baseline,
                                    "regressions": transitions}
    doc = {
        "schema_version": SCHEMA_VERSION,
        "id": f"regression-{peer.name}-{uuid.uuid4().hex[:12]}",
        "created_at": _iso(finished), "tool": {"name": "wanprobe daemon", "version": __version__},
        "host": _host_json(), "peer": {"address": peer.address, "port": peer.port,
                                       "name": peer.name, "site": peer.site},
        "measurements": measurements,
        "findings": [f.to_json() for f in findings], "plan": None,
        "timestamps": {"started": _iso(started), "finished": _iso(finished)},
    }
    try:
        validate(doc)
    except WanprobeError as exc:  # still a useful ticket: write it, say what is off
        measurements["errors"] = {"schema": str(exc)}
    return doc
