"""Report → Plan: turn the knobs of a diagnose report's findings into validated changes.

Each tuner decides per knob (``Tuner.plan``): a ``Change``, or a ``Skip`` with the reason (absent
or read-only here, not offered by the kernel, an administrator's higher value, already set).
NCCL knobs are not host settings: they become a manual step pointing at ``wanprobe nccl-env``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuners.knob import Change, Skip, Tuner
from tuners.netns import current_inode
from tuners.plan import Manual, Plan, now_iso, report_ref
from wanprobe.errors import ConfigError, WanprobeError
from wanprobe.report.document import load_json


def load_report(path: str | Path) -> dict[str, Any]:
    """A report for planning: the one report loader (``wanprobe.report.document.load_json``)
    checks its shape; a planner needs only ``schema_version`` and the findings' knobs."""
    data = load_json(path, strict=False)
    if "schema_version" not in data:
        raise ConfigError(f"{path} is not a wanprobe report (no schema_version)")
    return data


def knobs_of(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Knobs in finding order. Several for one (tuner, key) are alternatives in order of
    preference (e.g. cc bbr, then cubic): the first one the tuner accepts wins."""
    out = []
    for finding in report.get("findings") or []:
        for knob in (finding or {}).get("knobs") or []:
            if not isinstance(knob, dict) or "tuner" not in knob or "key" not in knob:
                continue
            reason = knob.get("reason") or finding.get("title") or finding.get("id", "")
            out.append({**knob, "reason": f"[{finding.get('id', '?')}] {reason}"})
    return out


BUFFER_KEYS = ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.core.rmem_max", "net.core.wmem_max")


def slow_nic(report: Mapping[str, Any]) -> str | None:
    """R-29 / fasterdata: big-buffer tuning "will actually decrease performance" at ≤ 100 Mbit/s."""
    host, meas = report.get("host") or {}, report.get("measurements") or {}
    iface = (meas.get("mtu") or {}).get("iface") or (report.get("peer") or {}).get("iface")
    speed = ((host.get("ifaces") or {}).get(iface) or {}).get("speed_mbps") if iface else None
    if isinstance(speed, int | float) and 0 < speed <= 100:
        return f"{iface} runs at {speed:g} Mbit/s: buffer tuning hurts hosts at ≤ 100 Mbit/s (ESnet, R-29)"
    return None


def build_plan(report: Mapping[str, Any], tuners: Mapping[str, Tuner], *, host_id: str,
               report_path: Path | None = None, side: str = "local") -> Plan:
    """Plan the knobs meant for ``side`` ("local": the host that ran diagnose; "peer": the far
    end, planned there from the same report). Knobs without a side, or "both", go to either."""
    if side not in ("local", "peer"):
        raise ConfigError(f"side must be local or peer, got {side!r}")
    changes: list[Change] = []
    skipped: list[Skip] = []
    manual: list[Manual] = []
    slow = slow_nic(report)
    decided: set[tuple[str, str]] = set()
    pending_skips: dict[tuple[str, str], Skip] = {}
    for knob in knobs_of(report):
        tname, key, value, reason = knob["tuner"], str(knob["key"]), knob.get("value"), knob["reason"]
        if (tname, key) in decided:
            continue
        if slow and tname == "sysctl" and key in BUFFER_KEYS:
            pending_skips.setdefault((tname, key), Skip(tname, key, slow))
            continue
        if knob.get("side") not in (None, "both", side):
            pending_skips.setdefault((tname, key), Skip(
                tname, key, f"meant for the {knob.get('side')} side; plan it there with --side {knob.get('side')}"))
            continue
        if tname == "nccl":
            manual.append(Manual("nccl", key, str(value), reason,
                                 (f"wanprobe nccl-env --report {report_path or 'REPORT'} --format nccl.conf",)))
            continue
        tuner = tuners.get(tname)
        if tuner is None:
            skipped.append(Skip(tname, key, f"no {tname} tuner available here"))
            continue
        try:
            result = tuner.plan(key, value, reason)
        except WanprobeError as exc:
            result = Skip(tname, key, str(exc))
        if isinstance(result, Skip):
            pending_skips.setdefault((tname, key), result)  # an alternative may still work
            continue
        decided.add((tname, key))
        (changes if isinstance(result, Change) else manual).append(result)
    skipped += [s for ident, s in pending_skips.items() if ident not in decided]
    ref = report_ref(report_path, dict(report)) if report_path else {"id": report.get("id", "")}
    return Plan(host_id=host_id, netns_inode=current_inode(), created_at=now_iso(),
                changes=tuple(changes), skipped=tuple(skipped), manual=tuple(manual),
                source_report=ref)
