"""Files a user names: JSON read without trusting it, and output paths checked before work.

Reading JSON that a user hands us (reports, plans, journals):

``json.loads`` alone accepts ``NaN`` and ``Infinity`` (not JSON, RFC 8259 §6), turns ``1e999`` into
``inf``, raises ``RecursionError`` on a document nested 100,000 deep and ``ValueError`` on an
integer of more than 4,300 digits. Here each of those is one ``ConfigError`` line naming the file,
and a document deeper than ``MAX_DEPTH`` is refused before any recursive code walks it.

Output paths (``check_output_path``) are checked before a command measures anything, so a
directory, a missing parent or an unprintable name is refused in a second, not after a test.
"""

from __future__ import annotations

import json
import os
import select
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wanprobe.errors import ConfigError, UsageError, shown

MAX_DEPTH = 64                 # reports nest about 8 deep; the schema validator recurses per level
MAX_FILE_BYTES = 64 * 2**20    # a report is tens of kB
U64_MAX = 2**64 - 1            # NIC counters are u64; a larger integer is not a measurement
MIN_KEY_CHARS = 16             # a shared STAMP/throughput key (also the daemon's hmac_key rule)
MAX_KEY_BYTES = 4096           # a key file is a line of text; /dev/zero is not one


class _Refused(ValueError):
    pass


def _constant(name: str) -> float:
    raise _Refused(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _Refused(f"number {shown(text, 40)} is out of range")
    return value


def _int(text: str) -> int:
    if len(text) > 21:
        raise _Refused(f"integer {shown(text, 40)} is out of range")
    value = int(text)
    if abs(value) > U64_MAX:
        raise _Refused(f"integer {text} is out of range (beyond 64 bits)")
    return value


def _depth_ok(doc: Any) -> bool:
    """True if no array/object lies deeper than MAX_DEPTH (iterative: no recursion to exhaust)."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > MAX_DEPTH:
                return False
            children = node.values() if isinstance(node, dict) else node
            stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return True


def json_objects(doc: Any) -> Iterator[dict]:
    """Every object in a JSON document, ``doc`` itself first, in document order (depth first;
    iterative, like ``_depth_ok``)."""
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list):
            stack.extend(reversed(node))


def parse_json(text: str | bytes, what: str) -> Any:
    """Parse strict JSON; every problem is ``ConfigError("{what}: ...")``."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{what}: not UTF-8 text (byte {exc.start})") from None
    try:
        doc = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except _Refused as exc:
        raise ConfigError(f"{what}: not JSON: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{what}: not JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise ConfigError(f"{what}: nested too deeply (limit {MAX_DEPTH} levels)") from None
    if not _depth_ok(doc):
        raise ConfigError(f"{what}: nested too deeply (limit {MAX_DEPTH} levels)")
    return doc


def _label(what: str, p: Path) -> str:
    return f"{what} {shown(str(p))}" if len(str(p)) > 200 else f"{what} {p}"


READ_TIMEOUT_S = 5.0  # a FIFO or terminal given as an input file gets this long to deliver


def _read_stream(fd: int, max_bytes: int, label: str) -> bytes:
    """Read a FIFO or character device opened O_NONBLOCK: at most ``max_bytes + 1`` bytes, until
    EOF, within READ_TIMEOUT_S (``--hmac-key-file <(cat key)`` works; a FIFO nobody writes is
    refused instead of blocking forever)."""
    deadline = time.monotonic() + READ_TIMEOUT_S
    chunks, size = [], 0
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while size <= max_bytes:
        try:
            chunk = os.read(fd, max_bytes + 1 - size)
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConfigError(f"{label}: no data within {READ_TIMEOUT_S:g} s (a FIFO or "
                                  "terminal, not a file)") from None
            poller.poll(left * 1e3)
            continue
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _open_input(p: Path, label: str) -> int:
    try:
        return os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"{label}: cannot read: no such file") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{label}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None


def read_bytes(path: str | Path, what: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """A file's bytes, at most ``max_bytes`` (``/dev/zero`` or a runaway log is refused, not
    read into memory); errors name ``what`` and the path, on one line. Opening never blocks
    (O_NONBLOCK: a FIFO without a writer); a FIFO or character device is read with a byte and
    a time bound (READ_TIMEOUT_S); a directory, socket or block device is refused."""
    p = Path(path)
    label = _label(what, p)
    fd = _open_input(p, label)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ConfigError(f"{label}: cannot read: is a directory")
        if stat.S_ISREG(mode):
            with os.fdopen(os.dup(fd), "rb") as fh:
                data = fh.read(max_bytes + 1)
        elif stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
            data = _read_stream(fd, max_bytes, label)
        else:
            raise ConfigError(f"{label}: cannot read: not a file, FIFO or character device")
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ConfigError(f"{label}: larger than the limit of {max_bytes:,} bytes")
    return data


def read_text(path: str | Path, what: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """``read_bytes`` decoded as UTF-8; undecodable bytes are one ConfigError line."""
    data = read_bytes(path, what, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{_label(what, Path(path))}: not UTF-8 text (byte {exc.start})") from None


def read_json(path: str | Path, what: str) -> Any:
    """Read and parse a JSON file; errors name ``what`` and the path, on one line."""
    return parse_json(read_bytes(path, what), _label(what, Path(path)))


NAME_MAX = 255  # bytes in one path component (linux/limits.h)


def check_path_text(path: str | Path, what: str) -> Path:
    """Refuse, as one UsageError line, a path no file can have or no log should print: control
    characters (they garble the terminal and the journal), undecodable bytes, a component longer
    than NAME_MAX."""
    p = Path(path)
    text = str(p)
    label = f"{what} {shown(text)}"
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise UsageError(f"{label}: control characters in a file name")
    try:
        encoded = [len(part.encode("utf-8")) for part in p.parts]
    except UnicodeEncodeError:
        raise UsageError(f"{label}: not valid UTF-8") from None
    if max(encoded, default=0) > NAME_MAX:
        raise UsageError(f"{label}: a name longer than {NAME_MAX} bytes")
    return p


def check_output_path(path: str | Path, what: str) -> Path:
    """Refuse, as one error line, an output path that cannot be written: see
    ``check_path_text``; a directory; a parent that is missing or not a directory; what the
    output policy of ``atomic_file`` refuses (a device other than null, zero and full, a
    socket, an untrusted symlink).
    ``-`` is stdout."""
    from wanprobe.atomic_file import Refused, check_writable

    if str(path) == "-":
        return Path("-")
    p = check_path_text(path, what)
    label = f"{what} {shown(str(p))}"
    if p.is_dir():
        raise ConfigError(f"{label}: is a directory")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"{label}: directory {shown(str(parent))} does not exist")
    try:
        check_writable(p)
    except Refused as exc:
        raise ConfigError(f"{label}: {exc.strerror}") from None
    except OSError as exc:
        raise ConfigError(f"{label}: {exc.strerror or exc}") from None
    return p


def existing_dir(path: str | Path, what: str) -> Path:
    """``path`` if it is a directory (a ``--sys-root``, ``--proc-root``...), else one
    UsageError line naming the option and the path."""
    p = check_path_text(path, what)
    if not p.is_dir():
        raise UsageError(f"{what} {shown(str(p))} is not a directory")
    return p


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be the shared STAMP/throughput key, or None: the one length rule of the
    CLI's ``--hmac-key-file`` and the daemon's ``hmac_key`` / ``hmac_key_file``."""
    if len(key) < MIN_KEY_CHARS:
        return f"the key must be at least {MIN_KEY_CHARS} characters (got {len(key)})"
    return None


def read_key_file(path: str | Path, what: str) -> bytes:
    """The shared HMAC key (STAMP, RFC 8762 §4.4, and the throughput control channel) from a
    file: its content stripped of surrounding whitespace, held to :func:`key_problem`. Bounded in
    size and time (a FIFO or /dev/zero never hangs or fills memory). The one reader of the key
    file, for the CLI and the daemon; every problem is one ConfigError line naming ``what`` and
    the path."""
    raw = read_bytes(path, what, MAX_KEY_BYTES)
    try:
        key = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {shown(str(path))}: cannot read it: not UTF-8 text") from None
    problem = key_problem(key)
    if problem is not None:
        raise ConfigError(f"{what} {path}: {problem}")
    return key.encode()


def read_hmac_key_file(path: str | None, option: str = "--hmac-key-file") -> bytes | None:
    """The key of :func:`read_key_file` for a command's ``option`` (a UsageError line), None
    without one. The key is never taken from the command line, where other users could read
    it."""
    if path is None:
        return None
    try:
        return read_key_file(path, option)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
