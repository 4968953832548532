"""Lint: ruff clean, and the size and dependency rules of docs/conventions.md §12, enforced so they stay true:
no module over 500 lines (packages, tests, bench), no function over 60 lines unless its docstring says why
("Long because: ..."), no import cycle between package modules nor between packages, no import
running back up the layers of docs/architecture.md, nothing but the daemon's command importing
the daemon, and scapy imported by the tests only (it is a test extra)."""

import ast
import functools
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("wanprobe", "collectors", "tuners")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
WHY = "Long because"
# Functions in files other branches are rewriting at the same time (issue 12 is split across
# branches); each entry names its owner. The lead removes an entry when that branch lands.
OTHER_BRANCHES: dict[str, str] = {}


def modules():
    for pkg in PACKAGES:
        yield from sorted((REPO / pkg).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_ruff_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.fail("ruff is part of the test extra and must be installed")
    r = subprocess.run([ruff, "check", "--no-cache", str(REPO)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_no_module_over_500_lines():
    """Package modules, and the tests and bench scripts too (issue 21: no module over 500)."""
    files = [*modules(), *sorted((REPO / "tests").glob("*.py")),
             *sorted((REPO / "bench").glob("*.py"))]
    long = {str(p.relative_to(REPO)): n for p in files
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_function_over_60_lines_unless_it_says_why():
    long = []
    for path in modules():
        for node in ast.walk(tree(path)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            # from the first statement of the body: a typer command's signature declares one
            # option per line, which is not logic to read
            lines = node.end_lineno - node.body[0].lineno + 1
            where = f"{path.relative_to(REPO)}:{node.name}"
            if lines > MAX_FUNCTION_LINES and WHY not in (ast.get_docstring(node) or "") \
                    and where not in OTHER_BRANCHES:
                long.append(f"{where} ({lines} lines)")
    assert long == []


@functools.cache
def tree(path: Path) -> ast.Module:
    """One parse of each module per session: the checks here and in test_architecture.py walk
    the same files."""
    return ast.parse(path.read_text())


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Package module -> the package modules it imports (``_imports``), built once."""
    paths = {module_name(p): p for p in modules()}
    known = set(paths)
    return {m: _imports(p, known) - {m} for m, p in paths.items()}


def _imports(path: Path, known: set[str]) -> set[str]:
    """Package modules ``path`` imports, at any depth (a function-level import is a cycle too)."""
    out = set()
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in known else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out & known


def find_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every back edge of a depth-first walk, as ``a -> b -> a``."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    cycles: list[str] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for dep in sorted(graph.get(m, ())):
            if state.get(dep) == 1:
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return cycles


def test_find_cycles_sees_a_lazy_import_cycle():
    assert find_cycles({"t.datapath": {"t.sampler"}, "t.sampler": {"t.datapath"}}) == [
        "t.datapath -> t.sampler -> t.datapath"]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycles():
    assert find_cycles(import_graph()) == []


# The layers of docs/architecture.md, lowest first: a module imports its own layer and those
# below, never one above. Everything not listed (services, daemon, commands, the CLI, fleet,
# pictures, preflight, windows, the lab and the demo) composes these and sits on top.
LAYERS = (
    ("foundation", ("wanprobe", "wanprobe.errors", "wanprobe.safe_text", "wanprobe.units",
                    "wanprobe.atomic_file", "wanprobe.userfiles", "wanprobe.accept_backoff",
                    "wanprobe.netns", "wanprobe.json_fields", "wanprobe.blocking",
                    "wanprobe.addresses")),
    ("measure", ("collectors", "wanprobe.probe", "wanprobe.throughput", "wanprobe.models",
                 "wanprobe.ring")),
    ("judge", ("wanprobe.diagnose", "wanprobe.job")),
    ("report", ("wanprobe.report",)),
    ("act", ("tuners",)),
    ("shared", ("wanprobe.mesh", "wanprobe.history", "wanprobe.httpd")),
)


def layer_of(module: str) -> int:
    """The index of ``module``'s layer in LAYERS; len(LAYERS) for the composing top."""
    best, rank = "", len(LAYERS)
    for i, (_name, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            inside = module.startswith(p + ".") and p != "wanprobe"   # the root: itself only
            if (module == p or inside) and len(p) > len(best):
                best, rank = p, i
    return rank


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} ({LAYERS[layer_of(m)][0]}) -> {d}" for m, deps in graph.items()
                  for d in deps if layer_of(d) > layer_of(m))


def test_upward_imports_are_seen():
    assert upward_imports({"wanprobe.diagnose.x": {"wanprobe.report.document"},
                           "wanprobe.report.y": {"wanprobe.diagnose.finding"},
                           "tuners.z": {"wanprobe.services.counters"}}) == [
        "tuners.z (act) -> wanprobe.services.counters",
        "wanprobe.diagnose.x (judge) -> wanprobe.report.document"]


def test_no_import_runs_back_up_the_layers():
    assert upward_imports(import_graph()) == []


def test_scapy_is_a_test_dependency_only():
    users = [str(p.relative_to(REPO)) for p in modules()
             if "scapy" in {n.split(".")[0] for n in _all_imports(p)}]
    assert users == []
    pyproject = (REPO / "pyproject.toml").read_text()
    runtime = pyproject.split("[project.optional-dependencies]")[0]
    assert '"scapy' not in runtime and '"scapy>=' in pyproject


def _all_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def package_of(module: str) -> str:
    """The package a module belongs to: ``wanprobe.X`` (a subpackage, or a top-level module on its
    own), or the top-level package (``collectors``, ``tuners``)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "wanprobe" else parts[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        out.setdefault(package_of(m), set()).update(
            package_of(d) for d in deps if package_of(d) != package_of(m))
    return out


def test_package_cycles_are_seen():
    assert find_cycles(package_graph({"wanprobe.daemon.main": {"wanprobe.pictures.routes"},
                                      "wanprobe.pictures.routes": {"wanprobe.daemon.store"},
                                      "wanprobe.daemon.store": set()})) == [
        "wanprobe.daemon -> wanprobe.pictures -> wanprobe.daemon"]


def test_no_package_cycles():
    """A module cycle hides inside a package cycle (daemon -> pictures -> daemon, issue 38)."""
    assert find_cycles(package_graph(import_graph())) == []


# The daemon is a composition root, not a library (issue 38): nothing but its own command imports
# it. What the others shared with it has its own package (mesh/, history/, httpd/).
DAEMON_IMPORTERS = frozenset({"wanprobe.commands.daemon"})


def test_only_the_daemon_command_imports_the_daemon():
    def daemon(m: str) -> bool:
        return m == "wanprobe.daemon" or m.startswith("wanprobe.daemon.")

    importers = sorted(m for m, deps in import_graph().items() if not daemon(m)
                       and m not in DAEMON_IMPORTERS and any(daemon(d) for d in deps))
    assert importers == []


# A measurement never judges (issue 38): the throughput verdict's decision and thresholds live in
# wanprobe/diagnose/rules_throughput.py; wanprobe/throughput measures and is handed a judge.
VERDICT_RULES = REPO / "wanprobe" / "diagnose" / "rules_throughput.py"


def thresholds(source: str) -> set[str]:
    """The module-level UPPER_CASE names bound to a number in ``source``."""
    return {t.id for node in ast.parse(source).body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int | float)
            for t in node.targets if isinstance(t, ast.Name) and t.id.isupper()}


def judgements(source: str, names: set[str]) -> list[str]:
    """What in ``source`` judges: a module-level ``decide`` or rule table (``RULES``), or one of
    the verdict's threshold ``names`` bound at module level."""
    out = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "decide":
            out.append(f"{node.lineno}:def {node.name}")
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, ast.AnnAssign) else [])
        out += [f"{node.lineno}:{t.id}" for t in targets
                if isinstance(t, ast.Name) and (t.id in names or t.id == "RULES")]
    return out


def test_judgements_are_seen():
    names = thresholds("A_MIN = 0.2\nB: int = 3\nlower = 1\nC = 'text'\nD = 2\n")
    assert names == {"A_MIN", "D"}
    planted = ("A_MIN = 0.5\nRULES = ()\n\ndef decide(v):\n    return v\n\n"
               "def keep():\n    D = 1\n    return D\n")
    assert judgements(planted, names) == ["1:A_MIN", "2:RULES", "4:def decide"]
    assert judgements("X = 1\n\ndef summarize(v):\n    return v\n", names) == []


def test_the_throughput_engine_holds_no_verdict():
    """No module of wanprobe/throughput decides a verdict or holds one of its thresholds."""
    names = thresholds(VERDICT_RULES.read_text())
    assert {"WINDOW_SHARE_MIN", "CPU_BUSY_MIN", "STANDING_QUEUE_MIN", "STEAL_PERCENT"} <= names
    found = {str(p.relative_to(REPO)): hits for p in sorted((REPO / "wanprobe" / "throughput")
                                                           .rglob("*.py"))
             if (hits := judgements(p.read_text(), names))}
    assert found == {}
