"""Small, exception-free readers of sysfs/procfs files.

Every function returns a value *or* a reason string; none raises for a missing, unreadable,
truncated or garbage file, so one bad file never stops a collector (node_exporter's rule: a
failing piece is reported, never fatal).
"""

from __future__ import annotations

import os
from pathlib import Path

MISSING = "missing"


def read_text(path: Path | str) -> tuple[str | None, str | None]:
    """``(text stripped of trailing whitespace, None)`` or ``(None, reason)``.

    reason is ``"missing"`` for a file that does not exist (absent, not an error), otherwise a
    short description of why it could not be read (directory in place of a file, EINVAL from an
    unpopulated GID entry, permission, ...). Uses raw ``os.open``/``os.read``: sysfs attributes
    are one page at most and this is the hot path of every sample.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, MISSING
    except OSError as exc:
        return None, f"unreadable: {os.strerror(exc.errno) if exc.errno else exc}"
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            if sum(map(len, chunks)) >= 1 << 20:
                break
        data = b"".join(chunks)
    except IsADirectoryError:
        return None, "unreadable: is a directory"
    except OSError as exc:
        return None, f"unreadable: {os.strerror(exc.errno) if exc.errno else exc}"
    finally:
        os.close(fd)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "garbage: not UTF-8 text"
    return text.rstrip("\n\r\t \x00"), None


def parse_int(text: str) -> tuple[int | None, str | None]:
    """Parse a decimal counter value as the kernel prints it (``%llu``/``%d``), allowing a sign.

    Empty text is reported as truncated; anything else non-numeric as ``not an integer``.
    """
    s = text.strip()
    if not s:
        return None, "truncated: empty file"
    try:
        return int(s, 10), None
    except ValueError:
        shown = s if len(s) <= 40 else s[:37] + "..."
        return None, f"not an integer: {shown!r}"


def read_int(path: Path) -> tuple[int | None, str | None]:
    """Read one integer file; ``(value, None)`` or ``(None, reason)`` (``"missing"`` if absent)."""
    text, why = read_text(path)
    if text is None:
        return None, why
    return parse_int(text)


def list_dir(path: Path) -> list[str]:
    """Sorted entry names, or [] when the directory is absent or unreadable."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def natural_key(name: str) -> tuple:
    """Sort ``2`` before ``10`` (ports, GID indices, priorities)."""
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def read_counter_dir(directory: Path, source: str, skip: frozenset[str] = frozenset()):
    """Read every file of a counter directory (``statistics/``, ``hw_counters/``...).

    Returns ``(values, errors, present)``: ``values`` holds the parsed integers, ``errors`` a
    :class:`~collectors.sample.CollectError` per file that could not be parsed (the rest are
    still collected), ``present`` is False when the directory does not exist. Values the kernel
    prints as ``N/A`` (``N/A (no PMA)``, drivers without the counter) are absent, not errors.
    """
    from collectors.sample import CollectError

    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return {}, [], False
    except OSError as exc:
        return {}, [CollectError(source, str(directory), f"unreadable: {exc.strerror}")], True
    values: dict[str, int] = {}
    errors: list[CollectError] = []
    base = str(directory)
    for name in sorted(names):
        if name in skip:
            continue
        path = f"{base}/{name}"
        text, why = read_text(path)
        if text is None:
            if why != MISSING:
                errors.append(CollectError(source, path, why, counter=name))
            continue
        if text.startswith("N/A"):
            continue
        value, why = parse_int(text)
        if value is None:
            errors.append(CollectError(source, path, why, counter=name))
        else:
            values[name] = value
    return values, errors, True


def resolve_entry(path: Path) -> Path:
    """Follow a sysfs class entry to its device directory.

    Real sysfs entries are symlinks and need nothing. Some captured fixture trees (e.g.
    tests/fixtures/trees, extracted from .ttar archives) store a symlink as a small text file
    holding the relative target (``../../devices/.../mlx5_0``); follow that when it points at an
    existing directory, otherwise return ``path`` unchanged.
    """
    if path.is_dir():
        return path
    try:
        if path.is_file() and path.stat().st_size < 4096:
            target = path.read_text().strip()
            if target.startswith(("../", "./")):
                resolved = Path(os.path.normpath(path.parent / target))
                if resolved.is_dir():
                    return resolved
    except OSError:
        pass
    return path
