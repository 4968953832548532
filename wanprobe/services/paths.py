"""The paths service (issue 16): N flows traced and probed over the ECMP paths to a peer, the
rate checked against the reflector's limit first (probe/rate_guard.py), the reflector's part
of the document, and the ECMP judgement through the engine (``path.ecmp_imbalance``,
diagnose/rules_ecmp.py). ``wanprobe paths`` parses its options, calls :func:`run_paths` and
renders; ``probe --flows`` calls :func:`probe_over_flows`.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wanprobe.errors import UsageError

Say = Callable[[str], None]   # one line for stderr


@dataclass(frozen=True)
class PathsRun:
    """The ``paths`` document (flows, summary, reflector, findings) and the probe counts the
    command's exit status is made of."""

    doc: dict[str, Any]
    received: int
    refused: int
    sent: int


def run_paths(peer: str, *, flows: int, count: int, port: int, interval_s: float,
              timeout_s: float, max_ttl: int, src_ports: list[int] | None,
              hmac_key: bytes | None, policy: str, say: Say) -> PathsRun:
    """Plan the rate (``policy``: pace, refuse or send above the reflector's limit; a paced plan
    said through ``say``), trace and probe the flows, and judge the document. The options are
    checked by the caller."""
    from wanprobe.probe.multiflow import merge
    from wanprobe.probe.paths import measure_paths
    from wanprobe.probe.rate_guard import annotate, checked_rate

    n_flows = len(src_ports) if src_ports else flows
    kw: dict[str, Any] = {"port": port, "interval_s": interval_s, "timeout_s": timeout_s,
                          "hmac_key": hmac_key}
    plan = checked_rate(peer, kw, policy, n_flows / interval_s, say=say)
    interval_s = plan.interval_s
    result = asyncio.run(measure_paths(
        peer, flows=flows, count=count, port=port, interval_s=interval_s,
        timeout_s=timeout_s, max_ttl=max_ttl, src_ports=src_ports, hmac_key=hmac_key))
    doc: dict[str, Any] = result.to_json()
    doc["reflector"] = annotate(merge([f.probe for f in result.flows], interval_s).to_json(),
                                plan, 1 / interval_s)["reflector"]
    doc["findings"] = paths_findings(doc)
    losses = [f.probe.loss for f in result.flows]
    return PathsRun(doc, received=sum(x.received for x in losses),
                    refused=sum(x.reflector_session_refused for x in losses),
                    sent=sum(x.sent for x in losses))


def paths_findings(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The engine on this document: ``path.ecmp_imbalance`` when the paths differ (the ECMP
    rules of diagnose/rules_ecmp.py, no host)."""
    from wanprobe.diagnose import rules_ecmp
    from wanprobe.diagnose.context import Context
    from wanprobe.diagnose.engine import judge
    from wanprobe.diagnose.inputs import DiagnoseConfig
    from wanprobe.diagnose.measured import Measured

    ctx = Context(measured=Measured(paths_summary=doc.get("summary") or None), host=None,
                  config=DiagnoseConfig())
    return [f.to_json() for f in judge(ctx, rules_ecmp.RULES)]


def probe_over_flows(host: str, flows: int, kw: dict[str, Any], policy: str,
                     say: Say) -> dict[str, Any]:
    """``probe --flows K``: the probe's packets over K traced source ports (multiflow.py), the
    rate checked against the reflector's limit first (rate_guard.py, ``policy``); the probe
    document with its ``reflector`` part and ``peer``. ``kw``: the probe's port, interval_s,
    timeout_s, count, duration_s, hmac_key (its interval_s becomes the planned one)."""
    from wanprobe.probe.multiflow import probe_flows
    from wanprobe.probe.peer import resolve_peer
    from wanprobe.probe.rate_guard import annotate, checked_rate

    plan = checked_rate(host, kw, policy, 1 / kw["interval_s"], say=say)
    interval_s = kw["interval_s"] = plan.interval_s
    count = kw["count"] or (round(kw["duration_s"] / interval_s) if kw["duration_s"] else 10)

    async def run() -> dict[str, Any]:
        family, addr = await resolve_peer(host)
        if family != socket.AF_INET:
            raise UsageError("--flows traces IPv4 peers only")
        return (await probe_flows(addr, kw["port"], flows=flows, count=count,
                                  interval_s=interval_s, timeout_s=kw["timeout_s"],
                                  hmac_key=kw.get("hmac_key")))[1]

    doc = annotate(asyncio.run(run()), plan, 1 / (interval_s * flows))
    doc["peer"] = host
    return doc
