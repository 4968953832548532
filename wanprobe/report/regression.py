"""The daemon's ticket: a report document (the ``diagnose`` schema) for a regression or a path
event of one peer, with the last probe, the peer's baseline, the regressions and the findings
(diagnose/regressions.py, diagnose/path_findings.py). A document that fails the schema is still
written, with the reason under ``measurements.errors.schema``: a ticket is more use than none."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

from collectors.host_config import HostConfig, read_host_config
from wanprobe.diagnose.finding import Finding
from wanprobe.errors import WanprobeError
from wanprobe.report.document import SCHEMA_VERSION, Report, validate


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _host_json() -> dict[str, Any]:
    """This host's configuration (collectors/host_config.py, without live socket reads); its name
    and kernel alone when it cannot be read."""
    try:
        return read_host_config(live=False).to_json()
    except (OSError, WanprobeError):
        return HostConfig.unreadable().to_json()


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
    """The document for ``peer`` (a ``mesh.peer.Peer``: name, address, port, site), written
    by the one writer of a report (``document.Report.to_json``) and validated."""
    from wanprobe import __version__

    measurements: dict[str, Any] = {"path": last_probe, "mtu": None, "throughput": None,
                                    "counters": None, "baseline": baseline,
                                    "regressions": transitions}
    report = Report(
        id=f"regression-{peer.name}-{uuid.uuid4().hex[:12]}", created_at=_iso(finished),
        tool={"name": "wanprobe daemon", "version": __version__}, host=_host_json(),
        peer={"address": peer.address, "port": peer.port, "name": peer.name, "site": peer.site},
        measurements=measurements, findings=tuple(findings), plan=None,
        timestamps={"started": _iso(started), "finished": _iso(finished)},
        schema_version=SCHEMA_VERSION)
    try:
        validate(report.to_json())
    except WanprobeError as exc:  # still a useful ticket: write it, say what is off
        report = replace(report, measurements={**measurements, "errors": {"schema": str(exc)}})
    return report.to_json()
