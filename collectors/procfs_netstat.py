"""TCP/IP stack counters from ``<proc_root>/net/snmp`` and ``<proc_root>/net/netstat``.

Both files are pairs of lines ``Prefix: Name1 Name2 ...`` / ``Prefix: v1 v2 ...``
(``net/ipv4/proc.c``: ``snmp_seq_show``, ``netstat_seq_show``). Values are unsigned long MIB
counters (wrap at the native word width) except a few signed gauges (``Tcp: MaxConn`` is -1,
``RtoMin``/``RtoMax``/``RtoAlgorithm``/``CurrEstab`` are not counters). ``tcp`` merges ``Tcp:`` and
``TcpExt:`` (their names do not collide: RetransSegs, OutSegs, TCPLostRetransmit, TCPTimeouts,
TCPSynRetrans, TCPBacklogDrop, ListenDrops, ...); ``ip`` merges ``Ip:`` and ``IpExt:`` (ECN:
InECT0Pkts, InCEPkts); ``udp`` is ``Udp:``.
"""

from __future__ import annotations

from pathlib import Path

from collectors.sample import CollectError, CounterSet, SourceStatus
from collectors.sysfs_net import NATIVE_LONG_BITS
from collectors.sysfs_read import MISSING, read_text

SOURCE = "procfs_netstat"
GAUGES = frozenset({"RtoAlgorithm", "RtoMin", "RtoMax", "MaxConn", "CurrEstab", "Forwarding",
                    "DefaultTTL"})
GROUPS = {"tcp": ("Tcp", "TcpExt"), "udp": ("Udp",), "ip": ("Ip", "IpExt")}


def parse_proc_net_table(text: str, path: str) -> tuple[dict[str, dict[str, int]], list[CollectError]]:
    """Parse a header/value paired file into ``{prefix: {name: value}}``.

    A value line shorter than its header (truncated file) keeps the values it has and reports
    the missing names; a non-numeric value is reported per counter; a header without a value
    line is reported once.
    """
    tables: dict[str, dict[str, int]] = {}
    errors: list[CollectError] = []
    lines = [ln for ln in text.splitlines() if ln.strip()]
    i = 0
    while i < len(lines):
        head = lines[i]
        prefix, _, rest = head.partition(":")
        names = rest.split()
        if not _ or not names:
            errors.append(CollectError(SOURCE, path, f"garbage line {head[:60]!r}"))
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith(prefix + ":"):
            errors.append(CollectError(SOURCE, path, f"truncated: no values for {prefix}"))
            i += 1
            continue
        values = lines[i + 1].partition(":")[2].split()
        table = tables.setdefault(prefix, {})
        for k, name in enumerate(names):
            if k >= len(values):
                errors.append(CollectError(SOURCE, path, "truncated: value missing",
                                           counter=f"{prefix}.{name}"))
                continue
            try:
                table[name] = int(values[k])
            except ValueError:
                errors.append(CollectError(SOURCE, path, f"not an integer: {values[k][:40]!r}",
                                           counter=f"{prefix}.{name}"))
        i += 2
    return tables, errors


def collect_netstat(proc_root: Path) -> tuple[dict[str, CounterSet], list, list]:
    """``({"tcp": CounterSet, "udp": ..., "ip": ...}, errors, statuses)``; absent files →
    ``no_data`` and the group is left out."""
    tables: dict[str, dict[str, int]] = {}
    origin: dict[str, str] = {}
    errors: list[CollectError] = []
    statuses: list[SourceStatus] = []
    for fname in ("snmp", "netstat"):
        path = proc_root / "net" / fname
        text, why = read_text(path)
        if text is None:
            if why == MISSING:
                statuses.append(SourceStatus(SOURCE, "no_data", str(path), "file absent"))
            else:
                errors.append(CollectError(SOURCE, str(path), why))
                statuses.append(SourceStatus(SOURCE, "error", str(path), why))
            continue
        parsed, errs = parse_proc_net_table(text, str(path))
        errors.extend(errs)
        statuses.append(SourceStatus(SOURCE, "error" if errs else "ok", str(path),
                                     f"{len(errs)} unparsable values" if errs else ""))
        for prefix, table in parsed.items():
            tables.setdefault(prefix, {}).update(table)
            origin[prefix] = str(path)
    out: dict[str, CounterSet] = {}
    for group, prefixes in GROUPS.items():
        values: dict[str, int] = {}
        paths = []
        locations: dict[str, str] = {}
        for prefix in prefixes:
            if prefix in tables:
                values.update(tables[prefix])
                paths.append(origin[prefix])
                locations.update({k: f"{origin[prefix]}#{prefix}.{k}" for k in tables[prefix]})
        if paths:
            out[group] = CounterSet(
                ",".join(sorted(set(paths))), values, locations=locations,
                widths={k: NATIVE_LONG_BITS for k in values if k not in GAUGES},
                gauges=frozenset(k for k in values if k in GAUGES))
    return out, errors, statuses
