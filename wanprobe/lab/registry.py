"""State of running labs: one JSON file per lab under /run/wanprobe/labs (tmpfs, so a reboot
clears it), written atomically (temp name + rename)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from wanprobe.atomic_file import atomic_write

REGISTRY_DIR = Path(os.environ.get("WANPROBE_LAB_DIR", "/run/wanprobe/labs"))


def state_path(name: str, root: Path = REGISTRY_DIR) -> Path:
    return root / f"{name}.json"


def control_path(name: str, root: Path = REGISTRY_DIR) -> Path:
    return root / f"{name}.sock"


def log_path(name: str, root: Path = REGISTRY_DIR) -> Path:
    return root / f"{name}.log"


def write(name: str, state: dict, root: Path = REGISTRY_DIR) -> None:
    atomic_write(state_path(name, root), json.dumps(state, indent=1, sort_keys=True))


def read(name: str, root: Path = REGISTRY_DIR) -> dict | None:
    try:
        return json.loads(state_path(name, root).read_text())
    except (OSError, ValueError):
        return None


def remove(name: str, root: Path = REGISTRY_DIR) -> None:
    for path in (state_path(name, root), control_path(name, root), log_path(name, root)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def names(root: Path = REGISTRY_DIR) -> list[str]:
    if not root.is_dir():
        return []
    return sorted(p.stem for p in root.glob("*.json"))
