"""Apply a plan as a transaction; roll back, recover and report drift, per network namespace.

Order of events (tcp-tuning.md R-24..R-26): validate everything (one line, nothing written) →
recover any journal a crashed run left in ``applying`` here → read the live value of every key →
journal them (atomic, fsync) → per change: mark ``writing``, write, read back and compare →
``applied``. A failure midway restores what was touched in reverse order and raises one line.
Rollback leaves a value someone else changed since (drift) alone and says so (do not fight).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tuners.journal import TOUCHED, Entry, Journal, JournalStore, atomic_write
from tuners.knob import Change, Skip, Tuner
from tuners.netns import current_cookie, current_inode
from tuners.plan import Plan, check_host, now_iso
from wanprobe.errors import ConfigError, OutputError, TuneError, WanprobeError

PERSIST_NAME = "90-wanprobe.conf"


@dataclass(frozen=True)
class Prepared:
    """Changes bound to this namespace's live values, and what was dropped and why."""

    changes: tuple[Change, ...]
    skipped: tuple[Skip, ...]


def prepare(plan: Plan, tuners: Mapping[str, Tuner], *, host_id: str) -> Prepared:
    """Validate the whole plan against this host and namespace before anything is written."""
    check_host(plan, host_id)
    inode = current_inode()
    bound, skipped = [], []
    for c in plan.changes:
        tuner = tuners.get(c.tuner)
        if tuner is None:
            raise ConfigError(f"tuner {c.tuner!r} is not available here (key {c.key!r})")
        unavailable = getattr(tuner, "unavailable", None)
        why = unavailable(c.key) if unavailable is not None and not plan.host_id else None
        if why is not None:  # a plan made elsewhere: skipped here as a local plan would skip it
            skipped.append(Skip(c.tuner, c.key, why))
            continue
        tuner.validate(c)
        lowers = getattr(tuner, "lowers_admin_value", None)
        if lowers is not None and lowers(c.key, c.new):
            skipped.append(Skip(c.tuner, c.key, f"live {tuner.current(c.key)} is higher than "
                                f"{c.new}; an administrator's higher value is never lowered"))
            continue
        live = tuner.current(c.key)
        if tuner.verify(c.key, c.new):
            skipped.append(Skip(c.tuner, c.key, f"already {live}"))
            continue
        bound.append(replace(c, old=live, netns_inode=inode))
    return Prepared(tuple(bound), tuple(skipped))


class RollbackIncomplete(TuneError):
    """A rollback that left keys as they are (changed by someone else since, or a restore that
    failed). ``journal`` rides along, each entry's status and note saying what happened to its
    key, so the command can print every key before the one error line (exit 6)."""

    def __init__(self, message: str, *, journal: Journal | None = None) -> None:
        super().__init__(message)
        self.journal = journal


ALREADY_OLD = "already at the old value; nothing written"
UNRECORDED = ("; the journal on disk lags behind (the next `tune` run with room on the disk "
              "brings it up to date)")


def _kept(store: JournalStore, journal: Journal, unsaved: list[WanprobeError]) -> Journal:
    """``store.save(journal)``, except that a journal the disk cannot take (full, read-only:
    journal._dir_error) does not stop a restore: the settings go back all the same, and the
    error waits in ``unsaved`` for the one line at the end (:func:`_unsaved_error`). The
    journal left on disk is older, never torn; its old values are still right."""
    try:
        return store.save(journal)
    except WanprobeError as exc:
        unsaved.append(exc)
        return journal


def _unsaved_error(message: str, unsaved: list[WanprobeError],
                   tail: str = UNRECORDED) -> WanprobeError:
    """The error of a restore whose journal writes failed: the first write error's kind (a
    full disk is exit 74), ``message`` saying what was done to the settings."""
    return type(unsaved[0])(f"{message}, but {unsaved[0]}{tail}")


def _restore(journal: Journal, tuners: Mapping[str, Tuner], store: JournalStore,
             *, force: bool = False,
             unsaved: list[WanprobeError] | None = None) -> tuple[Journal, list[str]]:
    """Undo touched entries in reverse order; returns the journal and one note per problem.

    Every entry this acts on gets a note of its own outcome, never one left from an earlier run
    (a retry with --force once printed "restored ... (left alone)"). An entry an earlier
    rollback left alone is tried again: without ``force`` it is still left alone while its key
    differs from what the plan set, so a retry never reports a partial rollback as complete.
    A journal write that fails goes to ``unsaved`` and the restore goes on (:func:`_kept`)."""
    problems: list[str] = []
    unsaved = [] if unsaved is None else unsaved

    def save(j: Journal) -> Journal:
        return _kept(store, j, unsaved)

    for i in reversed(range(len(journal.entries))):
        entry = journal.entries[i]
        if entry.status not in (*TOUCHED, "skipped"):
            continue
        c = entry.change
        tuner = tuners.get(c.tuner)
        if tuner is None:
            journal = save(journal.with_entry(i, note=f"tuner {c.tuner} unavailable here"))
            problems.append(f"{c.key}: tuner {c.tuner} unavailable")
            continue
        try:
            live = tuner.current(c.key)
            if tuner.verify(c.key, c.old):
                journal = save(journal.with_entry(i, status="restored", note=ALREADY_OLD))
                continue
            drifted = entry.status in ("written", "skipped") and not tuner.verify(c.key, c.new)
            if drifted and not force:
                note = f"changed by someone else since (live {live!r}); left alone"
                journal = save(journal.with_entry(i, status="skipped", note=note))
                problems.append(f"{c.key}: {note}")
                continue
            tuner.rollback(c)
            if not tuner.verify(c.key, c.old):
                raise TuneError(f"reads {tuner.current(c.key)!r} after restoring {c.old!r}")
            note = f"--force: over live {live!r}, changed by someone else since" if drifted else ""
            journal = save(journal.with_entry(i, status="restored", note=note))
        except (WanprobeError, OSError) as exc:
            journal = save(journal.with_entry(i, note=f"restore failed: {exc}"))
            problems.append(f"{c.key}: {exc}")
    if journal.persist.get("path"):
        try:
            _unpersist(journal.persist)
        except OSError as exc:
            problems.append(f"persist file {journal.persist['path']}: {exc.strerror}")
    return journal, problems


def recover(store: JournalStore, tuners: Mapping[str, Tuner]) -> list[Journal]:
    """Roll back journals a crashed run left in ``applying`` in this namespace (call locked)."""
    inode, cookie = current_inode(), current_cookie()
    done = []
    for j in store.all():
        if j.state == "applying" and j.belongs_to(inode, cookie):
            unsaved: list[WanprobeError] = []
            j, problems = _restore(j, tuners, store, force=True, unsaved=unsaved)
            msg = "recovered after an interrupted apply" + (f"; {'; '.join(problems)}" if problems else "")
            state = "recovered" if not problems else "rollback_incomplete"
            j = _kept(store, replace(j, state=state, message=msg), unsaved)
            if unsaved:
                raise _unsaved_error(f"rolled back the interrupted apply {j.id}", unsaved)
            done.append(j)
    return done


def _persist(path: Path, changes: tuple[Change, ...], previous: str | None) -> None:
    """Merge our sysctl lines into the dedicated file (R-27); written atomically."""
    lines: dict[str, str] = {}
    for line in (previous or "").splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";")):
            k, v = line.split("=", 1)
            lines[k.strip()] = v.strip()
    for c in changes:
        if c.tuner == "sysctl":
            lines[c.key] = c.new
    body = "".join(f"{k} = {v}\n" for k, v in lines.items())
    atomic_write(path, "# written by wanprobe tune apply --persist; removed by wanprobe tune rollback\n" + body)


def _unpersist(persist: dict[str, Any]) -> None:
    path, previous = Path(persist["path"]), persist.get("previous")
    if previous is None:
        if path.exists():  # never written (e.g. the failure was writing it): nothing to undo
            path.unlink()
    else:
        atomic_write(path, previous)


def apply_plan(plan: Plan, tuners: Mapping[str, Tuner], store: JournalStore, *, host_id: str,
               persist_dir: Path | None = None,
               fault: Callable[[int, Change], None] | None = None) -> tuple[Journal | None, Prepared]:
    """Apply ``plan`` here as a transaction. ``fault(i, change)`` is a test hook run before write i.
    Returns (None, prepared) when every change is already in place (no journal is written)."""
    if persist_dir is not None:  # the configured sysctl.d of this apply: its journal names it
        store.sysctl_dirs = tuple(dict.fromkeys([*store.sysctl_dirs, Path(persist_dir)]))
    with store.locked():
        recover(store, tuners)
        prep = prepare(plan, tuners, host_id=host_id)
        if not prep.changes:
            return None, prep
        try:  # the journal, with every old value, is on disk before the first write
            journal = store.save(Journal(
                id=store.new_id(), state="applying", netns_inode=current_inode(),
                netns_cookie=current_cookie(), host_id=host_id, plan_id=plan.id,
                created_at=now_iso(), entries=tuple(Entry(c) for c in prep.changes),
                pid=os.getpid()))
        except WanprobeError as exc:
            raise type(exc)(f"{exc}; nothing changed") from None
        where = ""
        try:
            for step, c in enumerate(prep.changes):
                where = f"step {step + 1}/{len(prep.changes)} {c.tuner} {c.key}"
                journal = store.save(journal.with_entry(step, status="writing"))
                if fault is not None:
                    fault(step, c)
                tuner = tuners[c.tuner]
                tuner.apply(c)
                if not tuner.verify(c.key, c.new):
                    raise TuneError(f"verify failed: reads {tuner.current(c.key)!r} after writing {c.new!r}")
                journal = store.save(journal.with_entry(step, status="written"))
            if persist_dir is not None and any(c.tuner == "sysctl" for c in prep.changes):
                path = Path(persist_dir) / PERSIST_NAME
                where = f"persisting to {path}"
                previous = path.read_text() if path.exists() else None
                journal = store.save(replace(journal, persist={"path": os.fspath(path), "previous": previous}))
                _persist(path, prep.changes, previous)
            where = "recording the apply"  # a journal left "applying" is rolled back as a crash
            journal = store.save(replace(journal, state="applied"))
        except (WanprobeError, OSError) as exc:
            _roll_back_failed(journal, tuners, store, f"apply failed at {where}: {exc}", exc)
    return journal, prep


def _roll_back_failed(journal: Journal, tuners: Mapping[str, Tuner], store: JournalStore,
                      why: str, exc: Exception) -> None:
    """Undo a failed apply and raise its one line: exit 74 when the journal could not be
    written (a full or read-only disk, README "Exit codes"), else exit 6. The settings go back
    even when the journal cannot record it (:func:`_kept`), so a full disk never leaves a plan
    half-applied."""
    unsaved: list[WanprobeError] = []
    journal, problems = _restore(journal, tuners, store, force=True, unsaved=unsaved)
    restored = sum(1 for e in journal.entries if e.status == "restored" and not e.note)
    tail = f"; restore problems: {'; '.join(problems)}" if problems else ""
    msg = f"{why}; rolled back ({restored} restored){tail}"
    _kept(store, replace(journal, state="failed" if not problems else "rollback_incomplete",
                         message=msg), unsaved)
    if isinstance(exc, OutputError):
        raise OutputError(msg + (UNRECORDED if unsaved else "")) from None
    if unsaved:
        raise _unsaved_error(msg, unsaved) from None
    raise TuneError(msg) from None


def _here(journals: list[Journal]) -> list[Journal]:
    inode, cookie = current_inode(), current_cookie()
    return [j for j in journals if j.belongs_to(inode, cookie)]


def rollback(store: JournalStore, tuners: Mapping[str, Tuner], jid: str | None = None,
             *, force: bool = False) -> Journal:
    """Undo the latest applied journal of this namespace (or ``jid``), newest first."""
    with store.locked():
        recover(store, tuners)
        mine = _here(store.all())
        if jid is not None:
            j = store.load(jid)
            if j.id not in {m.id for m in mine}:
                raise ConfigError(f"journal {jid} belongs to network namespace inode {j.netns_inode}, "
                                  f"this is {current_inode()}; run it there or use --netns")
        else:
            applied = [j for j in mine if j.state in ("applied", "rollback_incomplete")]
            if not applied:
                raise ConfigError(f"nothing applied to roll back in this network namespace (inode {current_inode()})")
            j = applied[-1]
        if j.state not in ("applied", "rollback_incomplete"):  # incomplete: retry what is left
            raise ConfigError(f"journal {j.id} is {j.state}, not applied; nothing to roll back")
        keys = {(e.change.tuner, e.change.key) for e in j.entries}
        for newer in mine:
            if newer.id > j.id and newer.state == "applied" and keys & {
                    (e.change.tuner, e.change.key) for e in newer.entries}:
                raise ConfigError(f"journal {newer.id} changed the same keys later; roll it back first")
        unsaved: list[WanprobeError] = []
        j, problems = _restore(j, tuners, store, force=force, unsaved=unsaved)
        state = "rolled_back" if not problems else "rollback_incomplete"
        j = _kept(store, replace(j, state=state, message="; ".join(problems)), unsaved)
        if unsaved:  # the settings went back all the same; the journal still says "applied"
            done = sum(1 for e in j.entries if e.status == "restored")
            raise _unsaved_error(f"rollback of {j.id}: {done} of {len(j.entries)} keys at their "
                                 "old values" + (f" ({'; '.join(problems)})" if problems else ""),
                                 unsaved, "; the journal still says applied until `tune "
                                 "rollback` runs again with room on the disk")
        if problems:
            hint = "" if force else " (--force restores anyway)"
            raise RollbackIncomplete(f"rollback of {j.id} incomplete: {'; '.join(problems)}{hint}",
                                     journal=j)
        return j


_SHELL_SYNTAX = ("\n", ";", "|", "&", "$", "<", ">", "`", "(")


def in_namespace(command: str, enter: Sequence[str]) -> str:
    """``command`` run through ``enter`` (``ip netns exec NAME`` / ``nsenter --net=PATH``): a plain
    command is prefixed; one with shell syntax (a heredoc, a loop) runs under ``sh -c``."""
    if not enter or command.startswith("#"):
        return command
    prefix = " ".join(shlex.quote(a) for a in enter)
    if any(tok in command for tok in _SHELL_SYNTAX):
        return f"{prefix} sh -c {shlex.quote(command)}"
    return f"{prefix} {command}"


def restore_script(journal: Journal, tuners: Mapping[str, Tuner], enter: Sequence[str] = ()) -> str:
    """The rollback of ``journal`` as paste-able shell commands, newest change first (R-25).
    ``enter`` (``tuners.netns.enter_command``) makes each act on the journal's namespace, so
    lines pasted into a host shell do not change the host."""
    where = f" in `{' '.join(enter)}`" if enter else ""
    lines = [f"# wanprobe rollback of journal {journal.id} (netns inode {journal.netns_inode}){where}"]
    for e in reversed(journal.entries):
        if e.status in TOUCHED or e.status == "skipped":  # skipped: left alone by a rollback
            cmd = getattr(tuners.get(e.change.tuner), "restore_command", None)
            lines.append(in_namespace(cmd(e.change), enter) if cmd else
                         f"# {e.change.tuner} {e.change.key}: restore {e.change.old!r}")
    if journal.persist.get("path"):
        p = journal.persist["path"]
        lines.append(f"rm -f {shlex.quote(p)}" if journal.persist.get("previous") is None
                     else f"# restore {p} from the journal")
    return "\n".join(lines) + "\n"


def latest_applied(store: JournalStore) -> Journal:
    mine = [j for j in _here(store.all()) if j.state in ("applied", "rollback_incomplete")]
    if not mine:
        raise ConfigError(f"nothing applied to roll back in this network namespace (inode {current_inode()})")
    return mine[-1]


def status(store: JournalStore, tuners: Mapping[str, Tuner]) -> list[dict[str, Any]]:
    """Per applied journal in this namespace: each key's wanted, live and drift."""
    out = []
    with store.locked():
        recovered = recover(store, tuners)
        for j in _here(store.all()):
            if j.state != "applied":
                continue
            rows = []
            for e in j.entries:
                c = e.change
                tuner = tuners.get(c.tuner)
                live = tuner.current(c.key) if tuner else None
                ok = tuner is not None and tuner.verify(c.key, c.new)
                rows.append({"tuner": c.tuner, "key": c.key, "old": c.old, "wanted": c.new,
                             "live": live, "drift": not ok})
            out.append({"journal": j.id, "plan_id": j.plan_id, "created_at": j.created_at,
                        "netns_inode": j.netns_inode, "persist": j.persist.get("path"),
                        "entries": rows, "drift": any(r["drift"] for r in rows)})
    for j in recovered:
        out.append({"journal": j.id, "recovered": True, "message": j.message, "entries": [],
                    "drift": False})
    return out
