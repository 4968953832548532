"""Issue 36: one ``--hmac-key-file`` and one ``--netns`` for probe, paths, mtu and throughput,
each declared once (commands/options.py); a STAMP peer's silence named — a key it wants, or one
that may not match — only when not one reply came back; hostile namespace names refused in one
line before any socket. Real reflectors (``wanprobe reflect``) on 127.0.0.1 at free ports, and
inside a namespace the test makes, whose loopback runs at MTU 1400 so a result shows which
namespace carried it (the root namespace's loopback is 65536)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import PREBUILT, invoke, problems, run_forked
from conftest import free_port, new_lab_name, require_tool

KEY = "0123456789abcdef-issue-36-key"
OTHER_KEY = "fedcba9876543210-not-the-key"
CLIENTS = ("probe", "paths", "mtu", "throughput")
ASK_FOR_KEY = ": if its reflector runs with --hmac-key-file, pass the same key (--hmac-key-file)"


def key_files(tmp_path: Path) -> tuple[str, str]:
    good, other = tmp_path / "key", tmp_path / "other.key"
    good.write_text(KEY + "\n")
    other.write_text(OTHER_KEY + "\n")
    return str(good), str(other)


def wanprobe(*args: str, ns_exec: str | None = None, timeout: float = 90
             ) -> subprocess.CompletedProcess:
    """The real CLI in a child process (a test process never enters a namespace itself)."""
    argv = [sys.executable, "-m", "wanprobe", *args]
    if ns_exec:
        argv = ["ip", "netns", "exec", ns_exec, *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def error_line(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in r.stderr and len(lines) == 1, r.stderr
    return lines[0]


class Reflector:
    """``wanprobe reflect`` on 127.0.0.1:``port`` (in ``ns`` when given), stopped on exit;
    ``stopped`` is its last stderr (the counts it prints when stopped)."""

    def __init__(self, port: int, *args: str, ns: str | None = None) -> None:
        argv = [sys.executable, "-m", "wanprobe", "reflect", "--bind", "127.0.0.1", "--port",
                str(port), *args]
        self.port, self.argv = port, ["ip", "netns", "exec", ns, *argv] if ns else argv
        self.stopped = ""

    def __enter__(self) -> Reflector:
        self.proc = subprocess.Popen(self.argv, stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        if "STAMP on udp" not in line:
            self.__exit__()
            pytest.fail(f"reflector did not start: {line}{self.stopped}")
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.stopped = self.proc.communicate(timeout=10)[1]


# -- one declaration, hostile input: no reflector, no namespace (fast tier) --------------------

def test_each_option_is_declared_once_for_every_client():
    """The same flag and help on every command that takes it: one Annotated type in
    commands/options.py, not a copy per command that drifts (paths had no key at all)."""
    commands = {name: PREBUILT.commands[name] for name in CLIENTS}
    tune = PREBUILT.commands["tune"].commands
    commands |= {f"tune {name}": cmd for name, cmd in tune.items()}
    for flag, wanted in (("--netns", set(commands)),
                         ("--hmac-key-file", {*CLIENTS, "tune apply"})):
        found = {name: p for name, cmd in commands.items() for p in cmd.params if flag in p.opts}
        assert set(found) >= wanted, f"{flag} missing from {wanted - set(found)}"
        assert len({(tuple(p.opts), p.help) for p in found.values()}) == 1, flag


HOSTILE_NAMES = ["", "no-such-namespace-t36", "../../proc/1/ns/net", "a/b", "..", "x" * 300,
                 "tab\there", "nul\x00byte"]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=repr)
@pytest.mark.parametrize("argv", [["probe", "127.0.0.1", "--count", "1"],
                                  ["paths", "127.0.0.1", "--flows", "1", "--count", "1"],
                                  ["mtu", "127.0.0.1"], ["throughput", "127.0.0.1"],
                                  ["tune", "status"]], ids=lambda a: a[0])
def test_a_bad_namespace_is_one_line_exit_2_before_any_socket(tmp_path, argv, name):
    extra = ["--state-dir", str(tmp_path / "st")] if argv[0] == "tune" else []
    doc = run_forked([*argv, *extra, "--netns", name], tmp_path)
    assert problems(doc) is None, (problems(doc), doc)
    lines = [ln for ln in doc["stderr"].splitlines() if ln.strip()]
    assert doc["code"] == 2 and len(lines) == 1 and "namespace" in lines[0], doc


@pytest.mark.parametrize("command", ["paths", "mtu", "throughput"])
@pytest.mark.parametrize("content, words", [("short\n", "at least 16"), (None, "cannot read")])
def test_a_bad_key_file_is_one_line_exit_2_before_any_socket(tmp_path, command, content,
                                                             words):
    path = tmp_path / "key"
    if content is not None:
        path.write_text(content)
    doc = run_forked([command, "127.0.0.1", "--port", str(free_port()), "--hmac-key-file",
                      str(path)], tmp_path)
    assert problems(doc) is None, (problems(doc), doc)
    assert doc["code"] == 2 and words in doc["stderr"] and "--hmac-key-file" in doc["stderr"]


# -- keyed and plain reflectors on loopback --------------------------------------------------

def probe_args(port: int, *extra: str) -> list[str]:
    return ["probe", "127.0.0.1", "--port", str(port), "--count", "5", "--interval", "10ms",
            "--timeout", "300ms", "--json", *extra]


def paths_args(port: int, *extra: str) -> list[str]:
    return ["paths", "127.0.0.1", "--port", str(port), "--flows", "2", "--count", "4",
            "--interval", "10ms", "--timeout", "300ms", "--json", *extra]


@pytest.mark.lab
def test_silence_names_the_key_only_when_nothing_came_back(tmp_path):
    """probe, probe --flows, paths and mtu against a reflector run with --hmac-key-file and
    one run without: the right key is answered; no key, another key, or a key for a reflector
    that has none is exit 1 (mtu: 5, it measured nothing) with the likely cause named; a run
    with some replies is loss, with no word about keys."""
    good, other = key_files(tmp_path)
    with Reflector(free_port(), "--hmac-key-file", good) as keyed, \
            Reflector(free_port()) as plain, Reflector(free_port(), "--rate-limit", "10") as slow:
        k, p = keyed.port, plain.port
        # paths and probe --flows trace with unsigned probes, which a keyed reflector leaves
        # unanswered: their runs against one take a dozen seconds, so they run beside the rest
        flows = ["probe", "127.0.0.1", "--port", str(k), "--flows", "2", "--count", "4",
                 "--interval", "10ms", "--timeout", "300ms"]
        slow_runs = {name: subprocess.Popen(
            [sys.executable, "-m", "wanprobe", *argv], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True) for name, argv in (
                ("unkeyed", paths_args(k)), ("keyed", paths_args(k, "--hmac-key-file", good)),
                ("flows", flows))}
        try:
            answered = invoke(*probe_args(k, "--hmac-key-file", good))
            assert answered.returncode == 0, answered.stderr
            assert json.loads(answered.stdout)["loss"]["received"] == 5
            assert invoke(*probe_args(p)).returncode == 0

            unkeyed = invoke(*probe_args(k))
            assert unkeyed.returncode == 1 and json.loads(unkeyed.stdout)["loss"]["received"] == 0
            assert error_line(unkeyed).endswith(f"no reply from 127.0.0.1 port {k}"
                                                + ASK_FOR_KEY + "; else the reflector is down "
                                                "or the probes are filtered")
            wrong = error_line(invoke(*probe_args(k, "--hmac-key-file", other)))
            assert "to authenticated probes: the key may not match" in wrong, wrong
            to_plain = error_line(invoke(*probe_args(p, "--hmac-key-file", good)))
            assert f"port {p} to authenticated probes, but it answers unauthenticated" in \
                to_plain and "the key may not match" in to_plain, (to_plain, plain.proc.poll())

            keyed_paths_to_plain = invoke(*paths_args(p, "--hmac-key-file", good))
            assert keyed_paths_to_plain.returncode == 1
            assert "answers unauthenticated" in error_line(keyed_paths_to_plain)

            mtu = invoke("mtu", "127.0.0.1", "--port", str(k), "--timeout", "200ms", "--tries",
                         "1")
            assert mtu.returncode == 5 and ASK_FOR_KEY in error_line(mtu)
            assert invoke("mtu", "127.0.0.1", "--port", str(k), "--hmac-key-file",
                          good).returncode == 0

            # some replies, the rest dropped by the reflector's rate limit: no guess about keys
            partly = invoke("probe", "127.0.0.1", "--port", str(slow.port), "--count", "150",
                            "--interval", "2ms", "--above-limit", "send", "--json")
            doc = json.loads(partly.stdout)
            assert 0 < doc["loss"]["received"] < doc["loss"]["sent"], doc["loss"]
            assert partly.returncode == 0 and "key" not in partly.stderr, partly.stderr
        finally:
            outs = {name: run.communicate(timeout=90) for name, run in slow_runs.items()}
    out, err = outs["unkeyed"]
    assert slow_runs["unkeyed"].returncode == 1 and ASK_FOR_KEY in err, err
    assert {f["loss"]["received"] for f in json.loads(out)["flows"]} == {0}
    out, err = outs["keyed"]
    assert slow_runs["keyed"].returncode == 0, err
    assert [f["loss"]["received"] for f in json.loads(out)["flows"]] == [4, 4]
    assert slow_runs["flows"].returncode == 1 and ASK_FOR_KEY in outs["flows"][1]
    assert "failed authentication" in keyed.stopped, keyed.stopped


# -- --netns: the clients run inside a namespace the test makes ------------------------------

@contextlib.contextmanager
def namespace_with_small_loopback():
    """A fresh namespace whose loopback runs at MTU 1400; deleted afterwards."""
    name = new_lab_name() + "cli"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "mtu", "1400", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.mark.netns
def test_clients_run_inside_the_named_namespace(tmp_path):
    """Reflectors that exist only inside the namespace, on its 127.0.0.1; the same port held
    silent in the root namespace, so a client that stayed there hears nothing. Inside, the
    keyed reflector answers the key and names it when missing; the path MTU is the namespace
    loopback's 1400; paths and throughput run there; a process without the capability to enter it gets exit 4."""
    good, _ = key_files(tmp_path)
    kp, pp = free_port(), free_port()
    silent = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in (kp, pp)]
    try:
        for s, port in zip(silent, (kp, pp), strict=True):
            s.bind(("127.0.0.1", port))
        with namespace_with_small_loopback() as ns, \
                Reflector(kp, "--hmac-key-file", good, ns=ns) as keyed, Reflector(pp, ns=ns):
            r = wanprobe(*probe_args(kp, "--hmac-key-file", good, "--netns", ns))
            assert r.returncode == 0 and json.loads(r.stdout)["loss"]["received"] == 5, r.stderr
            r = wanprobe(*probe_args(kp, "--netns", ns))
            assert r.returncode == 1 and ASK_FOR_KEY in error_line(r)
            r = wanprobe("mtu", "127.0.0.1", "--port", str(kp), "--hmac-key-file", good,
                         "--netns", ns, "--json")
            assert r.returncode == 0, r.stderr
            mtu = json.loads(r.stdout)
            assert mtu["local_mtu"] == mtu["path_mtu"] == 1400, mtu
            r = wanprobe(*paths_args(pp, "--netns", ns))
            assert r.returncode == 0, r.stderr
            assert all(f["loss"]["received"] == 4 for f in json.loads(r.stdout)["flows"])
            r = wanprobe("throughput", "127.0.0.1", "--port", str(kp), "--hmac-key-file", good,
                         "--duration", "0.5s", "--netns", ns, "--json")
            assert r.returncode == 0 and json.loads(r.stdout)["bits_per_second"] > 0, r.stderr
            require_tool("setpriv")
            # root without capabilities (an empty bounding set): it can still read the
            # checkout (CI's is in a 0700 temporary directory, closed to another uid) but may
            # not setns(2), which needs CAP_SYS_ADMIN
            r = subprocess.run(["setpriv", "--bounding-set=-all", "--inh-caps=-all",
                                sys.executable, "-m", "wanprobe",
                                *probe_args(kp, "--netns", ns)], capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 4 and ns in error_line(r), r.stderr
        assert "failed authentication" in keyed.stopped, keyed.stopped
        for s in silent:
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(2048)  # nothing of the clients' reached the root namespace's port
    finally:
        for s in silent:
            s.close()
