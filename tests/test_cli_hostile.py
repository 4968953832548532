"""Issue 14, "no traceback, ever": every command of the CLI, driven with hostile values.

The commands and their options are ENUMERATED from the typer app, so a command added later is
covered without editing this file. Each option gets the hostile values of its kind (text, integer,
float, path, input file, output path): undecodable bytes, NaN/inf, integers beyond SQLite's range,
absurd counts and durations, datagram-sized probes, directories where files belong, report and
config files with wrong types, 100,000-deep nesting or NaN, state dirs that cannot be created.

Each case runs in process through CliRunner, in a forked child (so a hang is killed at its timeout,
and a command that enters a namespace or installs signal handlers does so in the child only). An
audit hook records network activity: a hostile value must be refused before any IPv4/IPv6 socket
is bound, connected or sent from. Commands that need a peer are pointed at 127.0.0.1 on a closed
port. Asserted per case: exit != 0, no traceback, at most 3 lines on stderr (none longer than
MAX_LINE characters), no "internal error" (the last-resort handler in cli.py: its line means a
cause was left unfixed), and the child finished within its timeout.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
from pathlib import Path

import pytest
from clirun import PREBUILT, problems, run_forked
from conftest import TEST_LAB_PREFIX, new_lab_name

from wanprobe import cli

CASE_TIMEOUT_S = 20.0
NON_UTF8 = b"peer-\xff\xfe".decode("utf-8", "surrogateescape")
HUGE = "A" * 200_000

# Values by kind. Each is refused by every option of its kind.
TEXT = {"non-utf8": NON_UTF8, "huge": HUGE, "control": "a\nb\x1b[2J\x07"}
NUMERIC_TEXT = {
    "nan": "nan", "1e309": "1e309", "2^63": str(2**63), "1000h": "1000h", "10^12": str(10**12),
    "huge GiB": "9" * 40 + "GiB", "datagram": "65536", "negative": "-1",
}
INTS = {"2^63": str(2**63), "-2^63-1": str(-(2**63) - 1), "10^12": str(10**12), "nan": "nan",
        "negative": "-1"}
FLOATS = {"nan": "nan", "inf": "inf", "1e309": "1e309", "1e300": "1e300", "negative": "-1"}

# Options whose value may legitimately be any name-like text (a lab, a peer): only the universal
# text classes apply; "nan" or "1000h" would be a valid name there.
FREE_NAMES = {("lab", "up", "name"), ("lab", "down", "name"), ("lab", "update", "name"),
              ("lab", "exec", "name"), ("lab", "multipath", "name"), ("lab", "sites", "name"),
              ("lab", "reroute", "name"),
              ("lab", "path", "name"), ("history", "peer"), ("tune", "rollback", "journal_id"),
              ("fleet", "windows", "from_site"), ("fleet", "windows", "to_site"),
              ("lab", "exec", "command"), ("nccl-env", "iface")}
# (command path, option, class) where the "hostile" value is in fact valid: a server given a valid
# cap serves until stopped (so it would "not finish"), and these caps are legitimately small/big.
# A bare 65536 is a valid --window (bytes, as iperf3's -w).
VALID = {(("reflect",), "max_test_duration", "datagram"), (("reflect",), "max_test_bytes", "datagram"),
         (("reflect",), "max_test_bytes", "10^12"), (("reflect",), "rate_pps", "datagram"),
         (("throughput",), "window", "datagram"), (("throughput",), "max_duration", "datagram"),
         (("throughput",), "max_bytes", "10^12"), (("throughput",), "max_bytes", "datagram"),
         # 65536 s (18 h) is a sensible baseline look-back; "nan" is a legal Prometheus job name
         (("fleet", "rules"), "floor_baseline", "datagram"),
         (("fleet", "rules"), "throughput_baseline", "datagram"), (("fleet", "rules"), "job", "nan"),
         # 65536 and 10^12 bytes are sizes to move, 65536 s (18 h) a deadline or look-back,
         # 1000 h (42 days) too; 65536 bit/s and 1 Tbit/s are rclone limits
         *((("fleet", "windows"), o, c) for o, c in (
             ("size", "datagram"), ("size", "10^12"), ("deadline", "datagram"),
             ("deadline", "1000h"), ("lookback", "datagram"), ("lookback", "1000h"),
             ("throttle", "datagram"), ("throttle", "10^12")))}
OUTPUT_NAMES = ("output", "o")
DIR_WORDS = ("dir", "root", "sysctl_d", "state")
FILE_WORDS = ("file", "report", "config", "key", "plan", "path")
FILE_VALUES = ("directory", "missing", "under a file", "name too long")


def walk(command, path=()):
    """(path, click command) for every leaf command of the tree."""
    subs = getattr(command, "commands", None)
    if subs:
        for name, sub in sorted(subs.items()):
            yield from walk(sub, path + (name,))
    else:
        yield path, command


def annotation(param):
    return getattr(getattr(param, "type_descriptor", None), "annotation", str)


def is_flag(param) -> bool:
    return bool(getattr(param, "is_flag", False)) or annotation(param) is bool


def kind(path: tuple, param) -> str:
    """text | free | int | float | key | file | dir | root | output: the hostile values it gets."""
    ann = annotation(param)
    name = param.name or ""
    if ann is int:
        return "int"
    if ann is float:
        return "float"
    if path + (name,) in FREE_NAMES:
        return "free"
    if name in OUTPUT_NAMES:
        return "output"
    if "key" in name:
        return "key"
    if name.endswith("root"):
        return "root"
    if any(w in name for w in DIR_WORDS):
        return "dir"
    if "Path" in str(ann) or any(w in name for w in FILE_WORDS):
        return "file"
    return "text"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Hostile input files and paths, built once."""
    d = tmp_path_factory.mktemp("hostile")
    a_file = d / "plain"
    a_file.write_text("plain\n")
    deep = "[" * 100_000 + "]" * 100_000
    report = {"schema_version": "1.0", "id": "r", "created_at": "x", "tool": {}, "host": {},
              "peer": {}, "measurements": {}, "findings": [], "timestamps": {}}
    contents = {
        "non-utf8 file": b"\xff\xfe\x00\x81 not text",
        "deep json": deep.encode(),
        "nan json": b'{"schema_version": "1.0", "findings": [], "x": NaN, "rtt": Infinity}',
        "wrong types": json.dumps({**report, "findings": "all of them", "host": [1, 2],
                                   "peer": 7, "changes": {"a": 1}, "entries": 5}).encode(),
        "wrong finding": json.dumps({**report, "findings": [
            {"id": 1, "severity": [], "knobs": {"tuner": 5}, "evidence": "x"}]}).encode(),
        "big int": ('{"schema_version": "1.0", "n": ' + "9" * 5000 + "}").encode(),
        "deep toml": ("a = " + "[" * 100_000 + "]" * 100_000 + "\n").encode(),
        "toml wrong types": b'state_dir = 5\n[probe]\ninterval = [1, 2]\n[[peers]]\nname = {}\n',
        "empty": b"",
    }
    out = {"directory": str(d), "missing": str(d / "no-such-file"), "a file": str(a_file),
           "endless": "/dev/zero",
           "under a file": str(a_file / "sub"), "name too long": str(d / ("n" * 5000))}
    # issue 19: a FIFO nobody writes (open(2) used to block forever), a device node (mknod in
    # this temp dir, never /dev), a socket
    os.mkfifo(d / "fifo")
    out["fifo"] = str(d / "fifo")
    if os.geteuid() == 0:
        os.mknod(d / "null-device", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        out["device"] = str(d / "null-device")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(d / "socket"))
    out["socket"] = str(d / "socket")
    for name, data in contents.items():
        p = d / name.replace(" ", "-")
        p.write_bytes(data)
        out[name] = str(p)
    return out


# The files each kind of path option must refuse, besides TEXT. A state dir is created, so it
# must be creatable; a root must exist; any text of 16+ characters is a key, these are not.
BAD_FILES = {
    "output": ("directory", "under a file", "name too long", "socket"),
    "dir": ("a file", "under a file", "name too long"),
    "root": ("a file", "under a file", "name too long", "missing"),
    "key": ("directory", "missing", "under a file", "name too long", "endless", "non-utf8 file",
            "deep json", "empty", "fifo", "device", "socket"),
}


def values_for(k: str, files: dict[str, str]) -> dict[str, str]:
    plain = {"int": INTS, "float": FLOATS, "free": TEXT}
    if k in plain:
        return plain[k]
    if k in BAD_FILES:
        return {**TEXT, **{n: files[n] for n in BAD_FILES[k] if n in files}}
    if k == "file":
        return {**TEXT, **{n: v for n, v in files.items() if n != "a file"}}
    return {**TEXT, **NUMERIC_TEXT}


def is_option(param) -> bool:
    return bool(param.opts) and param.opts[0].startswith("-")


def baseline(path: tuple, command, tmp: Path, closed_port: int) -> list[str]:
    """Benign options for a command: a peer on a closed loopback port, state and roots in a
    scratch directory, so whatever a hostile value slips past touches nothing real."""
    opts: list[str] = []
    names = {p.name for p in command.params}
    for p in command.params:
        if is_option(p) and p.required and not is_flag(p):
            # a Prometheus that does not answer: what a hostile value slips past reaches nothing
            value = (f"http://127.0.0.1:{closed_port}" if p.name == "prometheus"
                     else _benign(path, p, tmp))
            opts += [p.opts[0], value]
    if "port" in names:
        opts += ["--port", str(closed_port)]
    for root in ("proc", "sys"):  # empty trees: present, so a hostile value is what is refused
        (tmp / root).mkdir(exist_ok=True)
    for name, value in (("state_dir", tmp / "state"), ("proc_root", tmp / "proc"),
                        ("sys_root", tmp / "sys"), ("timeout", "300ms"), ("interval", "10ms"),
                        ("count", "2"), ("config", tmp / "missing.toml")):
        if name in names:
            opts += [f"--{name.replace('_', '-')}", str(value)]
    if path == ("daemon",):
        opts.append("--check")
    return opts


LAB_NAME = new_lab_name()


def _benign(path, param, tmp: Path) -> str:
    ann, name = annotation(param), param.name or ""
    if ann is int:
        return "1"
    if ann is float:
        return "1e9"
    if name in ("host", "peer"):
        return "127.0.0.1"
    if name == "size":   # --bytes of fleet windows: a valid size, so the other options count
        return "1GB"
    if name == "side":
        return "a"
    if path[:1] == ("lab",) and name == "name":
        return LAB_NAME
    if kind(path, param) == "file":
        return str(tmp / f"absent-{name}.json")
    return "x"


def argv_for(path, command, param, value, tmp, closed_port) -> list[str]:
    """The command line: benign options, the hostile one, then ``--`` and the arguments."""
    opts = baseline(path, command, tmp, closed_port)
    if param is not None and is_option(param):
        opts += [param.opts[0], value]
    pos = []
    for p in command.params:
        if is_option(p):
            continue
        if p is param:
            pos.append(value)
        elif p.required:
            pos.append(_benign(path, p, tmp))
    if param is None:
        pos.append(value)  # a command without options: an unexpected extra argument
    return [*path, *opts, "--", *pos]


COMMANDS = sorted(walk(PREBUILT), key=lambda pc: pc[0])


# Commands import their machinery lazily (a fast CLI start); import it once here so each forked
# case does not pay for it again. A module another branch renamed is simply skipped.
WARM_MODULES = (
    "wanprobe.probe.api", "wanprobe.probe.mtu", "wanprobe.probe.reflector",
    "wanprobe.throughput.client", "wanprobe.throughput.server", "wanprobe.services.diagnose",
    "wanprobe.report.render_rich", "wanprobe.report.render_md", "wanprobe.report.store",
    "wanprobe.daemon.main", "wanprobe.history.store", "wanprobe.lab", "tuners.registry",
    "tuners.transaction", "tuners.from_report", "tuners.nccl_env", "tuners.plan",
    "collectors.snapshot", "collectors.health", "jsonschema", "typer.testing",
)


@pytest.fixture(scope="module", autouse=True)
def warm_imports():
    import importlib

    import typer.testing

    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    # One refused run in this process: the value guard is installed on PREBUILT and rich has
    # built its caches, so a forked case costs milliseconds instead of a first run's 0.2 s.
    saved = typer.testing._get_command
    typer.testing._get_command = lambda _app: PREBUILT
    try:
        typer.testing.CliRunner().invoke(cli.app, ["impact", "--params", "nan"])
    finally:
        typer.testing._get_command = saved


def _owned_elsewhere(name: str) -> bool:
    """The lab's forwarder (or a multipath lab's first) was started for another process."""
    import os

    from wanprobe.lab.lab import forwarder_pids

    for pid in forwarder_pids(name) or forwarder_pids(f"{name}-p0"):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"--owner-pid" in argv:
            owner = argv[argv.index(b"--owner-pid") + 1]
            return owner.isdigit() and int(owner) != os.getpid()
    return False


@pytest.fixture(scope="module", autouse=True)
def no_stray_lab():
    """No command may bring a lab up on a hostile value: any lab (two-namespace or multipath)
    that appears while this module runs is removed, and the run fails."""
    from wanprobe.lab import Lab, list_labs
    from wanprobe.lab.multipath import MultipathLab

    before = {lab.get("name") for lab in list_labs()}
    yield
    # only labs named as this session names them, and whose forwarder this process owns: other
    # sessions' labs (a concurrent test run on this host) are not ours to remove
    new = [lab for lab in list_labs() if lab.get("name") not in before
           and str(lab.get("name", "")).startswith(TEST_LAB_PREFIX + "x")
           and not _owned_elsewhere(lab.get("name") or "")]
    for lab in new:
        if lab.get("kind") == "multipath":
            MultipathLab.attach(lab["name"]).down()
        else:
            Lab(lab["name"], rtt_ms=0).down()
    assert not new, f"hostile values brought labs up: {[lab.get('name') for lab in new]}"


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=" ".join)
def test_every_option_refuses_hostile_values(path, files, tmp_path, closed_port):
    command = dict(COMMANDS)[path]
    failures = []
    cases = 0
    for param in command.params:
        if is_flag(param):
            continue
        for label, value in values_for(kind(path, param), files).items():
            if (path, param.name, label) in VALID:
                continue
            argv = argv_for(path, command, param, value, tmp_path, closed_port)
            cases += 1
            bad = problems(run_forked(argv, tmp_path, CASE_TIMEOUT_S))
            if bad:
                failures.append(f"{param.name}={label}: {bad}")
    if not cases:  # only flags: an unexpected extra argument is what there is to refuse
        for label, value in TEXT.items():
            cases += 1
            bad = problems(run_forked(argv_for(path, command, None, value, tmp_path, closed_port), tmp_path))
            if bad:
                failures.append(f"extra argument {label}: {bad}")
    assert not failures, f"{' '.join(path)}: {len(failures)} of {cases} cases:\n" + "\n".join(failures)


# -- the real entry point, as a subprocess: argv with bytes that are not UTF-8 ----------------

@pytest.mark.parametrize("argv", [
    [b"probe", b"peer-\xff\xfe.example"],
    [b"report", b"show", b"\xff\xfe.json"],
    [b"impact", b"--params", b"nan"],
    [b"probe", b"127.0.0.1", b"--count", str(10**12).encode()],
    [b"history", b"x", b"--limit", str(2**63).encode()],
    [b"\xff"],
], ids=lambda a: b" ".join(a)[:30].decode("utf-8", "replace"))
@pytest.mark.slow
def test_real_entry_point_refuses_in_one_line(argv, tmp_path):
    import subprocess

    r = subprocess.run([sys.executable.encode(), b"-m", b"wanprobe", *argv], capture_output=True,
                       timeout=60, cwd=tmp_path, env={**os.environ, "LC_ALL": "C.UTF-8"})
    err = r.stderr.decode("utf-8", "replace")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert r.returncode != 0 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("wanprobe: error:"), err


# -- generated: hypothesis text and numbers into every option of the probe-free commands -------

def _option_params():
    out = []
    for path, command in COMMANDS:
        if path[0] in ("lab", "demo", "reflect", "daemon"):  # servers and root-only labs: above
            continue
        out += [(path, command, p) for p in command.params if not is_flag(p)]
    return out


OPTION_PARAMS = _option_params()
# A drawn number may be a valid, long run ("--count 1782" at 10 ms, "--duration 99"): for these
# options a run still going at the timeout is legitimate; their absurd values are refused above.
RUN_LENGTH = ("count", "duration", "interval", "timeout", "tries", "since", "limit", "streams")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_generated_values_never_crash(tmp_path, closed_port):
    """Hypothesis draws arbitrary text (surrogates and controls included) and numbers written as
    text; whatever a command makes of them — refusal, or a run against the closed port — it ends
    without a traceback, in at most 3 stderr lines, within its timeout (unless it is a valid long
    run of a RUN_LENGTH option)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    values = st.one_of(
        st.text(st.characters(codec=None, exclude_categories=("Cs",)), max_size=40),
        st.text(alphabet=st.sampled_from(list("0123456789.eE+-_ xkKmMgGiBbsnu%h")), max_size=24),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.integers(min_value=-(2**80), max_value=2**80).map(str),
        st.sampled_from([NON_UTF8, "\x00", "-", "--", "", " ", "\n"]),
    )

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(OPTION_PARAMS), values)
    def one(case, value):
        path, command, param = case
        doc = run_forked(argv_for(path, command, param, value, tmp_path, closed_port), tmp_path)
        if doc.get("timeout") and param.name in RUN_LENGTH:
            return
        if doc.get("timeout") or doc.get("no result"):
            raise AssertionError(f"{' '.join(path)} {param.name}={value!r}: {problems(doc)}")
        err_lines = [ln for ln in doc["stderr"].splitlines() if ln.strip()]
        out = doc["stdout"] + doc["stderr"]
        assert not doc["exception"] and "Traceback" not in out, (path, param.name, value, out[-300:])
        assert "internal error" not in doc["stderr"], (path, param.name, value, doc["stderr"])
        assert len(err_lines) <= 3, (path, param.name, value, err_lines)

    one()
