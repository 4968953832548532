"""Report → Plan: turn the knobs of a diagnose report's findings into validated changes.

Each tuner decides per knob (``Tuner.plan``): a ``Change``, or a ``Skip`` with the reason (absent
or read-only here, not offered by the kernel, an administrator's higher value, already set).
NCCL knobs are not host settings: they become a manual step pointing at ``wanprobe nccl-env``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuners.knob import Change, Manual, Skip, Tuner
from tuners.netns import current_inode
from tuners.plan import Plan, now_iso, report_ref
from wanprobe.errors import ConfigError, WanprobeError
from wanprobe.report.codec import parts_of
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
    """R-29 / fasterdata: big-buffer tuning "will actually decrease performance" at ≤ 100 Mbit/s.
    The interface toward the peer and its speed come from the typed report (the MTU search's
    interface; the host's interface facts)."""
    measured, host = parts_of(report)
    iface = measured.egress_iface
    link = host.iface(iface) if host is not None else None
    speed = link.speed_mbps if link is not None else None
    if speed is not None and 0 < speed <= 100:
        return f"{iface} runs at {speed:g} Mbit/s: buffer tuning hurts hosts at ≤ 100 Mbit/s (ESnet, R-29)"
    return None


def knob_host(knob: Mapping[str, Any]) -> str | None:
    """The host a knob is for: its ``host`` (report 1.1), else its legacy ``side`` ("both" or
    none: either end, None here)."""
    for field in ("host", "side"):
        if knob.get(field) in ("local", "peer"):
            return str(knob[field])
    return None


def host_address(report: Mapping[str, Any], which: str) -> str | None:
    """The address of ``which`` end as the measuring host saw it (report 1.1), else None."""
    if which == "peer":
        addr = (report.get("peer") or {}).get("address")
    else:
        host = parts_of(report)[1]
        addr = host.address if host is not None else None
    try:
        return str(ipaddress.ip_address(str(addr))) if addr else None
    except ValueError:
        return None  # a host name: the address check is skipped, the host id still applies


def check_capacity(report: Mapping[str, Any], path_name: str | Path | None = None) -> None:
    """A 1.1 report with buffer knobs must carry the path capacity they were sized from."""
    if str(report.get("schema_version", "1.0")) in ("1.0",):
        return
    if not any(k["key"] in BUFFER_KEYS for k in knobs_of(report)):
        return
    path = parts_of(report)[0].path
    if path is None or not path.capacity or not path.capacity.bits_per_second:
        why = (path.capacity_source if path else None) or "no path measurement"
        raise ConfigError(f"report {path_name or report.get('id', '')} has no path capacity ({why}): "
                          "buffer sizes would be guesses; re-run diagnose with its throughput "
                          "test or --link-rate")


def unknown_of(report: Mapping[str, Any], which: str) -> tuple[str, ...]:
    """What a plan for ``which`` could not know because that host sent no facts."""
    measured = parts_of(report)[0]
    if which != "peer" or measured.legacy or measured.peer_facts is not None:
        return ()
    why = measured.peer_facts_error or "the peer sent no host facts"
    return (f"the peer's current tcp_rmem, tcp_wmem, tcp_mem, congestion control, MTU and qdisc "
            f"({why}); its values are read and validated when the plan is applied there",)


def _plan_remote(knob: Mapping[str, Any]) -> Change | Skip:
    """A change for a host that is not this one: validated when applied there."""
    return Change(knob["tuner"], str(knob["key"]), None, str(knob.get("value")),
                  knob["reason"] + " (validated when applied on that host)")


def build_plan(report: Mapping[str, Any], tuners: Mapping[str, Tuner], *, host_id: str,
               report_path: Path | None = None, side: str = "local",
               local_addresses: frozenset[str] | None = None) -> Plan:
    """Plan the knobs meant for ``side`` ("local": the host that ran diagnose; "peer": the far
    end). Knobs without a host, or "both", go to either. When the plan's host address is known
    and is not one of ``local_addresses`` (this host), the changes are left for the target host
    to validate at apply time and the plan is bound to that address instead of a host id."""
    if side not in ("local", "peer"):
        raise ConfigError(f"host must be local or peer, got {side!r}")
    address = host_address(report, side)
    remote = address is not None and local_addresses is not None and \
        address not in local_addresses
    changes: list[Change] = []
    skipped: list[Skip] = []
    manual: list[Manual] = []
    slow = slow_nic(report) if side == "local" else None
    decided: set[tuple[str, str]] = set()
    pending_skips: dict[tuple[str, str], Skip] = {}
    for knob in knobs_of(report):
        tname, key, value, reason = knob["tuner"], str(knob["key"]), knob.get("value"), knob["reason"]
        if (tname, key) in decided:
            continue
        if slow and tname == "sysctl" and key in BUFFER_KEYS:
            pending_skips.setdefault((tname, key), Skip(tname, key, slow))
            continue
        target = knob_host(knob)
        if target not in (None, side):
            pending_skips.setdefault((tname, key), Skip(
                tname, key, f"meant for the {target} host; plan it with --host {target} "
                f"(--side {target})"))
            continue
        if tname == "nccl":
            manual.append(Manual("nccl", key, str(value), reason,
                                 (f"wanprobe nccl-env --report {report_path or 'REPORT'} --format nccl.conf",)))
            continue
        tuner = tuners.get(tname)
        result: Change | Skip | Manual
        if remote:
            result = _plan_remote(knob)
        elif tuner is None:
            skipped.append(Skip(tname, key, f"no {tname} tuner available here"))
            continue
        else:
            try:
                result = tuner.plan(key, value, reason)
            except WanprobeError as exc:
                result = Skip(tname, key, str(exc))
        if isinstance(result, Skip):
            pending_skips.setdefault((tname, key), result)  # an alternative may still work
            continue
        decided.add((tname, key))
        if isinstance(result, Change):
            changes.append(result)
        else:
            manual.append(result)
    skipped += [s for ident, s in pending_skips.items() if ident not in decided]
    ref = report_ref(report_path, dict(report)) if report_path else {"id": report.get("id", "")}
    return Plan(host_id="" if remote else host_id, netns_inode=0 if remote else current_inode(),
                created_at=now_iso(), changes=tuple(changes), skipped=tuple(skipped),
                manual=tuple(manual), source_report=ref, for_host=side, host_address=address,
                unknown=unknown_of(report, side))
