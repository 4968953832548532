"""Parser for captured ``ethtool -S <if>`` text (fixture trees: ``<ethtool_root>/<if>/statistics``)
and the shared helpers that turn ``(name, value)`` pairs from either backend (this text or the
SIOCETHTOOL ioctl) into a :class:`~collectors.sample.CounterSet`.

Text format (ethtool's ``dump_stats``): a ``NIC statistics:`` header, then one
``<spaces><name>: <u64>`` per line. Names may contain spaces, dots (ice ``.nic``) or a
``[N]: `` ring prefix (bnxt), so the value is what follows the *last* ``": "``. A file without
the header is garbage (e.g. a captured ``ERROR: ...``); a line without a value is truncated.
"""

from __future__ import annotations

from pathlib import Path

from collectors.sample import CollectError, CounterSet
from collectors.sysfs_read import MISSING, read_text

SOURCE = "ethtool_text"
HEADER = "NIC statistics:"


def ethtool_unit(name: str) -> str | None:
    """Unit of an ethtool counter from its name, None for a plain count."""
    name = name.removesuffix(".nic")
    if name.endswith(("_duration", "_duration_us")):
        return "us"
    if name.endswith(("bytes", "bytes_phy", "_octets")) or "_bytes_" in name:
        return "bytes"
    if name.endswith(("_bits_phy", "_bits", "corrected_bits")):
        return "bits"
    return None


def counterset_from_pairs(pairs: list[tuple[str, int]], path: str) -> CounterSet:
    """Build the ethtool CounterSet. Repeated names (some drivers repeat per-queue names) keep
    every value: the 2nd occurrence is ``name#2``, and so on. Values are u64 (width 64)."""
    values: dict[str, int] = {}
    for name, value in pairs:
        key, n = name, 1
        while key in values:
            n += 1
            key = f"{name}#{n}"
        values[key] = value
    units = {k: u for k in values if (u := ethtool_unit(k.split("#")[0])) is not None}
    return CounterSet(path, values, widths={k: 64 for k in values}, units=units)


def parse_ethtool_stats(text: str, path: str = "") -> tuple[list[tuple[str, int]], list[CollectError]]:
    """``(pairs, errors)`` from ``ethtool -S`` output; bad lines are reported one by one."""
    pairs: list[tuple[str, int]] = []
    errors: list[CollectError] = []
    seen_header = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not seen_header:
            if line == HEADER:
                seen_header = True
                continue
            errors.append(CollectError(SOURCE, path, f"garbage: expected {HEADER!r}, got {line[:60]!r}"))
            return [], errors
        name, sep, value = line.rpartition(":")
        name = name.strip()
        if not sep or not name:
            errors.append(CollectError(SOURCE, path, f"truncated line {line[:60]!r}", counter=line[:60]))
            continue
        value = value.strip()
        try:
            pairs.append((name, int(value, 10)))
        except ValueError:
            reason = "truncated: value missing" if not value else f"not an integer: {value[:40]!r}"
            errors.append(CollectError(SOURCE, path, reason, counter=name))
    if not seen_header:
        errors.append(CollectError(SOURCE, path, "truncated: empty file"))
    return pairs, errors


def read_ethtool_capture(ethtool_root: Path, ifname: str) -> tuple[CounterSet | None, list[CollectError]]:
    """Read ``<ethtool_root>/<ifname>/statistics``; ``(None, [])`` when there is no capture."""
    path = ethtool_root / ifname / "statistics"
    text, why = read_text(path)
    if text is None:
        return None, ([] if why == MISSING else [CollectError(SOURCE, str(path), why)])
    pairs, errors = parse_ethtool_stats(text, str(path))
    if not pairs and errors:
        return None, errors
    return counterset_from_pairs(pairs, str(path)), errors
