"""Shared test plumbing.

Tiers: unit tests need nothing; ``@pytest.mark.netns`` tests need root, iproute2 and network
namespaces. On a laptop those skip with a reason; under ``CI=true`` a missing capability is a
failure, because CI must run them. ``@pytest.mark.lab`` (also given to every netns and slow
test) marks what the fast tier, ``pytest -m "not lab"``, leaves to CI. The session also checks
that the suite leaves no lab namespace behind and does not change the root namespace's TCP
sysctls.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Bytecode is cached in this session and every process it starts, whatever the environment says
# (PYTHONDONTWRITEBYTECODE=1 on CI's machine): each CLI run, reflector, daemon and xdist worker
# compiled the whole package again, ~0.2 s of CPU a start and most of collection's 10 s.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# Captured and synthetic sysfs/procfs/ethtool trees, inside the repository (provenance and
# licences in tests/fixtures/trees/SOURCES.md); nothing outside the checkout is read.
FIXTURE_TREES = REPO / "tests" / "fixtures" / "trees"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# Every lab a test creates carries this prefix, so the end-of-session check finds strays.
TEST_LAB_PREFIX = f"t{os.getpid() % 100000}"

ROOT_SYSCTLS = (
    "net/ipv4/tcp_congestion_control", "net/ipv4/tcp_rmem", "net/ipv4/tcp_wmem",
    "net/core/rmem_max", "net/core/wmem_max", "net/core/default_qdisc",
    "net/ipv4/tcp_mtu_probing", "net/ipv4/tcp_slow_start_after_idle",
    "net/ipv4/tcp_notsent_lowat", "net/core/netdev_max_backlog", "net/ipv4/tcp_no_metrics_save",
)


def netns_unavailable_reason() -> str | None:
    """Why namespace tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "needs iproute2 (`ip`)"
    if not Path("/dev/net/tun").exists():
        return "needs /dev/net/tun"
    return None


def load_bench(name: str):
    """bench/NAME.py as a module, for a test that runs a bench's own measurement (one
    implementation for both). Registered in sys.modules: dataclasses resolve annotations
    through it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def require(reason: str | None) -> None:
    """Skip with ``reason`` on a laptop; fail under CI=true."""
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"CI must run this test but cannot: {reason}", pytrace=False)
    pytest.skip(reason)


def require_tool(name: str) -> str:
    """Return the path of an external tool, or skip/fail as :func:`require` does."""
    path = shutil.which(name)
    require(None if path else f"needs `{name}` installed")
    return path  # type: ignore[return-value]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The fast tier (``pytest -m "not lab"``) runs what needs only this Python process:
    every ``netns`` (a namespace lab) and ``slow`` (a long sweep or acceptance run) test is
    also ``lab``, beside the tests marked ``lab`` because they start a real server process.
    On an xdist worker, the ``alone`` tests are listed for the controller's scheduler."""
    for item in items:
        if item.get_closest_marker("netns") or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.lab)
    run = _run_dir()
    if run is not None and os.environ.get("PYTEST_XDIST_WORKER"):
        alone = sorted(item.nodeid for item in items if item.get_closest_marker("alone"))
        with contextlib.suppress(OSError):
            (run / f"alone.{os.environ['PYTEST_XDIST_WORKER']}").write_text(json.dumps(alone))


# --- tests side by side --------------------------------------------------------------------
# The suite runs on pytest-xdist workers (pyproject addopts): most lab tests wait on a delay
# line, a timer or a server, and several fit beside each other on 2 cores. A test whose figure
# depends on this host's CPU (a line rate, a CPU share, a flood, a memory bound, a real
# all-reduce, a browser) is marked ``alone``: every such test goes to one worker, where it takes
# this run's lock exclusively; every other test takes it shared, so an ``alone`` test starts
# only once the running tests are done and none starts before it ends. A file's other tests
# stay on one worker (its module-scoped labs are built once). Outside xdist (``-n 0``, one
# test) there is nothing to share. (xdist's own ``xdist_group`` renames node ids, which pytest 9
# no longer allows; the scheduler below groups by node id instead.)
_RUN_DIR_ENV = "WANPROBE_TEST_RUN_DIR"


def _run_dir() -> Path | None:
    run = os.environ.get(_RUN_DIR_ENV)
    return Path(run) if run else None


def pytest_configure(config) -> None:
    if (not hasattr(config, "workerinput") and config.pluginmanager.hasplugin("xdist")
            and config.getoption("numprocesses", None)):
        os.environ[_RUN_DIR_ENV] = tempfile.mkdtemp(prefix="wanprobe-tests-")
        # compiled once here, before the workers and the processes they start all compile the
        # same modules at once in a fresh checkout (a stat per module when they are current)
        import compileall

        for package in ("wanprobe", "collectors", "tuners"):
            compileall.compile_dir(REPO / package, quiet=1, workers=0)
        from precompile import precompile  # the test modules, assertions rewritten

        precompile(config, REPO / "tests")


def pytest_xdist_make_scheduler(config, log):
    """Every ``alone`` test (as the workers listed them) on one worker, every other file's tests
    on one worker (its module-scoped labs and fixtures built once)."""
    from xdist.scheduler import LoadScopeScheduling

    class SideBySide(LoadScopeScheduling):
        _alone: frozenset[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._alone is None:
                run = _run_dir()
                listed = sorted(run.glob("alone.*")) if run else []
                self._alone = frozenset(json.loads(listed[0].read_text()) if listed else ())
            return "alone" if nodeid in self._alone else nodeid.split("::")[0]

    return SideBySide(config, log)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Outermost (before pytest-timeout starts its clock and around rerunfailures' retries):
    the wait for the lock is not the test's time."""
    run = _run_dir()
    if run is None or not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    fd = os.open(run / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if item.get_closest_marker("alone") else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


def pytest_unconfigure(config) -> None:
    run = _run_dir()
    if run is not None and not hasattr(config, "workerinput"):  # the controller, at the end
        shutil.rmtree(run, ignore_errors=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("netns") is not None:
        require(netns_unavailable_reason())


# A rate test (our TCP rate against iperf3 or against the lab's configured rate) runs on a 2-core
# VM it shares: one CI run read iperf3 itself at 13.9 of a 50 Mbit/s lab, the host and not the
# link. Those tests (and only those) are marked ``@RATE_RERUNS``: a failure is retried twice
# after a pause, shown as "R"/RERUN in the summary; a fault of ours fails all three.
RATE_RERUNS = pytest.mark.flaky(reruns=2, reruns_delay=10)

_lab_counter = itertools.count()


def new_lab_name() -> str:
    """A unique, short lab name for this test session."""
    return f"{TEST_LAB_PREFIX}x{next(_lab_counter)}"


@pytest.fixture
def lab_factory():
    """Build labs with ``lab_factory(rtt_ms=60, loss=0.01, ...)``; all are torn down afterwards,
    also when the test fails."""
    from wanprobe.lab import Lab

    labs = []

    def make(**kwargs):
        kwargs.setdefault("name", new_lab_name())
        lab = Lab(**kwargs)
        labs.append(lab)
        lab.up()
        return lab

    yield make
    errors = []
    for lab in reversed(labs):
        try:
            lab.down()
        except Exception as exc:  # keep tearing down the others
            errors.append(exc)
    if errors:
        raise errors[0]


def _read_root_sysctls() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for key in ROOT_SYSCTLS:
        try:
            out[key] = " ".join(Path("/proc/sys", key).read_text().split())
        except OSError:
            out[key] = None
    return out


def _our_namespaces() -> list[str]:
    try:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    except OSError:
        return []
    return [line.split()[0] for line in names.splitlines()
            if line.strip() and TEST_LAB_PREFIX in line.split()[0]]


@pytest.fixture(scope="session", autouse=True)
def _root_namespace_untouched():
    """The suite must leave the root namespace's sysctls exactly as it found them, and leave
    no namespace it created behind."""
    before = _read_root_sysctls()
    yield
    after = _read_root_sysctls()
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert not changed, f"tests changed root-namespace sysctls: {changed}"
    left = _our_namespaces()
    assert not left, f"tests left network namespaces behind: {left}"


def free_port() -> int:
    """A port free on 127.0.0.1 for both UDP (STAMP) and TCP (the throughput server beside it)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.bind(("127.0.0.1", 0))
            port = u.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
                try:
                    t.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise RuntimeError("no port free for both UDP and TCP on 127.0.0.1")


@contextlib.contextmanager
def udp_server(handler):
    """A blocking UDP server thread on 127.0.0.1 (yields its port); ``handler(data, state, t2)``
    returns the reply bytes or None; ``state["count"]`` is the number of datagrams handled
    before this one."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.1)
    stop = threading.Event()
    state = {"count": 0}

    def serve():
        while not stop.is_set():
            try:
                data, addr = sock.recvfrom(65536)
            except TimeoutError:
                continue
            t2 = time.time()
            reply = handler(data, state, t2)
            state["count"] += 1
            if reply is not None:
                sock.sendto(reply, addr)

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        th.join()
        sock.close()


# --- processes a test leaves running -------------------------------------------------------
# A reflector, daemon, iperf3 or browser a test forgets keeps burning CPU through every later
# test; on a 2-core host that starves the lab's delay line and later throughput tests read the
# host, not the link. Each test must stop what it started: a process born during the test that
# still runs after its teardown, inside a namespace (not the root one) or named like a tool the
# suite starts, is killed and reported as an error of that test.
_OUR_TOOLS = ("wanprobe", "iperf3", "chromium", "chromedriver", "prometheus", "alertmanager",
              "promtool", "fping", "ping", "delayline", "conftest", "bench/")
_ROOT_NETNS = os.readlink("/proc/self/ns/net") if Path("/proc/self/ns/net").exists() else ""


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def _live() -> set[tuple[int, str]]:
    """(pid, start time) of every live process, from /proc/PID/stat alone: taken before and
    after every test, so kept to one read per process (the command lines of all of them cost
    three quarters of a trivial test's time)."""
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = _read(f"/proc/{name}/stat")
            fields = stat[stat.rindex(b")") + 2:].split()
        except (OSError, ValueError):
            continue
        if fields and fields[0] != b"Z":
            out.add((int(name), fields[19].decode()))
    return out


def _processes(keys: set[tuple[int, str]]) -> dict[tuple[int, str], str]:
    """(pid, start time) -> command line, of those of ``keys`` still alive in user space."""
    table: dict[tuple[int, str], str] = {}
    for key in keys:
        try:
            cmd = _read(f"/proc/{key[0]}/cmdline").replace(b"\0", b" ").decode(
                errors="replace").strip()
        except OSError:
            continue
        if cmd:
            table[key] = cmd
    return table


# Every process this session starts inherits its mark; a process marked by another session
# (a second checkout's suite, a CI run on this machine) is never ours to kill.
_SESSION_MARK = "WANPROBE_TEST_SESSION"
os.environ[_SESSION_MARK] = f"{os.getpid()}-{time.monotonic_ns()}"


def _other_session(pid: int) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    for entry in env.split(b"\0"):
        if entry.startswith(_SESSION_MARK.encode() + b"="):
            return entry.split(b"=", 1)[1].decode(errors="replace") != os.environ[_SESSION_MARK]
    return False


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def _started_elsewhere(pid: int) -> bool:
    """An unmarked process whose ancestors lead to a live process other than this session and
    init (a shell where someone runs a bench by hand) is not this session's; a child of ours,
    or an orphan re-parented to init (a daemon that double-forked, a test's leftover), may be."""
    me, seen = os.getpid(), set()
    while pid > 1 and pid not in seen:
        if pid == me:
            return False
        seen.add(pid)
        pid = _parent(pid)
        if pid > 1 and pid != me and _SESSION_MARK.encode() + b"=" not in _environ(pid):
            parent_cmd = _cmdline(pid)
            if not any(tool in parent_cmd for tool in _OUR_TOOLS) and "netns" not in parent_cmd:
                return True
    return False


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ours(pid: int, cmd: str) -> bool:
    try:
        in_lab = bool(_ROOT_NETNS) and os.readlink(f"/proc/{pid}/ns/net") != _ROOT_NETNS
    except OSError:
        return False
    if not in_lab and not any(tool in cmd for tool in _OUR_TOOLS):
        return False
    return not _other_session(pid) and not _started_elsewhere(pid)


@pytest.fixture(autouse=True)
def _no_stray_processes(request):
    before = _live()
    yield
    me = os.getpid()
    strays: dict[tuple[int, str], str] = {}
    deadline = time.monotonic() + 3.0
    while True:
        strays = {k: c for k, c in _processes(_live() - before).items()
                  if k[0] != me and _ours(k[0], c)}
        if not strays or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for pid, _start in strays:
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
    if strays:
        listed = "; ".join(f"{pid}: {cmd[:160]}" for (pid, _s), cmd in sorted(strays.items()))
        pytest.fail(f"the test left processes running (killed now): {listed}", pytrace=False)


# --- the host's CPU steal during each test -----------------------------------------------------
# On a virtual machine the hypervisor can take CPU from this guest (/proc/stat steal, proc(5));
# the lab's delay line and the rate tests then measure the host, not the link. Every failed
# test's report says how much was stolen while it ran, so a CI failure shows whether the
# machine was quiet.
# Bound at import: tests monkeypatch psutil.cpu_times (test_throughput_steal.py) and the patch is
# only undone after the call phase this hook measures.
import psutil as _psutil  # noqa: E402  the product's own reader of /proc/stat (throughput/sampler.py)

_CPU_TIMES = _psutil.cpu_times


def steal_and_total() -> tuple[float, float] | None:
    try:
        t = _CPU_TIMES(percpu=False)
    except (OSError, RuntimeError):
        return None
    return getattr(t, "steal", 0.0), sum(t[:8])  # user..steal; guest time is already in user


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    before = steal_and_total()
    yield
    after = steal_and_total()
    if before is None or after is None:
        return
    total = after[1] - before[1]
    item._wanprobe_steal = 100.0 * (after[0] - before[0]) / total if total > 0 else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    steal = getattr(item, "_wanprobe_steal", None)
    if report.when == "call" and report.failed and steal is not None:
        report.sections.append(("host CPU steal", f"{steal:.1f} % of this host's CPU time was "
                                "stolen by the hypervisor while the test ran (/proc/stat)"))


@pytest.fixture(scope="module")
def closed_port() -> int:
    """A loopback port nothing listens on (the hostile-CLI cases point peers there)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there: TCP is refused, UDP gets ICMP port unreachable
    return port
