"""CLI: ``wanprobe tune plan|apply|rollback|status`` — a thin shell over ``tuners``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from wanprobe.commands.options import Netns, ReflectorKeyFile
from wanprobe.safe_text import SafeConsole
from wanprobe.userfiles import check_output_path

app = typer.Typer(name="tune", help="Plan, apply (as a transaction), roll back and check host tuning.",
                       no_args_is_help=True)
console = SafeConsole(highlight=False, soft_wrap=True)

StateDir = Annotated[str | None, typer.Option("--state-dir", help="Journal directory, root's own (default $WANPROBE_STATE_DIR or /var/lib/wanprobe-tune).")]
ProcRoot = Annotated[str, typer.Option("--proc-root", hidden=True)]
SysRoot = Annotated[str, typer.Option("--sys-root", hidden=True)]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]
SysctlD = Annotated[str | None, typer.Option(
    "--sysctl-d", help="sysctl.d directory of --persist (default $WANPROBE_SYSCTL_D or "
    "/etc/sysctl.d); a journal's persist file must be there.")]
AllowNcDscp = Annotated[bool, typer.Option(
    "--allow-network-control-dscp", help="Permit DSCP plans that mark DSCP 48-63 (network "
    "control, RFC 4594 §3.1; refused by default).")]


def _session(netns, proc_root, sys_root, state_dir, sysctl_d=None, allow_nc_dscp=False):
    from wanprobe.services.tune import TuneSession

    return TuneSession.open(netns=netns, proc_root=proc_root, sys_root=sys_root,
                            state_dir=state_dir, sysctl_d=sysctl_d, allow_nc_dscp=allow_nc_dscp,
                            say=_say)


def _say(line: str) -> None:
    typer.echo(line, err=True)


def _emit(doc: Any) -> None:
    typer.echo(json.dumps(doc, indent=2, default=str))


def _diff_table(rows: list[dict[str, Any]], title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("tuner", "key", "live", "new", "reason"):
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(*(escape(str(r[k])) for k in ("tuner", "key", "live", "new", "reason")))
    return t


@app.command("plan")
def plan_cmd(
    report: Annotated[str, typer.Option("--report", "-r", help="Report JSON from `wanprobe diagnose`.")],
    output: Annotated[str | None, typer.Option("--output", "-o", help="Write the plan here (- for stdout; /dev/null or a FIFO is written in place, any other device refused).")] = None,
    side: Annotated[str, typer.Option("--host", "--side", help="local: the host that ran diagnose; peer: the far end (the plan is bound to its address).")] = "local",
    netns: Netns = None, state_dir: StateDir = None, allow_nc_dscp: AllowNcDscp = False,
    sysctl_d: SysctlD = None,
    proc_root: ProcRoot = "/proc", sys_root: SysRoot = "/sys", as_json: Json = False,
) -> None:
    """Turn a report's findings into a validated plan (changes nothing, except finishing the
    rollback of an apply that crashed here, so the plan is made from the real originals)."""
    from tuners.plan import save

    if output:
        check_output_path(output, "--output")
    plan = _session(netns, proc_root, sys_root, state_dir, sysctl_d, allow_nc_dscp).plan(report, side)
    if output:
        save(plan, output)
    if output == "-":  # the plan JSON is stdout
        return
    if as_json:
        _emit(plan.to_json())
        return
    rows = [{"tuner": c.tuner, "key": c.key, "live": c.old, "new": c.new, "reason": c.reason}
            for c in plan.changes]
    console.print(_diff_table(rows, f"plan {plan.id}: {len(rows)} change(s)"))
    for s in plan.skipped:
        console.print(escape(f"  skipped {s.tuner} {s.key}: {s.reason}"))
    for m in plan.manual:
        console.print(escape(f"  manual {m.tuner} {m.key}={m.value}: {m.reason}; " + " && ".join(m.commands)))
    if output:
        console.print(f"wrote {output}; review, then `wanprobe tune apply {output}` (add --yes to change the host)")


@app.command("apply")
def apply_cmd(
    plan_file: Annotated[str, typer.Argument(help="Plan JSON from `wanprobe tune plan`.")],
    yes: Annotated[bool, typer.Option("--yes", help="Really change the host; without it: a diff only.")] = False,
    persist: Annotated[bool, typer.Option("--persist", help="Also write <sysctl.d>/90-wanprobe.conf.")] = False,
    sysctl_d: SysctlD = None,
    verify: Annotated[str | None, typer.Option("--verify", help="After applying, measure the path to this peer again (ramp-up omitted) and say what limits it now.")] = None,
    hmac_key_file: ReflectorKeyFile = None,
    report_out: Annotated[str | None, typer.Option("--report-out", help="With --verify: write the plan's report again with the verify under measurements.verify (its before/after picture: `report show --format html`).")] = None,
    netns: Netns = None, state_dir: StateDir = None, allow_nc_dscp: AllowNcDscp = False,
    proc_root: ProcRoot = "/proc", sys_root: SysRoot = "/sys", as_json: Json = False,
) -> None:
    """Show the diff, or with --yes apply the plan as a transaction (journal first, verify, undo on failure)."""
    from tuners import plan as plan_mod
    from wanprobe.services import tune
    from wanprobe.userfiles import read_hmac_key_file

    key = read_hmac_key_file(hmac_key_file)  # a bad key file is refused before anything changes
    session = _session(netns, proc_root, sys_root, state_dir, sysctl_d, allow_nc_dscp)
    plan = plan_mod.load(plan_file)
    source = tune.source_report(plan, report_out, verify) if report_out else None
    if not yes:
        _dry_run(plan, session, as_json)
        return
    done = session.apply(plan, persist_dir=tune.persist_dir(persist, sysctl_d), verify=verify,
                         hmac_key=key)
    if source is not None:
        tune.write_verified_report(source, done.checked, report_out, _say)
    if as_json:
        _emit(done.to_json())
        return
    _print_applied(done, session.store)


def _dry_run(plan, session, as_json: bool) -> None:
    """The diff of ``plan`` against the live values; nothing changes."""
    prep = session.dry_run(plan)
    rows = [{"tuner": c.tuner, "key": c.key, "live": c.old, "new": c.new, "reason": c.reason}
            for c in prep.changes]
    if as_json:
        _emit({"dry_run": True, "plan_id": plan.id, "changes": rows,
               "skipped": [s.to_json() for s in prep.skipped]})
        return
    console.print(_diff_table(rows, f"dry run of plan {plan.id}: {len(rows)} change(s), nothing changed"))
    for s in prep.skipped:
        console.print(escape(f"  skipped {s.tuner} {s.key}: {s.reason}"))
    console.print("re-run with --yes to apply")


def _print_applied(done, store) -> None:
    """What was set (each value verified), persisted, skipped, and the verify's verdict."""
    journal, prep, checked = done.journal, done.prep, done.checked
    if checked:
        _print_verify(checked)
    for s in prep.skipped:
        console.print(escape(f"  skipped {s.tuner} {s.key}: {s.reason}"))
    if journal is None:
        console.print("nothing to change: every setting of the plan is already in place")
        return
    for e in journal.entries:
        console.print(escape(f"  set {e.change.tuner} {e.change.key}: {e.change.old} -> {e.change.new} (verified)"))
    if journal.persist.get("path"):
        console.print(f"  persisted to {journal.persist['path']}")
        if Path("/etc/tuned/active_profile").exists():  # tuned may re-apply over it
            active = Path("/etc/tuned/active_profile").read_text().strip() or "?"
            console.print(f"  note: tuned profile {escape(active)} is active; with reapply_sysctl=1 it may override these")
    console.print(f"applied {len(journal.entries)} change(s); journal {journal.id} in "
                  f"{store.dir}; undo with `wanprobe tune rollback {journal.id}`")


def _print_verify(checked) -> None:
    """One line per test of the loop, then the verdict with its evidence and the next step."""
    from wanprobe.units import format_rate

    for a in checked.attempts:
        after = a.bits_per_second_after_omit
        console.print(escape(f"  verify: {a.duration_s:g} s test, {format_rate(after) if after is not None else '-'} "
                             f"after {a.omit_s:g} s of ramp-up ({format_rate(a.bits_per_second)} with it)"))
    cap = checked.capacity_bits_per_second
    console.print(escape(f"  capacity: {format_rate(cap) if cap else '-'} ({checked.capacity_source})"))
    head = "path full" if checked.path_full else f"limited by {checked.limit}"
    console.print(escape(f"  {head}: {checked.summary}; next step: {checked.next_step}"))


@app.command("rollback")
def rollback_cmd(
    journal_id: Annotated[str | None, typer.Argument(help="Journal id (default: latest applied here).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Restore values someone else changed since.")] = False,
    print_only: Annotated[bool, typer.Option("--print", help="Print the rollback as shell commands; change nothing.")] = False,
    netns: Netns = None, state_dir: StateDir = None, sysctl_d: SysctlD = None,
    allow_nc_dscp: AllowNcDscp = False,
    proc_root: ProcRoot = "/proc", sys_root: SysRoot = "/sys", as_json: Json = False,
) -> None:
    """Restore the previous values of an applied plan in this network namespace, newest first.
    Every key is listed with what happened to it; a key left as it is (changed by someone else
    since, without --force, or a restore that failed) makes the exit 6 after the list."""
    from tuners.transaction import RollbackIncomplete
    from wanprobe.services.tune import outcome

    session = _session(netns, proc_root, sys_root, state_dir, sysctl_d, allow_nc_dscp)
    if print_only:
        typer.echo(session.restore_script(journal_id, netns), nl=False)
        return
    try:
        j, partial = session.rollback(journal_id, force=force), None
    except RollbackIncomplete as exc:
        if exc.journal is None:
            raise
        j, partial = exc.journal, exc
    if as_json:
        _emit(j.to_json())
    else:
        for e in reversed(j.entries):
            console.print(escape(f"  {outcome(e)}"))
        console.print(f"rolled back journal {j.id}" if partial is None else
                      f"journal {j.id} rolled back in part: see the NOT restored keys above")
    if partial is not None:
        raise partial


@app.command("status")
def status_cmd(
    netns: Netns = None, state_dir: StateDir = None, sysctl_d: SysctlD = None,
    allow_nc_dscp: AllowNcDscp = False,
    proc_root: ProcRoot = "/proc", sys_root: SysRoot = "/sys", as_json: Json = False,
) -> None:
    """Drift between what the applied plans set and the live values in this namespace: exit 9
    when there is any (the table or JSON is printed first), 0 when every value is as applied."""
    from tuners.netns import current_inode
    from wanprobe.services.tune import drift_error

    rows = _session(netns, proc_root, sys_root, state_dir, sysctl_d, allow_nc_dscp).status()
    drift = drift_error(rows)
    if as_json:
        _emit({"netns_inode": current_inode(), "journals": rows, "drift": drift is not None})
    else:
        _print_status(rows)
    if drift is not None:
        raise drift


def _print_status(rows: list[dict[str, Any]]) -> None:
    from tuners.netns import current_inode

    if not rows:
        console.print(f"nothing applied in this network namespace (inode {current_inode()})")
    for r in rows:
        if r.get("recovered"):
            console.print(escape(f"journal {r['journal']}: {r['message']}"))
            continue
        t = Table(title=f"journal {r['journal']} (plan {r['plan_id']}, {r['created_at']})", title_justify="left")
        for col in ("tuner", "key", "wanted", "live", "state"):
            t.add_column(col, overflow="fold")
        for e in r["entries"]:
            t.add_row(*(escape(str(e[k])) for k in ("tuner", "key", "wanted", "live")),
                      "[red]drift[/]" if e["drift"] else "ok")
        console.print(t)

