"""Resolve paths in a sysfs tree whose symlinks may have been flattened to files.

Real sysfs uses symlinks (``class/net/X -> ../../devices/.../net/X``). Some captured fixture
trees (tests/fixtures/trees, from .ttar archives) store such a link as a small regular file holding the target; this resolver
follows both, so readers work on /sys and on those trees alike.
"""

from __future__ import annotations

from pathlib import Path


def resolve(root: Path, *parts: str) -> Path:
    """``root/parts...`` with real or flattened symlinks followed at every component."""
    path = Path(root)
    for part in Path(*parts).parts if parts else ():
        path = path / part
        for _ in range(8):  # bounded: a loop of flattened links cannot hang us
            if path.is_file() and not path.is_symlink() and path.stat().st_size < 512:
                target = path.read_text().strip()
                if target.startswith("../") and "\n" not in target:
                    nxt = (path.parent / target)
                    if nxt.exists():
                        path = Path(*_normalise(nxt.parts))
                        continue
            break
    return path


def _normalise(parts: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for p in parts:
        if p == ".." and out and out[-1] not in ("/", ".."):
            out.pop()
        elif p != ".":
            out.append(p)
    return out


def read(root: Path, *parts: str) -> str | None:
    """Stripped text of a sysfs attribute, None when absent or unreadable (EINVAL on empty GIDs)."""
    try:
        text = resolve(root, *parts).read_text().strip()
    except OSError:
        return None
    return text


def listdir(root: Path, *parts: str) -> list[str]:
    p = resolve(root, *parts)
    try:
        return sorted(x.name for x in p.iterdir())
    except OSError:
        return []
