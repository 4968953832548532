"""Compile the test modules, assertions rewritten, once before the xdist workers start.

Every worker collects every test file. In a fresh checkout each of the five compiled all of
them at once (~4.7 s of CPU each, 23 s on two cores); here the stale ones are compiled once, on
every core, into the cache pytest's import hook reads (``__pycache__/NAME.<tag>-pytest-<v>.pyc``,
checked by source hash, PEP 552). It uses pytest's own rewriter, so the code is what the hook
would have written; if pytest's internals move, nothing is compiled and the workers compile as
before (slower, same result)."""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def _compile(path: str) -> None:
    from _pytest.assertion import rewrite

    fn = Path(path)
    source_hash, co = rewrite._rewrite_test(fn, None)  # config None: no pass hook (checked)
    pyc = rewrite.get_cache_dir(fn) / (fn.name[:-3] + rewrite.PYC_TAIL)
    if rewrite.try_makedirs(pyc.parent):
        rewrite._write_pyc(_NoTrace(), co, source_hash, pyc)


class _NoTrace:
    """The one thing ``_write_pyc`` asks of its state: a tracer."""

    @staticmethod
    def trace(_message: str) -> None:
        return None


def stale_test_modules(tests: Path) -> list[str]:
    """Test modules (and conftest) whose rewritten bytecode is missing or out of date."""
    from _pytest.assertion import rewrite

    names = ["conftest.py", *sorted(p.name for p in tests.glob("test_*.py"))]
    stale = []
    for name in names:
        fn = tests / name
        pyc = rewrite.get_cache_dir(fn) / (fn.name[:-3] + rewrite.PYC_TAIL)
        if fn.is_file() and rewrite._read_pyc(fn, pyc) is None:
            stale.append(str(fn))
    return stale


def precompile(config, tests: Path) -> int:
    """Compile the stale test modules on every core; how many were compiled (0 when pytest's
    internals are not the ones this knows, or the assertion pass hook is on)."""
    with contextlib.suppress(ImportError, AttributeError, ValueError):
        if config.getini("enable_assertion_pass_hook") or config.getoption("assertmode") != "rewrite":
            return 0
        stale = stale_test_modules(tests)
        if stale:
            with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                list(pool.map(_compile, stale, chunksize=8))
        return len(stale)
    return 0
