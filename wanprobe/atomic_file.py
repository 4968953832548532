"""The one atomic file writer: a temp name in the target's directory, fsync, rename, and the temp
file removed when anything fails (client_python's ``write_to_textfile`` pattern; rename(2) is
atomic within one filesystem, and fsync of the file then of the directory makes the new name
survive a crash, as ext4/xfs document for the write-temp-then-rename idiom)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: str | Path, data: str | bytes, mode: int = 0o644) -> Path:
    """Replace ``path`` with ``data`` (text as UTF-8) so a reader sees the old or the new file,
    never half of one. Creates missing parent directories; raises OSError on failure."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return path
