"""The on-disk journal: previous values are written here before the first change (R-24).

One JSON file per transaction in ``<state_dir>/journal/``, versioned, written atomically (temp
file, fsync, rename, fsync of the directory) on every state change, so a crash leaves either the
old or the new file, never a torn one. ``state`` is ``applying`` until the last change is
verified; a journal found in ``applying`` by a later run (under the same lock) is a crash and is
rolled back. Every entry carries the netns inode it was made in.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tuners.knob import Change
from wanprobe.atomic_file import atomic_write  # noqa: F401 - re-exported for the tuners
from wanprobe.errors import ConfigError, PermissionRequired, TuneError
from wanprobe.userfiles import check_path_text, read_json

JOURNAL_VERSION = 1
DEFAULT_STATE_DIR = Path("/var/lib/wanprobe")
# entry status: pending (not touched) -> writing (a write may have happened) -> written
# -> restored / skipped (rollback left it, with a note)
TOUCHED = ("writing", "written")


def state_dir_from(option: str | Path | None) -> Path:
    """``--state-dir`` wins, then ``$WANPROBE_STATE_DIR``, then /var/lib/wanprobe."""
    if option:
        return check_path_text(option, "--state-dir")
    env = os.environ.get("WANPROBE_STATE_DIR")
    return check_path_text(env, "$WANPROBE_STATE_DIR") if env else DEFAULT_STATE_DIR


@dataclass(frozen=True)
class Entry:
    change: Change
    status: str = "pending"
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**self.change.to_json(), "status": self.status, "note": self.note}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Entry:
        return cls(Change.from_json(d), str(d.get("status", "pending")), str(d.get("note", "")))


@dataclass(frozen=True)
class Journal:
    id: str
    state: str  # applying | applied | failed | recovered | rolled_back | rollback_incomplete
    netns_inode: int
    netns_cookie: int | None
    host_id: str
    plan_id: str
    created_at: str
    entries: tuple[Entry, ...]
    pid: int = 0
    persist: dict[str, Any] = field(default_factory=dict)  # {"path", "previous"} when --persist
    message: str = ""
    updated_at: str = ""
    version: int = JOURNAL_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"journal_version": self.version, "id": self.id, "state": self.state,
                "netns_inode": self.netns_inode, "netns_cookie": self.netns_cookie,
                "host_id": self.host_id, "plan_id": self.plan_id, "created_at": self.created_at,
                "updated_at": self.updated_at, "pid": self.pid, "persist": self.persist,
                "message": self.message, "entries": [e.to_json() for e in self.entries]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Journal:
        if d.get("journal_version") != JOURNAL_VERSION:
            raise ConfigError(f"journal {d.get('id')!r}: unsupported version {d.get('journal_version')!r}")
        return cls(id=d["id"], state=d["state"], netns_inode=int(d["netns_inode"]),
                   netns_cookie=d.get("netns_cookie"), host_id=d.get("host_id", ""),
                   plan_id=d.get("plan_id", ""), created_at=d.get("created_at", ""),
                   entries=tuple(Entry.from_json(e) for e in d.get("entries", [])),
                   pid=int(d.get("pid", 0)), persist=dict(d.get("persist") or {}),
                   message=d.get("message", ""), updated_at=d.get("updated_at", ""))

    def with_entry(self, i: int, **kw: Any) -> Journal:
        entries = list(self.entries)
        entries[i] = replace(entries[i], **kw)
        return replace(self, entries=tuple(entries))

    def belongs_to(self, inode: int, cookie: int | None) -> bool:
        """Same namespace: same inode, and the same cookie when both sides know it."""
        if self.netns_inode != inode:
            return False
        return self.netns_cookie is None or cookie is None or self.netns_cookie == cookie


class JournalStore:
    """The journal directory of one state dir, guarded by an exclusive flock."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.dir = self.state_dir / "journal"

    @contextmanager
    def locked(self) -> Iterator[JournalStore]:
        """Serialise tune runs sharing the state dir; a crashed holder's lock dies with it."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.state_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        except PermissionError:
            raise PermissionRequired(f"cannot write state dir {self.state_dir} (root needed, "
                                     "or --state-dir / WANPROBE_STATE_DIR)") from None
        except OSError as exc:
            raise TuneError(f"cannot use state dir {self.state_dir}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield self
        finally:
            os.close(fd)

    @staticmethod
    def new_id() -> str:
        t = time.time_ns()  # ids sort by creation time (nanoseconds), then a random tail
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(t // 10**9))
        return f"{stamp}.{t % 10**9:09d}-{secrets.token_hex(2)}"

    def path(self, jid: str) -> Path:
        if not jid or "/" in jid or jid.startswith("."):
            raise ConfigError(f"bad journal id {jid!r}")
        return self.dir / f"{jid}.json"

    def save(self, journal: Journal) -> Journal:
        journal = replace(journal, updated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        try:
            atomic_write(self.path(journal.id), json.dumps(journal.to_json(), indent=1) + "\n", 0o600)
        except OSError as exc:
            raise TuneError(f"cannot write journal in {self.dir}: {exc.strerror}") from None
        return journal

    def load(self, jid: str) -> Journal:
        path = self.path(jid)
        if not path.is_file():
            raise ConfigError(f"no journal {jid!r} in {self.dir}")
        try:
            return Journal.from_json(read_json(path, f"journal {jid!r}"))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"journal {jid!r} is corrupt: {exc}") from None

    def all(self) -> list[Journal]:
        """Every readable journal, oldest first (ids sort by time)."""
        out = []
        for p in sorted(self.dir.glob("*.json")):
            try:
                out.append(self.load(p.stem))
            except ConfigError:
                continue
        return out
