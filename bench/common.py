"""What the benchmark scripts share: their command line, the root check, timing a call over
several runs, how a range over runs is printed, and a bare veth pair between two namespaces.

A script run as ``python bench/x.py`` has bench/ first on sys.path and imports this as
``common``; one a test loads by file (importlib) puts its own folder on sys.path first.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def parser(doc: str, *options: tuple, first_line: bool = False) -> argparse.ArgumentParser:
    """An argument parser described by ``doc``'s first paragraph (its first line with
    ``first_line``), with one option per ``(flag, default[, help])``: the option takes the
    default's type, a list default one or more values of its items' type, and a bool default
    makes a switch (``store_true``)."""
    ap = argparse.ArgumentParser(description=doc.split("\n" if first_line else "\n\n")[0])
    for flag, default, *text in options:
        if isinstance(default, bool):
            kind = {"action": "store_true"}
        elif isinstance(default, list):
            kind = {"type": type(default[0]), "nargs": "+", "default": default}
        else:
            kind = {"type": type(default), "default": default}
        ap.add_argument(flag, help=text[0] if text else None, **kind)
    return ap


def lacks_root(what: str = "network namespace") -> bool:
    """True, having said so on stderr, when this process is not root (``what`` needs it)."""
    if os.geteuid() == 0:
        return False
    print(f"needs root ({what})", file=sys.stderr)
    return True


def timed(fn: Callable[[], T], runs: int) -> tuple[list[float], T | None]:
    """The wall seconds (perf_counter) of each of ``runs`` calls of ``fn``, and what the last
    call returned (None when ``runs`` is 0)."""
    seconds: list[float] = []
    out = None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        seconds.append(time.perf_counter() - t0)
    return seconds, out


def span(values: Iterable[float], fmt: str = ".2f", sep: str = "-",
         hi_fmt: str | None = None) -> str:
    """``min-max`` of ``values``, both in format ``fmt`` (the maximum in ``hi_fmt`` when given,
    e.g. left-aligned in a column), joined by ``sep``."""
    values = list(values)
    return f"{min(values):{fmt}}{sep}{max(values):{hi_fmt or fmt}}"


@contextlib.contextmanager
def veth_pair(tag: str, addr_a: str, addr_b: str, prefix: int = 24) -> Iterator[tuple[str, str]]:
    """Two fresh namespaces ``<tag>a`` and ``<tag>b`` joined by a veth pair (``wp0``/``wp1``)
    with ``addr_a``/``addr_b``: the host's own floor, no delay line. Both are deleted on exit,
    also on error (CalledProcessError when one cannot be made)."""
    a, b = f"{tag}a", f"{tag}b"
    try:
        for cmd in (["ip", "netns", "add", a], ["ip", "netns", "add", b],
                    ["ip", "link", "add", "wp0", "netns", a, "type", "veth", "peer", "name",
                     "wp1", "netns", b],
                    ["ip", "-n", a, "addr", "add", f"{addr_a}/{prefix}", "dev", "wp0"],
                    ["ip", "-n", b, "addr", "add", f"{addr_b}/{prefix}", "dev", "wp1"],
                    ["ip", "-n", a, "link", "set", "wp0", "up"],
                    ["ip", "-n", b, "link", "set", "wp1", "up"]):
            subprocess.run(cmd, check=True, capture_output=True)
        yield a, b
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
