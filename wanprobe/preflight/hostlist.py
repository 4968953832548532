"""A job's host list, as launchers write it: one host per line, with what Slurm and the
torchrun/DeepSpeed launchers put there.

Accepted, one entry per line (``#`` starts a comment, blank lines are skipped):

- ``host``, ``host:port`` (the port of its STAMP reflector, default 862), an IP address,
  ``[2001:db8::1]:862``;
- Slurm's compressed host lists (``SLURM_JOB_NODELIST``, ``scontrol show hostlist``):
  ``gpu[01-04,07]``, several bracket groups (``r[1-2]-n[01-02]``) and comma-separated lists
  (``a[1-2],b3``), expanded the way ``scontrol show hostnames`` does (zero padding kept);
- a DeepSpeed/OpenMPI hostfile line ``host slots=8`` (what torchrun jobs launched by DeepSpeed
  use), the slots ignored.

The whole list is refused, as one line naming the line, when an entry is not one of these,
when a host appears twice, or when it holds more hosts than ``max_hosts``; the count is
checked before a range is expanded, so ``node[1-99999999]`` costs nothing.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from wanprobe.errors import UsageError, shown

DEFAULT_PORT = 862
MAX_LINE_CHARS = 4096
# A hostname: RFC 1123 labels (letters, digits, '-'; '_' as some clusters use), dots between
_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?")
_RANGE = re.compile(r"\[([0-9,\-]{1,512})\]")
_SLOTS = re.compile(r"\s+(slots|max_slots|max-slots)=\d{1,6}(\s+(slots|max_slots|max-slots)=\d{1,6})?\s*$")


@dataclass(frozen=True)
class HostEntry:
    """One host of the job: as written (expanded), the reflector port, the line it came from."""

    host: str
    port: int
    line: int

    @property
    def key(self) -> str:
        return self.host.lower().rstrip(".")


def _split_top(text: str) -> list[str]:
    """``a[1-2,5],b`` → ``["a[1-2,5]", "b"]``: commas outside brackets separate entries."""
    out, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [x.strip() for x in out if x.strip()]


def _ranges(body: str) -> list[tuple[int, int, int]]:
    """``01-04,07`` → [(1, 4, width 2), (7, 7, 2)]; ValueError when it is not that."""
    out = []
    for part in body.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()) or len(lo) > 9 or len(hi) > 9:
            raise ValueError(part)
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise ValueError(part)
        out.append((a, b, len(lo) if lo.startswith("0") and len(lo) > 1 else 0))
    return out


def _count(pattern: str) -> int:
    """How many names a Slurm pattern expands to (without expanding it)."""
    n = 1
    for m in _RANGE.finditer(pattern):
        n *= sum(b - a + 1 for a, b, _ in _ranges(m.group(1)))
    return n


def _expand(pattern: str) -> list[str]:
    m = _RANGE.search(pattern)
    if m is None:
        return [pattern]
    head, tail = pattern[:m.start()], pattern[m.end():]
    rest = _expand(tail)
    return [f"{head}{i:0{w}d}{t}" for a, b, w in _ranges(m.group(1)) for i in range(a, b + 1)
            for t in rest]


def _host_port(text: str) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]:port``, a bare IPv6 address; ValueError otherwise."""
    host, port = text, DEFAULT_PORT
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(text)
        if rest:
            port = int(rest[1:])
        ipaddress.IPv6Address(host)
    elif text.count(":") == 1:
        host, _, p = text.partition(":")
        port = int(p) if p.isdigit() and len(p) <= 5 else -1
    elif ":" in text:
        ipaddress.IPv6Address(text)  # bare IPv6
    if not 1 <= port <= 65535:
        raise ValueError(text)
    if ":" not in host and not _NAME.fullmatch(host):
        raise ValueError(text)
    return host, port


class _TooMany(Exception):
    pass


def _line_entries(text: str, number: int, budget: int) -> list[HostEntry]:
    """The hosts of one line (comment stripped); UsageError naming the line otherwise."""
    text = _SLOTS.sub("", text)
    out: list[HostEntry] = []
    for item in _split_top(text):
        try:
            names = _expand_item(item, budget - len(out))
            out += [HostEntry(*_host_port(n), number) for n in names]
        except _TooMany:
            raise
        except (ValueError, RecursionError):
            raise UsageError(f"host list line {number}: {shown(item, 60)} is not a host, "
                             "host:port, Slurm host range or hostfile entry") from None
    return out


def _expand_item(item: str, budget: int) -> list[str]:
    """A Slurm pattern's names (at most ``budget``), or the item itself; ValueError when its
    brackets are neither a range nor an IPv6 literal."""
    if item.startswith("[") and ":" in item.split("]", 1)[0]:
        return [item]  # [2001:db8::1]:862
    if item.count("[") != item.count("]"):
        raise ValueError(item)
    if _count(item) > budget:
        raise _TooMany()
    names = _expand(item)
    if any("[" in x or "]" in x for x in names):
        raise ValueError(item)
    return names


def parse_host_list(text: str, *, max_hosts: int) -> list[HostEntry]:
    """Every host of the job once, in the order given. One UsageError line for a bad entry,
    a duplicate or more than ``max_hosts`` hosts."""
    hosts: list[HostEntry] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        if len(raw) > MAX_LINE_CHARS:
            raise UsageError(f"host list line {number}: longer than {MAX_LINE_CHARS} characters")
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            entries = _line_entries(line, number, max_hosts - len(hosts))
        except _TooMany:
            raise UsageError(f"host list: more than {max_hosts:,} hosts (at line {number}); a "
                             "preflight probes them all within its time bound: split the job "
                             "or raise --max-hosts") from None
        for e in entries:
            if e.key in seen:
                raise UsageError(f"host list line {number}: {shown(e.host, 60)} is listed twice "
                                 f"(also line {seen[e.key]})")
            seen[e.key] = number
        hosts += entries
    if not hosts:
        raise UsageError("host list: no hosts (one host or host:port per line)")
    return hosts
