"""The on-disk journal: previous values are written here before the first change (R-24).

One JSON file per transaction in ``<state_dir>/journal/``, versioned, written atomically (temp
file, fsync, rename, fsync of the directory) on every state change, so a crash leaves either the
old or the new file, never a torn one. ``state`` is ``applying`` until the last change is
verified; a journal found in ``applying`` by a later run (under the same lock) is a crash and is
rolled back. Every entry carries the netns inode it was made in.

The state dir is root's alone (issue 19): it must be owned by the user running the tuner (root)
and writable by no group or other user, or nothing is read from it (it is readable: the daemon's
page shows the tuning changes) — a daemon that could plant a
journal there would get root writes and firewall rules. Each journal is untrusted input all the
same (``journal_check``): one that fails its checks is reported in one line and left alone. The
default, ``/var/lib/wanprobe-tune``, is not the daemon's state dir (``/var/lib/wanprobe``, a
systemd DynamicUser's); docs/runbook.md explains the ownership model.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tuners.knob import Change
from wanprobe.atomic_file import atomic_write as atomic_write  # re-exported for the tuners
from wanprobe.errors import (
    TRANSIENT_WRITE_ERRNOS,
    ConfigError,
    OutputError,
    PermissionRequired,
    TuneError,
    UsageError,
    WanprobeError,
    shown,
)
from wanprobe.userfiles import check_path_text, read_json

JOURNAL_VERSION = 1
DEFAULT_STATE_DIR = Path("/var/lib/wanprobe-tune")  # wanprobe-tune.service's StateDirectory=
DEFAULT_SYSCTL_D = Path("/etc/sysctl.d")
# entry status: pending (not touched) -> writing (a write may have happened) -> written
# -> restored / skipped (rollback left it, with a note)
TOUCHED = ("writing", "written")


def state_dir_from(option: str | Path | None) -> Path:
    """``--state-dir`` wins, then ``$WANPROBE_STATE_DIR``, then /var/lib/wanprobe-tune; one
    that is not a directory (and cannot become one) is bad input, exit 2 naming where it came
    from (``--state-dir /etc/passwd`` was exit 6 "File exists", issue 37)."""
    if option:
        return _directory(option, "--state-dir")
    env = os.environ.get("WANPROBE_STATE_DIR")
    return _directory(env, "$WANPROBE_STATE_DIR") if env else DEFAULT_STATE_DIR


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


def sysctl_dirs_from(option: str | Path | None) -> tuple[Path, ...]:
    """The sysctl.d directories a journal's persist file may be in: ``--sysctl-d`` and
    ``$WANPROBE_SYSCTL_D`` (or /etc/sysctl.d)."""
    env = os.environ.get("WANPROBE_SYSCTL_D")
    dirs = [_directory(option, "--sysctl-d")] if option else []
    return tuple(dict.fromkeys([*dirs, Path(env) if env else DEFAULT_SYSCTL_D]))


def _directory(path: str | Path, what: str) -> Path:
    """``path`` checked as a directory that is, or can be made (its nearest existing ancestor
    is a directory): one UsageError line otherwise."""
    p = check_path_text(path, what)
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"{what} {shown(str(p))}: {shown(str(probe))} is not a directory")
    return p


def check_private(path: Path, what: str) -> None:
    """ConfigError unless ``path`` is owned by this user (root for root) and not writable by a
    group or others: where root reads what to write, nobody else may write."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror}") from None
    if st.st_uid != os.geteuid():
        raise ConfigError(f"{what} {path} is owned by uid {st.st_uid}, not {os.geteuid()}; "
                          "the tuner reads plans and journals only from a directory of its own "
                          "(docs/runbook.md: state directories)")
    if st.st_mode & 0o022:
        raise ConfigError(f"{what} {path} is writable by group or others (mode "
                          f"{st.st_mode & 0o777:o}); chmod go-w it")


def _dir_error(exc: OSError, what: str) -> WanprobeError:
    """The one-line error for a state dir or journal that cannot be written: a full, read-only
    or failing filesystem is exit 74 (README "Exit codes": a state file could not be written;
    it may pass by itself), a file where a directory should be is bad input (exit 2), anything
    else a failed tune step (exit 6)."""
    reason = exc.strerror or str(exc)
    if exc.errno in TRANSIENT_WRITE_ERRNOS:
        return OutputError(f"cannot write {what}: {reason}")
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        where = shown(str(exc.filename)) if exc.filename else "a path in it"
        return ConfigError(f"cannot use {what}: {where} is not a directory ({reason})")
    return TuneError(f"cannot write {what}: {reason}")


class JournalStore:
    """The journal directory of one state dir, guarded by an exclusive flock. ``refused``
    maps the id of each journal that failed its checks to the one-line reason."""

    def __init__(self, state_dir: Path, *, sysctl_dirs: tuple[Path, ...] | None = None,
                 permitted: Any = None) -> None:
        from wanprobe.probe.access import DscpPolicy

        self.state_dir = Path(state_dir)
        self.dir = self.state_dir / "journal"
        self.sysctl_dirs = sysctl_dirs or sysctl_dirs_from(None)
        self.permitted = permitted or DscpPolicy()
        self.refused: dict[str, str] = {}
        self.reported: set[str] = set()  # refused ids already told to the user

    def check_dirs(self) -> None:
        """The state dir and its journal dir are this user's own (``check_private``)."""
        check_private(self.state_dir, "tuner state dir")
        check_private(self.dir, "tuner journal dir")

    @contextmanager
    def locked(self) -> Iterator[JournalStore]:
        """Serialise tune runs sharing the state dir; a crashed holder's lock dies with it."""
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
            self.check_dirs()
            self.dir.mkdir(exist_ok=True, mode=0o755)
            self.check_dirs()
            fd = os.open(self.state_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except PermissionError:
            raise PermissionRequired(f"cannot write state dir {self.state_dir} (root needed, "
                                     "or --state-dir / WANPROBE_STATE_DIR)") from None
        except OSError as exc:
            raise _dir_error(exc, f"state dir {shown(str(self.state_dir))}") from None
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
            atomic_write(self.path(journal.id), json.dumps(journal.to_json(), indent=1) + "\n", 0o644)
        except OSError as exc:
            raise _dir_error(exc, f"journal in {shown(str(self.dir))}") from None
        return journal

    def load(self, jid: str) -> Journal:
        """The journal ``jid``, checked as untrusted input (``journal_check``) before anything
        acts on it; ConfigError (one line) when it is absent or refused."""
        from tuners import journal_check

        path = self.path(jid)
        self.check_dirs()
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise ConfigError(f"no journal {jid!r} in {self.dir}") from None
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise ConfigError(f"journal {jid!r} refused, left alone: not a regular file of "
                              "this user's, writable by it only")
        try:
            doc = read_json(path, f"journal {jid!r}")
            journal_check.check(doc, jid=jid, sysctl_dirs=self.sysctl_dirs,
                                permitted=self.permitted)
            return Journal.from_json(doc)
        except ConfigError as exc:
            raise ConfigError(f"journal {jid!r} refused, left alone: "
                              f"{str(exc).removeprefix(f'journal {jid!r}: ')}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"journal {jid!r} refused, left alone: corrupt: {exc}") from None

    def all(self) -> list[Journal]:
        """Every journal that passes its checks, oldest first (ids sort by time); the others
        are in ``refused``."""
        self.check_dirs()
        out = []
        for p in sorted(self.dir.glob("*.json")):
            try:
                out.append(self.load(p.stem))
            except ConfigError as exc:
                self.refused[p.stem] = str(exc)
        return out
