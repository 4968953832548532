"""The auto-apply gate: which signed-off plan may ``wanprobe-tune.service`` apply unattended.

The daemon itself holds no CAP_NET_ADMIN and never writes a setting. With ``[auto_apply]``
enabled it checks, at start and on every reload, that the plan file is exactly the one the
operator signed off (its sha256 pinned in the config) and that every change in it belongs to a
whitelisted tuner; ``wanprobe daemon --check-plan`` runs the same gate as the tune unit's
``ExecCondition=``, so a plan edited after review or touching another tuner is never applied.

The trigger: when a path regresses, the daemon writes ``apply-request.json`` in its state dir
(atomically, at most once per ``auto_apply.min_interval``) naming the report and the plan's
digest; ``systemd/wanprobe-tune.path`` watches that file (PathChanged=) and starts the tune unit,
which checks the plan again before it applies it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tuners.journal import atomic_write
from wanprobe.daemon.config import AutoApply
from wanprobe.errors import ConfigError
from wanprobe.userfiles import parse_json, read_bytes


def check_plan(auto: AutoApply) -> list[dict]:
    """Return the plan's changes if it may be applied; raise ConfigError (one line) if not."""
    if not auto.enabled:
        raise ConfigError("auto_apply is off in the config (the default)")
    assert auto.plan is not None and auto.plan_sha256 is not None  # validated by config
    raw = read_bytes(auto.plan, "auto_apply.plan")
    digest = hashlib.sha256(raw).hexdigest()
    if digest != auto.plan_sha256:
        raise ConfigError(f"auto_apply.plan {auto.plan} is not the signed-off plan "
                          f"(sha256 {digest[:12]}…, signed off {auto.plan_sha256[:12]}…)")
    try:
        plan = parse_json(raw, f"auto_apply.plan {auto.plan}")
        changes = list(plan["changes"])
    except (KeyError, TypeError):
        raise ConfigError(f"auto_apply.plan {auto.plan} is not a wanprobe plan (no changes[])") from None
    for change in changes:
        tuner = change.get("tuner") if isinstance(change, dict) else None
        if tuner not in auto.tuners:
            raise ConfigError(f"auto_apply.plan {auto.plan} changes {change.get('key') if isinstance(change, dict) else change!r} "
                              f"with tuner {tuner!r}, which is not in auto_apply.tuners")
    return changes


REQUEST_NAME = "apply-request.json"


def request_apply(auto: AutoApply, state_dir: Path, *, reason: dict, now_s: float,
                  last_request_s: float | None) -> Path | None:
    """Ask ``wanprobe-tune.service`` to apply the signed-off plan: write ``state_dir /
    REQUEST_NAME`` (tuners.journal.atomic_write: temp file, fsync, rename, so the path unit never sees half a file). Returns the
    path, or None when auto-apply is off or the last request is younger than min_interval.
    Raises ConfigError (one line) if the plan fails the gate; OSError if the file cannot be
    written."""
    if not auto.enabled:
        return None
    if last_request_s is not None and now_s - last_request_s < auto.min_interval_s:
        return None
    changes = check_plan(auto)
    doc = {"requested_at_unix": now_s, "plan": str(auto.plan), "plan_sha256": auto.plan_sha256,
           "changes": len(changes), "reason": reason}
    return atomic_write(state_dir / REQUEST_NAME, json.dumps(doc, indent=2) + "\n", mode=0o600)
