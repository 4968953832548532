"""docs/architecture.md, checked (issue 38): every claim of the document that a static reading of
the code can prove is proved here, so the document cannot drift from the tree unnoticed. The
layers, the import cycles and the daemon's one importer are tests/test_lint.py's. Pure file reads
and ASTs (a few imports of pure modules); every checker also catches a violation planted in it."""

from __future__ import annotations

import ast
import functools
import inspect
import re
import sys
from collections import Counter
from pathlib import Path

from test_lint import LAYERS, PACKAGES, REPO, import_graph, module_name, modules

DOC = REPO / "docs" / "architecture.md"
TICK = re.compile(r"`([^`\s]+)`")
HEAD = re.compile(r"\*\*`([^`]+)`")
FILE = re.compile(r"\.(py|json|js|css)$")
ATTR = re.compile(r"^([\w/]+)\.\w+$")  # `api.METHODS`, `diagnose/verify.judge`: names api.py


@functools.cache
def parse(source: str) -> ast.Module:
    """One parse per text: the checks below walk the same modules."""
    return ast.parse(source)


@functools.cache
def text(path: Path) -> str:
    return path.read_text()


def graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (test_lint's graph, built once per session)."""
    return import_graph()


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "wanprobe" else parts[0]


# -- the modules the document names ------------------------------------------------------------

def paragraphs(doc: str):
    """(the folders a package paragraph is about, its text): ``**`wanprobe/probe/`**`` opens one."""
    for para in re.split(r"\n\s*\n", doc):
        heads = HEAD.findall(para.split("\n")[0]) if para.startswith("**") else []
        yield [h if h.endswith("/") else str(Path(h).parent) + "/" for h in heads], para


def names(doc: str, root: Path = REPO) -> tuple[set[Path], list[str]]:
    """The files the document names, and the names that resolve to none. A name is looked up in
    its paragraph's folder first (``sender.py`` under ``wanprobe/probe/``), then from the root and
    from ``wanprobe/`` (``daemon/prober.py``); a bare name outside a package paragraph anywhere."""
    found: set[Path] = set()
    missing: list[str] = []
    for bases, para in paragraphs(doc):
        roots = [root / b for b in bases] + [root, root / "wanprobe"]
        for tok in (t.split("::")[0] for t in TICK.findall(para)):
            attr = ATTR.match(tok) if not FILE.search(tok) else None
            pattern = f"{attr.group(1)}.py" if attr else tok
            if not (attr or FILE.search(tok) or tok.endswith("/*")):
                continue
            hits = next((hs for r in roots if (hs := [p for p in sorted(r.glob(pattern))
                                                     if "__pycache__" not in p.parts])), [])
            if not hits and not bases and "/" not in pattern:
                hits = [p for pkg in PACKAGES for p in sorted((root / pkg).rglob(pattern))]
            if not hits and not attr:
                missing.append(f"{tok} (in {' '.join(bases) or 'a general section'})")
            found.update(hits)
    return found, missing


def test_doc_names_are_resolved_per_paragraph(tmp_path):
    for f in ("wanprobe/probe/sender.py", "wanprobe/probe/api.py", "wanprobe/lab/sender.py",
              "wanprobe/daemon/prober.py"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    doc = ("**`wanprobe/probe/`** `sender.py`, `api.METHODS`, `daemon/prober.py`, `gone.py`, "
           "`cpu.client`\n\n**`wanprobe/lab/`** emulates a WAN.\n")
    found, missing = names(doc, tmp_path)
    assert {p.relative_to(tmp_path).as_posix() for p in found} == {
        "wanprobe/probe/sender.py", "wanprobe/probe/api.py", "wanprobe/daemon/prober.py"}
    assert missing == ["gone.py (in wanprobe/probe/)"]


def test_every_file_the_doc_names_exists():
    """Each `module.py` of a package paragraph is a file of that package."""
    assert names(DOC.read_text())[1] == []


def test_every_module_is_named_in_the_doc():
    """The package paragraphs describe their packages: a new module gets its line ("`cli.py`
    builds the typer app from `commands/*`" names every command module)."""
    found, _ = names(DOC.read_text())
    unnamed = [rel(p) for p in modules() if not p.name.startswith("__") and p not in found]
    assert unnamed == []


def doc_layers(doc: str) -> dict[str, set[str]]:
    """``N. **name**: `x`, `p/` ...`` of the Layers section as module and package names."""
    section = doc.split("## Layers", 1)[1].split("\n## ", 1)[0]
    out = {}
    for name, body in re.findall(r"^\d\. \*\*(\w+)\*\*[^:]*:(.*?)(?=^\d\. |^$)", section, re.M | re.S):
        body = re.sub(r"\(.*?\)", "", body, flags=re.S)  # asides: "(`finding.py` holds ...)"
        mods = {t.rstrip("/").removesuffix(".py") for t in TICK.findall(body)}
        mods = {m if m in PACKAGES else f"wanprobe.{m}" for m in mods}
        out[name] = mods | ({"wanprobe"} if "package root" in body else set())
    return out


def test_the_doc_layers_are_the_checked_layers():
    """"Lowest first; a module imports its own layer and those below, never one above
    (tests/test_lint.py::test_no_import_runs_back_up_the_layers)": the same list, and the
    compose layer holds every other package."""
    layers = doc_layers(DOC.read_text())
    assert [(n, layers[n]) for n, _ in LAYERS] == [(n, set(ps)) for n, ps in LAYERS]
    below = {p for _, ps in LAYERS for p in ps}
    top = {package_of(m) for m in graph()} - {package_of(p) for p in below} - set(PACKAGES)
    assert top - {"wanprobe.__main__"} <= layers["compose"]


# -- diagnose ----------------------------------------------------------------------------------

def package_imports(source: str, package: str) -> list[str]:
    """What ``source`` imports from ``package``, at any depth."""
    out = []
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            out += [node.module] if (node.module + ".").startswith(package + ".") else []
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if (a.name + ".").startswith(package + ".")]
    return out


def test_package_imports_are_seen():
    src = "import json\ndef f():\n    from wanprobe.diagnose.rule import rule\n"
    assert package_imports(src, "wanprobe.diagnose") == ["wanprobe.diagnose.rule"]
    assert package_imports("from wanprobe.diagnosex import y\n", "wanprobe.diagnose") == []


def test_finding_imports_nothing_of_the_package():
    """"returning the one `Finding` (`finding.py`, with its `Knob`; it imports nothing of the
    package)"."""
    path = REPO / "wanprobe/diagnose/finding.py"
    assert package_imports(text(path), "wanprobe.diagnose") == []


def rule_functions(source: str) -> dict[str, str]:
    """Function name -> rule id of every ``@rule("id", ...)`` in ``source``."""
    out = {}
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and getattr(d.func, "id", None) == "rule":
                    out[node.name] = d.args[0].value if d.args else "?"
    return out


def test_rule_functions_are_seen():
    src = '@rule("a.b", needs=("x",))\ndef f(x): ...\n\n@other("c")\ndef g(): ...\n'
    assert rule_functions(src) == {"f": "a.b"}


def test_every_rule_is_in_the_engine_table():
    """"Every judgement is a rule: a pure function tagged `@rule(id, needs=...)` ...
    `engine.py` lists every rule in table order (`RULES`)": no tagged function is left out
    (`PEER_RULES`, `COUNTER_RULES`, `verify_limit`'s table are all inside it), one id each."""
    import importlib

    from wanprobe.diagnose import engine

    listed = {id(f) for f in engine.RULES}
    left_out = []
    for path in sorted((REPO / "wanprobe/diagnose").glob("*.py")):
        mod = importlib.import_module(module_name(path))
        left_out += [f"{rel(path)}:{name} ({rid})" for name, rid in rule_functions(text(path))
                     .items() if id(getattr(mod, name, None)) not in listed]
    assert left_out == []
    assert [i for i, n in Counter(f.rule_id for f in engine.RULES).items() if n > 1] == []


# -- the one writer ----------------------------------------------------------------------------

WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC")
HOST_PATHS = ("/proc/sys/", "/sys/", "/dev/")  # the host's settings and devices are not files
# What writes a file without atomic_file.py, and why it may: module:kind -> reason.
OWN_WRITERS = {
    "wanprobe/atomic_file.py:os.fdopen": "the one writer itself",
    "wanprobe/atomic_file.py:os.open": "the one writer itself: a FIFO or sink, in place",
    "wanprobe/atomic_file.py:tempfile": "its temp name, renamed over the target",
    "wanprobe/daemon/state_dir.py:os.open": "the state dir's writability probe, removed at once",
    "wanprobe/demo_story.py:write_text": "a scratch report in its own mkdtemp dir",
    "wanprobe/lab/tune_check.py:write_text": "a scratch report in its own mkdtemp dir",
    "wanprobe/lab/lab.py:open": "the forwarder's stderr, appended by the child process",
    "wanprobe/throughput/datapath.py:open": "the payload memfd, no file",
    "tuners/journal.py:os.open": "the state dir's flock file, never written",
    "tuners/sysctl.py:open": "the knob itself: a /proc/sys file under proc_root",
    "tuners/roce.py:open": "the knob itself: a /sys file under sys_root",
    "wanprobe/history/store.py:sqlite3": "the history, SQLite in WAL mode (its own paragraph)",
    "wanprobe/job/recorder.py:open": "the training job's step log, appended a line per step",
}


def _host_path(arg: ast.expr | None) -> bool:
    src = ast.unparse(arg) if arg is not None else ""
    return src == "os.devnull" or any(src.strip("'\"f").startswith(p) for p in HOST_PATHS)


def file_writes(source: str) -> list[tuple[int, str]]:
    """(line, kind) of each call in ``source`` that can create or write a file."""
    out = []
    for n in ast.walk(parse(source)):
        if not isinstance(n, ast.Call):
            continue
        f, first = n.func, (n.args[0] if n.args else None)
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        owner = ast.unparse(f.value) if isinstance(f, ast.Attribute) else ""
        mode = next((k.value for k in n.keywords if k.arg == "mode"), None)
        if name in ("write_text", "write_bytes"):
            out.append((n.lineno, name))
        elif owner == "os" and name == "open":
            flags = ast.unparse(n.args[1]) if len(n.args) > 1 else ""
            unknown = "O_" not in flags  # flags in a variable: read where it is set
            if (unknown or any(w in flags for w in WRITE_FLAGS)) and not _host_path(first):
                out.append((n.lineno, "os.open"))
        elif owner == "os" and name == "fdopen":
            mode = mode or (n.args[1] if len(n.args) > 1 else None)
            if mode is not None and re.search(r"[wax+]", ast.unparse(mode)):
                out.append((n.lineno, "os.fdopen"))
        elif owner in ("tempfile", "") and name in ("mkstemp", "NamedTemporaryFile",
                                                    "TemporaryFile"):
            out.append((n.lineno, "tempfile"))
        elif owner == "sqlite3" and name == "connect" and "mode=ro" not in source:
            out.append((n.lineno, "sqlite3"))
        elif name == "open" and not owner:  # the builtin: open(path, mode)
            mode = mode or (n.args[1] if len(n.args) > 1 else None)
            if mode is not None and not (isinstance(mode, ast.Constant) and not re.search(
                    r"[wax+]", str(mode.value))) and not _host_path(first):
                out.append((n.lineno, "open"))
        elif name == "open" and isinstance(first, ast.Constant) and re.search(r"[wax+]",
                                                                              str(first.value)):
            out.append((n.lineno, "open"))  # Path.open("w")
    return out


def test_file_writes_are_seen():
    src = ('open(p, "w")\nopen(p)\nopen(p, mode="ab")\nPath(p).write_text(s)\np.open("wb")\n'
           'os.open(p, os.O_WRONLY | os.O_CREAT)\nos.open(p, os.O_RDONLY)\nsqlite3.connect(p)\n'
           'open("/proc/sys/net/x", "w")\nos.open(os.devnull, os.O_WRONLY)\nsock.open((h, 1))\n'
           'tempfile.mkstemp()\nopen(p, m)\nos.open(p, flags)\n')
    assert file_writes(src) == [(1, "open"), (3, "open"), (4, "write_text"), (5, "open"),
                                (6, "os.open"), (8, "sqlite3"), (12, "tempfile"), (13, "open"),
                                (14, "os.open")]


def test_atomic_file_is_the_one_writer():
    """"`atomic_file.py` is the one writer of every output and state file": nothing else opens
    a file to write, but the host's own settings (the tuners' /proc/sys and /sys, the lab's
    namespaces) and the named exceptions of OWN_WRITERS."""
    seen = {f"{rel(p)}:{kind}" for p in modules() for _, kind in file_writes(text(p))}
    assert sorted(seen - set(OWN_WRITERS)) == []
    assert sorted(set(OWN_WRITERS) - seen) == []  # an exception that went away leaves the list


# -- units -------------------------------------------------------------------------------------

UNIT = r"(?i)^([kmgt]?(bit|bps)(/s)?|[kmgt]i?b|ns|us|ms|sec|af[1-4][1-3]|cs[0-7])$"
UNIT_IN_PATTERN = re.compile(r"(?i)(\b[kmgt]?bit\b|bps|\bms\b|\bGb/sec\b|\baf\\?d)")
# Fixed formats of other programs, each with its unit spelled one way.
FOREIGN_FORMATS = {
    "wanprobe/lab/measure.py": "ping's 'time=N ms' lines",
    "collectors/sysfs_infiniband.py": "the kernel's rate file, 'N Gb/sec (4X EDR)'",
}


def unit_parsing(source: str) -> list[int]:
    """Lines that cut a unit suffix off text or match one with a regular expression."""
    out = []
    for n in ast.walk(parse(source)):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)):
            continue
        texts = [c.value for a in n.args for c in ast.walk(a)
                 if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        if n.func.attr in ("endswith", "removesuffix", "rstrip", "rsplit", "rpartition"):
            out += [n.lineno] if any(re.match(UNIT, t.strip()) for t in texts) else []
        elif ast.unparse(n.func.value) == "re" and texts:
            out += [n.lineno] if UNIT_IN_PATTERN.search(texts[0]) else []
    return out


def test_unit_parsing_is_seen():
    src = ('x.endswith("mbit")\nre.compile(r"(\\d+)\\s*gbit")\nx.endswith("bytes")\n'
           're.match(r"time=([\\d.]+) ms", s)\nx.removesuffix("MS")\nprint("e.g. 10gbit")\n')
    assert unit_parsing(src) == [1, 2, 4, 5]


def test_units_is_the_only_parser_of_units():
    """"`units.py` is the only parser of units (`60ms`, `100mbit`, `AF31`)": nobody else cuts a
    unit off a string or matches one, but the foreign formats of FOREIGN_FORMATS."""
    seen = {rel(p) for p in modules() if unit_parsing(text(p))} - {"wanprobe/units.py"}
    assert seen == set(FOREIGN_FORMATS)


# -- who imports whom --------------------------------------------------------------------------

FOUNDATION = set(dict(LAYERS)["foundation"])


def above_foundation(graph: dict[str, set[str]], package: str) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in graph.items() if package_of(m) == package
                  for d in deps if package_of(d) != package and d not in FOUNDATION)


def test_above_foundation_is_seen():
    g = {"collectors.x": {"wanprobe.errors", "collectors.y", "wanprobe.probe.peer"}}
    assert above_foundation(g, "collectors") == ["collectors.x -> wanprobe.probe.peer"]


def test_collectors_read_the_host_and_nothing_else():
    """"`collectors/` read the host and nothing else": of the package they import only the
    foundation (no prober, no engine, no judge, no tuner)."""
    assert above_foundation(graph(), "collectors") == []


def importers(graph: dict[str, set[str]], package: str) -> set[str]:
    return {package_of(m) for m, deps in graph.items() if package_of(m) != package
            and any(package_of(d) == package for d in deps)}


def test_importers_are_seen():
    g = {"wanprobe.commands.a": {"wanprobe.services.b"}, "wanprobe.services.b": {"collectors.c"},
         "wanprobe.fleet.d": set()}
    assert importers(g, "wanprobe.services") == {"wanprobe.commands"}


def test_services_sit_between_the_packages_and_their_users():
    """"`wanprobe/services/` composes each capability once, for the commands, the daemon and the
    demo alike" (the demo and `lab/tune_check.py` through the command): "Services import the
    measuring, judging and reporting packages; nothing below imports a service"."""
    g = graph()
    assert importers(g, "wanprobe.services") == {"wanprobe.commands", "wanprobe.daemon"}
    used = {package_of(d) for m, deps in g.items() if package_of(m) == "wanprobe.services"
            for d in deps}
    assert {"wanprobe.probe", "wanprobe.throughput", "collectors", "wanprobe.diagnose",
            "wanprobe.report"} <= used


def from_json_without_shape_checks(sources: dict[str, str]) -> list[str]:
    return sorted(name for name, src in sources.items() if "def from_json" in src
                  and "wanprobe.json_fields" not in package_imports(src, "wanprobe.json_fields"))


def test_from_json_without_shape_checks_is_seen():
    assert from_json_without_shape_checks({
        "a": "from wanprobe.json_fields import required\ndef from_json(d): ...",
        "b": "def from_json(d): return d", "c": "x = 1"}) == ["b"]


def test_json_fields_is_the_one_set_of_shape_checks():
    """"`json_fields.py` is the one set of shape checks every result's `from_json` uses": a
    probe or throughput module that decodes a result imports it. The control channel's
    `TestRequest.from_json` (protocol.py) and `EdgeRequest.from_json` (ring_op.py) decode a
    peer's request, not a result: each field refused with the reason the peer is told."""
    sources = {rel(p): text(p) for d in ("probe", "throughput")
               for p in sorted((REPO / "wanprobe" / d).glob("*.py"))}
    assert from_json_without_shape_checks(sources) == ["wanprobe/throughput/protocol.py",
                                                       "wanprobe/throughput/ring_op.py"]


# -- the one home of ... -----------------------------------------------------------------------

def calls_of(source: str, owner: str, names: tuple[str, ...]) -> list[int]:
    """Lines calling ``<something>.<name>`` (``owner`` "" for any) of ``names``."""
    return [n.lineno for n in ast.walk(parse(source)) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr in names
            and (not owner or ast.unparse(n.func.value) == owner)]


def test_calls_of_are_seen():
    src = "yaml.dump(d)\nsock.listen(5)\nv.listen('k', x)\nyaml.safe_load(t)\n"
    assert calls_of(src, "yaml", ("dump", "safe_dump")) == [1]
    assert calls_of(src, "", ("listen",)) == [2, 3]


def test_yaml_text_is_the_one_yaml_writer():
    """"`yaml_text.py` (the one YAML writer, PyYAML)"."""
    dumps = ("dump", "dump_all", "safe_dump", "safe_dump_all")
    assert {rel(p) for p in modules() if calls_of(text(p), "yaml", dumps)} == {
        "wanprobe/fleet/yaml_text.py"}


def test_accept_backoff_owns_the_listening_sockets():
    """"`accept_backoff.py` is the accept loop of every TCP listener ..., its listening socket
    (`listen_tcp`)": no other module listens or serves (a config's ``v.listen("key", ...)`` is
    a validator, told apart by its string argument)."""
    def listens(src: str) -> bool:
        tree_ = parse(src)
        return bool(calls_of(src, "", ("start_server", "create_server", "accept"))) or any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == "listen" and not (n.args and isinstance(n.args[0], ast.Constant)
                                                 and isinstance(n.args[0].value, str))
            for n in ast.walk(tree_))

    assert {rel(p) for p in modules() if listens(text(p))} == {"wanprobe/accept_backoff.py"}


def test_the_datapath_worker_is_stdlib_only():
    """"`datapath_worker.py` the worker itself (stdlib only: ...)"."""
    path = REPO / "wanprobe/throughput/datapath_worker.py"
    tops = {n.split(".")[0] for n in _all_imports(text(path))}
    assert tops - set(sys.stdlib_module_names) - {"__future__"} == set()


def _all_imports(source: str) -> set[str]:
    out = set()
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_one_finding_and_the_methods():
    """"the one `Finding` type (`wanprobe/diagnose/finding.py`, re-exported by
    `wanprobe/report/document.py`)"; a probe method goes into "`probe/api.METHODS` ... and
    `mesh/peer.METHODS`"; "`snapshot.py` runs them all (`contract.run_all`, over
    `contract.COLLECTORS`)", which holds every `collect_x` of `contract.py`."""
    from collectors import contract
    from wanprobe.diagnose import finding
    from wanprobe.mesh import peer
    from wanprobe.probe import api
    from wanprobe.report import document

    assert document.Finding is finding.Finding and document.Knob is finding.Knob
    assert set(api.METHODS) == set(peer.METHODS)
    defined = {n for n, v in vars(contract).items() if n.startswith("collect_")
               and getattr(v, "__module__", "") == contract.__name__}
    assert {fn.__name__ for _, fn in contract.COLLECTORS} == defined
    assert re.search(r"^from collectors\.contract import .*\brun_all\b",
                     text(REPO / "collectors/snapshot.py"), re.M)
    assert re.search(r"for \w+, \w+ in COLLECTORS", inspect.getsource(contract.run_all))


def plain_consoles(source: str) -> list[int]:
    """Lines building rich's own Console, not ``safe_text.SafeConsole``."""
    if not re.search(r"^from rich\.console import .*\bConsole\b", source, re.M):
        return []
    return [n.lineno for n in ast.walk(parse(source)) if isinstance(n, ast.Call)
            and getattr(n.func, "id", None) == "Console"]


def test_plain_consoles_are_seen():
    assert plain_consoles("from rich.console import Console\nc = Console()\n") == [2]
    assert plain_consoles("from wanprobe.safe_text import SafeConsole as Console\n"
                          "c = Console()\n") == []


def test_every_command_prints_with_the_safe_console():
    """"`SafeConsole`, the rich Console every command prints with"."""
    cli = [p for p in modules() if p.parent.name == "commands"
           or p.name in ("cli.py", "demo_story.py")]
    assert [rel(p) for p in cli if plain_consoles(text(p))] == []
