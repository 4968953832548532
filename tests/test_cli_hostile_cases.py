"""Issue 14's targeted hostile cases, issue 23's transfer windows and issue 19's inputs that
never deliver, escapes and huge reports: each one command driven with a value the sweep of
test_cli_hostile.py does not reach, in a forked child (clirun.run_forked), judged by the same
clirun.problems (exit != 0, no traceback, at most 3 short stderr lines, no network first).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from clirun import problems, run_forked
from hostile_reports import hostile_report

# -- targeted: the cases issue 14 names -------------------------------------------------------

def test_tune_apply_cuts_a_10_mb_value(tmp_path):
    from tuners.plan import host_id

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"plan_version": 1, "host_id": host_id(), "netns_inode": 0,
                                "created_at": "x", "changes": [
                                    {"tuner": "sysctl", "key": "net.ipv4.tcp_congestion_control",
                                     "old": "cubic", "new": "x" * 10_000_000}]}))
    (tmp_path / "proc").mkdir()
    doc = run_forked(["tune", "apply", str(plan), "--yes", "--proc-root", str(tmp_path / "proc"),
                    "--state-dir", str(tmp_path / "st")], tmp_path)
    assert problems(doc) is None, problems(doc)
    line = doc["stderr"].strip()
    assert len(line) < 250 and "10000000 characters" in line, line


def _daemon_config(tmp_path: Path, state_dir: str) -> Path:
    cfg = tmp_path / "wanprobe.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{state_dir}"\nmetrics_listen = "127.0.0.1:0"\n'
                   'reflector = false\n[[peers]]\nname = "p"\naddress = "127.0.0.1"\n')
    return cfg


def test_daemon_check_and_daemon_agree_on_an_uncreatable_state_dir(tmp_path):
    """`daemon --check` used to say ok and the daemon then raised; both now refuse in one line."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = _daemon_config(tmp_path, str(blocker / "state"))
    for extra in (["--check"], []):
        doc = run_forked(["daemon", "--config", str(cfg), *extra], tmp_path)
        assert problems(doc) is None, (extra, problems(doc))
        assert "state_dir" in doc["stderr"] and "cannot create or write" in doc["stderr"]
    ok = _daemon_config(tmp_path, str(tmp_path / "fresh" / "state"))
    doc = run_forked(["daemon", "--config", str(ok), "--check"], tmp_path)
    assert doc["code"] == 0 and ": ok" in doc["stdout"], doc
    assert (tmp_path / "fresh" / "state" / "reports").is_dir()  # made as the daemon makes it


# -- issue 23: transfer windows, from Prometheus and from a store -----------------------------

WINDOWS_NONSENSE = [("--bytes", "0"), ("--bytes", "-5GB"), ("--bytes", "2000PB"),
                    ("--bytes", "1e400"), ("--deadline", "0"), ("--deadline", "-1h"),
                    ("--deadline", "400d"), ("--deadline", "soon"), ("--lookback", "30m"),
                    ("--lookback", "91d"), ("--tz", "Mars/Olympus_Mons"),
                    ("--tz", "../../etc/passwd"), ("--format", "html"),
                    ("--unit", "a b.service"), ("--throttle", "0"), ("--series", "both")]


def _windows_argv(which: str, tmp_path: Path, closed_port: int) -> list[str]:
    if which == "fleet":
        return ["fleet", "windows", "--prometheus", f"http://127.0.0.1:{closed_port}",
                "--from-site", "tpe", "--to-site", "usw", "--bytes", "1GB"]
    return ["history", "usw-1", "--windows", "--bytes", "1GB", "--state-dir", str(tmp_path)]


@pytest.mark.parametrize("which", ["fleet", "history"])
def test_windows_refuse_a_size_or_deadline_that_makes_no_sense(which, tmp_path, closed_port):
    """Each nonsense value is one line and exit 2, before Prometheus or the store is touched."""
    failures = []
    for option, value in WINDOWS_NONSENSE:
        if which == "history" and option == "--series":
            continue
        doc = run_forked(_windows_argv(which, tmp_path, closed_port) + [option, value], tmp_path)
        bad = problems(doc) or (None if doc["code"] == 2 else f"exit {doc['code']}, not 2")
        if bad:
            failures.append(f"{option} {value}: {bad}")
    assert not failures, "\n".join(failures)


def test_windows_prometheus_that_does_not_answer(tmp_path, closed_port):
    doc = run_forked(_windows_argv("fleet", tmp_path, closed_port), tmp_path)
    lines = [ln for ln in doc["stderr"].splitlines() if ln.strip()]
    assert doc["code"] == 5 and len(lines) == 1 and "cannot reach Prometheus" in lines[0], doc
    assert "Traceback" not in doc["stderr"] + doc["stdout"]


def test_windows_store_without_the_peer_or_without_data(tmp_path):
    """A peer the store never saw, and a peer whose tests cover half of each day only (a
    transfer needing the other half has no window): one line each, exit 1."""
    from wanprobe.history.store import Store

    store = Store(tmp_path / "history.sqlite3")
    now = time.time()
    for k in range(14 * 24):
        ts = now - k * 3600
        if time.gmtime(ts).tm_hour < 12:
            store.add_throughput(ts, "osa-1", {"bits_per_second": 1e9, "bytes_sent": 10**9})
    store.close()
    argv = ["history", "osa-1", "--windows", "--state-dir", str(tmp_path), "--bytes"]
    for args, needle in ((argv + ["20TB"], "no throughput samples"),
                         (argv[:1] + ["nobody"] + argv[2:] + ["1GB"], "peers with history: 'osa-1'")):
        doc = run_forked(args, tmp_path)
        lines = [ln for ln in doc["stderr"].splitlines() if ln.strip()]
        assert problems(doc) is None and doc["code"] == 1, (args, doc)
        assert len(lines) == 1 and needle in lines[0], lines
    ok = run_forked(argv + ["1TB", "--format", "rclone", "--tz", "UTC"], tmp_path)  # fits in 12 h
    assert ok["code"] == 0 and ",off" in ok["stdout"], ok


# -- issue 19: FIFOs and devices never hang, escapes never reach a terminal, huge reports end --

def _six_commands(path: str, tmp: Path) -> list[list[str]]:
    """Every command that read a user's file with a blocking open(2) (issue 19: they hung)."""
    from tuner_cases import make_proc

    proc = make_proc(tmp / "proc") if not (tmp / "proc" / "sys").exists() else tmp / "proc"
    state = ["--state-dir", str(tmp / "st"), "--proc-root", str(proc)]
    return [["probe", "127.0.0.1", "--hmac-key-file", path, "--count", "1"],
            ["reflect", "--bind", "127.0.0.1", "--hmac-key-file", path],
            ["report", "show", path], ["tune", "plan", "--report", path, *state],
            ["tune", "apply", path, *state], ["fleet", "targets", "--mesh", path],
            ["daemon", "--check", "--config", path], ["impact", "--params", "1e9", "--report", path]]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo with a silent writer", "terminal with nothing typed"])
def test_inputs_that_never_deliver_are_refused_not_waited_on(kind, tmp_path, monkeypatch):
    from wanprobe import userfiles

    monkeypatch.setattr(userfiles, "READ_TIMEOUT_S", 0.5)  # the forked children inherit it
    held = []
    if kind.startswith("fifo"):
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
        held.append(os.open(path, os.O_RDWR | os.O_NONBLOCK))  # a writer that never writes
    else:
        master, slave = os.openpty()  # a pty: a character device whose read blocks
        held += [master, slave]
        path = os.ttyname(slave)
    try:
        failures = []
        for argv in _six_commands(path, tmp_path):
            doc = run_forked(argv, tmp_path)
            bad = problems(doc)
            if bad:
                failures.append(f"{' '.join(argv[:2])}: {bad}")
            elif "within 0.5 s" not in doc["stderr"]:
                failures.append(f"{' '.join(argv[:2])}: {doc['stderr'][:200]}")
    finally:
        for fd in held:
            os.close(fd)
    assert not failures, "\n".join(failures)


ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b]52;c;ZXZpbA==\x07\x9b31m\u202eevil"
SGR = r"\x1b\[[0-9;]*m"  # rich's own styling: the only escape allowed through


def _no_terminal_control(out: str) -> str | None:
    import re

    rest = re.sub(SGR, "", out)
    bad = [c for c in rest if (ord(c) < 32 and c not in "\n\t") or 0x7f <= ord(c) < 0xa0
           or c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"]
    return f"{len(bad)} control characters, first {bad[0]!r}" if bad else None


def test_escape_sequences_in_files_never_reach_the_terminal(tmp_path, monkeypatch):
    """A finding title that sets the window title and clears the screen (and OSC 52, C1 CSI,
    a bidi override) is shown escaped in rich (colours forced on) and Markdown output, in
    `report ls`, in `tune apply`'s diff of a plan and in an error line."""
    from tuner_cases import make_proc

    from tuners.plan import host_id

    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    reports = tmp_path / "reports"
    reports.mkdir()
    good = reports / "r.json"
    good.write_text(json.dumps(hostile_report(1, ESCAPES)))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**hostile_report(1), "schema_version": ESCAPES}))
    proc = ["--proc-root", str(make_proc(tmp_path / "proc")), "--state-dir", str(tmp_path / "st")]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"plan_version": 1, "host_id": host_id(), "changes": [
        {"tuner": "sysctl", "key": "net.ipv4.tcp_rmem", "old": None,
         "new": "4096 131072 67108864", "reason": ESCAPES}]}))
    failures = []
    for argv in (["report", "show", str(good)], ["report", "show", str(good), "--format", "markdown"],
                 ["report", "ls", str(reports)], ["tune", "apply", str(plan), *proc],
                 ["report", "show", str(bad)]):
        doc = run_forked(argv, tmp_path)
        out = doc.get("stdout", "") + doc.get("stderr", "")
        why = _no_terminal_control(out) or (None if "\\x1b" in out else "the text is not shown")
        if doc.get("timeout") or doc.get("exception") or why:
            failures.append(f"{' '.join(argv[:3])}: {why or doc}")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_huge_report_renders_its_first_findings_and_a_count(tmp_path):
    """43 MB, 60,000 findings: rich ran past 60 s, Markdown took 14 s and 375 MB. Now both
    show the first 50 and count the rest (liveness bound only: no wall-clock claim)."""
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps(hostile_report(60_000, "y" * 40), indent=2))  # as diagnose -o
    assert huge.stat().st_size > 40e6
    for fmt in ("rich", "markdown"):
        doc = run_forked(["report", "show", str(huge), "--format", fmt], tmp_path, 120.0)
        assert not doc.get("timeout"), f"{fmt}: did not finish in 120 s"
        assert doc["code"] == 0, doc["stderr"]
        assert "59,950 more findings not shown" in doc["stdout"], doc["stdout"][-300:]
