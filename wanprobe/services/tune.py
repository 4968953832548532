"""The tune service: plan → apply → verify → roll back, composed once (``wanprobe tune`` renders
what it returns; the demo and the tune check drive it through that command in each lab
namespace, as an operator would).

:class:`TuneSession` binds the tuners of this network namespace (``--netns`` entered first) to
the journal store; every step that may act first finishes the rollback of an apply that crashed
here, so plans are made from, and applies start at, the real originals. Messages for the user
(a recovered apply, a journal refused by its checks, a plan's unknowns) come back as lines; the
caller prints them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from wanprobe.errors import ConfigError, UsageError, WanprobeError
from wanprobe.safe_text import clean
from wanprobe.userfiles import check_output_path, existing_dir

if TYPE_CHECKING:
    from tuners.journal import Entry, Journal, JournalStore
    from tuners.knob import Tuner
    from tuners.plan import Plan
    from tuners.transaction import Prepared
    from wanprobe.diagnose.verify import Verification

Say = Callable[[str], None]   # one line for stderr


class Method(TypedDict):
    """How a rate test measured (``verify_path``'s keywords of the same names)."""

    duration_s: float
    omit_s: float


@dataclass
class Applied:
    """What ``apply`` did: the journal (None: nothing to change), the preparation (its skipped
    changes) and the verify loop's answer (None without --verify, or when it could not measure)."""

    journal: Journal | None
    prep: Prepared
    checked: Verification | None = None

    def to_json(self) -> dict[str, Any]:
        return {"journal": self.journal.to_json() if self.journal else None,
                "skipped": [s.to_json() for s in self.prep.skipped],
                "verify": self.checked.to_json() if self.checked else None}


@dataclass
class TuneSession:
    """The tuners and the journal store of this namespace. ``say`` receives the one-line
    messages (stderr in the CLI)."""

    tuners: dict[str, Tuner]
    store: JournalStore
    say: Say = field(default=lambda line: None)

    @classmethod
    def open(cls, *, netns: str | None, proc_root: str, sys_root: str, state_dir: str | None,
             sysctl_d: str | None = None, allow_nc_dscp: bool = False,
             say: Say = lambda line: None) -> TuneSession:
        from tuners import netns as ns
        from tuners.journal import JournalStore, state_dir_from, sysctl_dirs_from
        from tuners.registry import build_tuners, dscp_policy

        proc, sys_ = existing_dir(proc_root, "--proc-root"), existing_dir(sys_root, "--sys-root")
        if netns is not None:  # --netns "" is refused (tuners.netns.enter), never "here"
            ns.enter(netns)
        nft = os.environ.get("WANPROBE_NFT", "nft")
        permitted = dscp_policy(allow_network_control=allow_nc_dscp)  # the tuner's and the store's
        tuners = build_tuners(proc, sys_, nft=nft or None, permitted=permitted)
        store = JournalStore(state_dir_from(state_dir), sysctl_dirs=sysctl_dirs_from(sysctl_d),
                             permitted=permitted)
        return cls(tuners, store, say)

    # -- the journal store ----------------------------------------------------------------
    def report_refused(self) -> None:
        """One line per journal that failed its checks (left alone), once per session."""
        for jid, why in sorted(self.store.refused.items()):
            if jid not in self.store.reported:
                self.store.reported.add(jid)
                self.say(f"wanprobe: warning: {clean(why)}")

    def recover(self) -> None:
        """Finish the rollback of an apply that crashed in this namespace; say so."""
        from tuners import transaction

        if self.store.dir.is_dir():
            with self.store.locked():
                for j in transaction.recover(self.store, self.tuners):
                    self.say(f"wanprobe: {clean(j.message)} (journal {j.id})")
        self.report_refused()

    def interrupted(self) -> list[str]:
        """Ids of applies in this namespace that crashed half-way (rolled back by the next
        acting command)."""
        from tuners.netns import current_cookie, current_inode

        if not self.store.dir.is_dir():
            return []
        inode, cookie = current_inode(), current_cookie()
        return [j.id for j in self.store.all()
                if j.state == "applying" and j.belongs_to(inode, cookie)]

    # -- plan → apply → verify → rollback ---------------------------------------------------
    def plan(self, report: str, side: str) -> Plan:
        """A validated plan from the report's findings for ``side`` (local | peer)."""
        from collectors.route import local_addresses
        from tuners.from_report import build_plan, check_capacity, load_report
        from tuners.plan import host_id

        self.recover()
        data = load_report(report)
        check_capacity(data, report)
        plan = build_plan(data, self.tuners, host_id=host_id(), report_path=Path(report),
                          side=side, local_addresses=local_addresses())
        for note in plan.unknown:
            self.say(f"wanprobe: note: this plan could not know {note}")
        return plan

    def dry_run(self, plan: Plan) -> Prepared:
        """The plan prepared against the live values (its changes and skips); nothing changes."""
        from tuners import plan as plan_mod
        from tuners import transaction

        for jid in self.interrupted():
            self.say(f"wanprobe: note: apply {jid} was interrupted here; the next `tune apply "
                     "--yes`, `rollback` or `status` rolls it back first")
        return transaction.prepare(plan, self.tuners, host_id=plan_mod.host_id())

    def apply(self, plan: Plan, *, persist_dir: Path | None = None, verify: str | None = None,
              hmac_key: bytes | None = None) -> Applied:
        """Apply ``plan`` as a transaction (journal first, each value verified, undone on
        failure); with ``verify`` re-measure the path to that peer (services/verify.py) by the
        method of the test the plan was made from (:func:`source_method`)."""
        from tuners import plan as plan_mod
        from tuners import transaction

        self.recover()
        journal, prep = transaction.apply_plan(plan, self.tuners, self.store,
                                               host_id=plan_mod.host_id(), persist_dir=persist_dir)
        return Applied(journal, prep, self.verify(verify, hmac_key, source_method(plan)))

    def verify(self, peer: str | None, hmac_key: bytes | None = None,
               method: Method | None = None) -> Verification | None:
        """The closed loop after an apply (None without a peer, or when it could not measure:
        the plan is applied and journalled; only the re-measure failed, said in one line).
        ``method``: the before test's ``duration_s`` and ``omit_s``, so before and after are
        measured alike (issue 36); verify_path's own defaults without it."""
        if not peer:
            return None
        from wanprobe.services.verify import verify_path

        try:
            if method is None:
                return verify_path(peer, hmac_key=hmac_key)
            return verify_path(peer, hmac_key=hmac_key, **method)
        except WanprobeError as exc:
            self.say(f"wanprobe: applied, but --verify could not measure {peer}: {exc}")
            return None

    def rollback(self, journal_id: str | None, *, force: bool = False) -> Journal:
        """The journal rolled back; tuners.transaction.RollbackIncomplete (a TuneError, exit 6)
        carrying the journal when a key was left as it is (see :func:`outcome`)."""
        from tuners import transaction

        if journal_id:
            self.store.reported.add(journal_id)  # refused, it is the error line itself
        self.recover()
        return transaction.rollback(self.store, self.tuners, journal_id, force=force)

    def restore_script(self, journal_id: str | None, netns: str | None) -> str:
        """The rollback as shell commands; nothing changes."""
        from tuners import transaction
        from tuners.netns import enter_command

        if journal_id:
            self.store.reported.add(journal_id)
        j = self.store.load(journal_id) if journal_id else transaction.latest_applied(self.store)
        return transaction.restore_script(j, self.tuners, enter_command(j.netns_inode, netns))

    def status(self) -> list[dict[str, Any]]:
        from tuners import transaction

        rows = transaction.status(self.store, self.tuners)
        self.report_refused()
        return rows


def outcome(entry: Entry) -> str:
    """What a rollback did to one journal entry's key, as one line: restored (over a value
    someone else set, with --force), already at its old value, or not restored and why. The
    words come from the entry's status and the note the rollback wrote for it
    (tuners.transaction._restore), never from a note of an earlier run."""
    from tuners.transaction import ALREADY_OLD

    c = entry.change
    what = f"{c.tuner} {c.key}"
    if entry.status == "restored":
        if entry.note == ALREADY_OLD:
            return f"unchanged {what} = {c.old} (already at its old value)"
        return f"restored {what} = {c.old}" + (f" ({entry.note})" if entry.note else "")
    if entry.status == "pending":
        return f"untouched {what}: the apply never wrote it"
    return f"NOT restored {what} (old value {c.old}): {entry.note or 'not attempted'}"


def drift_error(rows: list[dict[str, Any]]) -> WanprobeError | None:
    """The exit-9 error of ``tune status`` when a live value differs from what an applied plan
    set (errors.DriftFound; the output is printed first), naming the drifted keys; else None."""
    from wanprobe.errors import DriftFound

    drifted = [(r["journal"], e) for r in rows for e in r.get("entries", ()) if e["drift"]]
    if not drifted:
        return None
    keys = "; ".join(f"{e['key']} live {e['live']!r}, applied {e['wanted']!r}"
                     for _j, e in drifted[:5])
    more = f" and {len(drifted) - 5} more" if len(drifted) > 5 else ""
    journals = sorted({j for j, _e in drifted})
    return DriftFound(f"drift: {len(drifted)} setting(s) of journal {', '.join(journals)} differ "
                      f"from the applied plan: {keys}{more} (`tune apply` the plan again, or "
                      "`tune rollback`)")


def persist_dir(persist: bool, sysctl_d: str | None) -> Path | None:
    """Where ``--persist`` writes, refused from a container's namespace without its own
    directory (it would write the host's /etc/sysctl.d)."""
    from tuners.netns import is_init_netns

    if not persist:
        return None
    chosen = sysctl_d or os.environ.get("WANPROBE_SYSCTL_D")
    if not chosen and not is_init_netns():
        raise ConfigError("--persist from a non-init network namespace would write the host's "
                          "/etc/sysctl.d; pass --sysctl-d for this container's own directory")
    return Path(chosen or "/etc/sysctl.d")


def source_method(plan: Plan) -> Method | None:
    """How the plan's source report measured the forward rate (``duration_s``, ``omit_s``: the
    diagnose TCP test sized from the path, ramp-up left out), for the verify to measure the
    same way; None when the report is not readable or its test left no ramp-up out (a
    report from before 1.2), and the verify keeps its own (the picture then says "different
    methods")."""
    from wanprobe.report.codec import parts_of
    from wanprobe.report.document import load_json

    path = (plan.source_report or {}).get("path")
    if not path:
        return None
    try:
        tput = parts_of(load_json(path))[0].throughput
    except WanprobeError:
        return None
    duration, omit = (tput.requested_duration_s, tput.omit_s) if tput else (None, None)
    if duration is None or omit is None or not 0 < omit < duration <= 60:
        return None
    return {"duration_s": duration, "omit_s": omit}


def source_report(plan: Plan, out: str, verify: str | None) -> dict[str, Any]:
    """The report ``plan`` was made from, read and checked before anything changes: it must be
    the same file (its digest) the plan recorded."""
    from tuners.plan import report_ref
    from wanprobe.report.document import load_json

    if not verify:
        raise UsageError("--report-out needs --verify PEER: it writes the report with the verify")
    check_output_path(out, "--report-out")
    ref = plan.source_report or {}
    if not ref.get("path"):
        raise ConfigError("--report-out: the plan names no source report (made by hand?)")
    doc = load_json(ref["path"])
    if ref.get("sha256_16") and report_ref(Path(ref["path"]), doc)["sha256_16"] != ref["sha256_16"]:
        raise ConfigError(f"--report-out: the report {clean(str(ref['path']))} changed since the "
                          "plan was made from it")
    return doc


def write_verified_report(doc: dict[str, Any], checked: Verification | None, out: str,
                          say: Say) -> None:
    """The source report with ``measurements.verify`` (diagnose/verify.Verification), validated
    and written; nothing when the re-measure failed (said in one line)."""
    from wanprobe.report.document import Report, save, with_measurement

    if checked is None:
        say(f"wanprobe: --report-out {clean(out)} not written: no verify result")
        return
    doc = with_measurement(doc, "verify", checked.to_json())
    try:   # as diagnose -o writes reports; a failed write is one line
        save(Report.from_json(doc), out)
    except WanprobeError as exc:
        raise type(exc)(f"applied and verified (see `tune status`), but {exc}") from None
