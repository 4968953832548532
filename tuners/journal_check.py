"""A journal is untrusted input: every field is checked with the plan's allow-lists before any
recovery or rollback acts on it (issue 19).

A journal file tells root what to write where: a sysctl key becomes a path under /proc/sys
(``key_path`` joins the dot-split parts, so ``net.ipv4./tmp/x`` was ``/tmp/x``), the saved "old"
nftables objects are added back, and the persist file is restored. So a journal is held to the
same rules as a plan, and stricter where a plan never goes:

- sysctl keys from ``tuners.sysctl.SPECS`` only (and ``[a-z0-9_.]``), values of the key's shape;
- link and roce keys through the tuners' own key parsers (interface names as the kernel's
  ``dev_valid_name``), values numbers or the tuner's words;
- dscp: the new value a valid classifier list (a rollback only compares it); the old value
  (what a rollback writes) ``null``, a
  classifier list, or a saved state of the tuner's own schema — nftables objects of table
  ``inet wanprobe`` with its one chain and rules of the matches the tuner writes, or iptables
  ``-S`` lines of the ``WANPROBE`` chain with the flags the tuner writes — whose rules decode to
  classifiers that pass the same checks (no DSCP 48-63 unless allowed, never "everything");
- the persist file only ``<configured sysctl.d>/90-wanprobe.conf``, its saved text only
  ``key = value`` lines of SPECS keys.

A journal that fails is reported in one line and left alone (``JournalStore.refused``).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuners import dscp, dscp_nft, link, roce
from tuners.sysctl import SPECS
from wanprobe.errors import ConfigError, shown

if TYPE_CHECKING:
    from wanprobe.probe.access import DscpPolicy

STATES = ("applying", "applied", "failed", "recovered", "rolled_back", "rollback_incomplete")
STATUSES = ("pending", "writing", "written", "restored", "skipped")
PERSIST_NAME = "90-wanprobe.conf"
MAX_ENTRIES = 256           # a plan touches a handful of keys
MAX_VALUE_CHARS = 64 * 1024  # an nft listing of one small table
SYSCTL_KEY = re.compile(r"[a-z0-9_]+(\.[a-z0-9_]+)+")
WORD = re.compile(r"[A-Za-z0-9_]{1,16}")
NUMBERS = re.compile(r"\d{1,20}( \d{1,20}){0,2}")


def _sysctl(key: str, values: list[str]) -> None:
    spec = SPECS.get(key)
    if spec is None or not SYSCTL_KEY.fullmatch(key):
        raise ConfigError(f"sysctl key {shown(key)} is not one wanprobe manages")
    pattern = WORD if spec.kind in ("cc", "qdisc") else NUMBERS
    for v in values:
        if not pattern.fullmatch(" ".join(v.split())):
            raise ConfigError(f"sysctl {key}: value {shown(v)} is not a {spec.kind} value")


def _link(key: str, values: list[str]) -> None:
    link.split_key(key)
    for v in values:
        if not NUMBERS.fullmatch(v) or " " in v:
            raise ConfigError(f"link {shown(key)}: value {shown(v)} is not a number")


def _roce(key: str, values: list[str]) -> None:
    _, what = roce.parse_key(key)
    allowed = (("dscp", "pcp") if what == "trust" else ("0", "1") if what.startswith("ecn")
               else None)
    for v in values:
        if allowed is None:
            roce.pfc_value(v)
        elif v not in allowed:
            raise ConfigError(f"roce {shown(key)}: value {shown(v)} is not one of {allowed}")


# -- dscp saved states ------------------------------------------------------------------------
_RIGHT_SCALARS = (str, int)
# per left-hand side kind: its fields and the values each may take (``level``: any)
_LEFT: dict[str, dict[str, tuple[str, ...]]] = {
    "meta": {"key": ("nfproto", "l4proto", "skuid")},
    "payload": {"protocol": ("ip", "ip6", "tcp", "udp", "th"), "field": ("daddr", "dport")},
    "socket": {"key": ("cgroupv2",)}}


def _right(value: Any, depth: int = 0) -> None:
    """A match's right-hand side: a scalar, a prefix, a range or a set of those."""
    if isinstance(value, _RIGHT_SCALARS) and not isinstance(value, bool):
        return
    if isinstance(value, dict) and len(value) == 1 and depth < 2:
        (kind, body), = value.items()
        if kind == "prefix" and isinstance(body, dict) and set(body) == {"addr", "len"} \
                and isinstance(body["addr"], str) and isinstance(body["len"], int):
            return
        if kind == "range" and isinstance(body, list) and len(body) == 2 \
                and all(isinstance(x, int) and not isinstance(x, bool) for x in body):
            return
        if kind == "set" and isinstance(body, list) and len(body) <= 1024:
            for item in body:
                _right(item, depth + 1)
            return
    raise ConfigError(f"dscp saved rule: match value {shown(value, 60)} is not one the tuner writes")


def _expr(e: Any) -> None:
    if not isinstance(e, dict) or len(e) != 1:
        raise ConfigError("dscp saved rule: a statement is not a one-key object")
    (kind, body), = e.items()
    if kind == "match" and isinstance(body, dict) and set(body) == {"op", "left", "right"}:
        left = body["left"]
        if body["op"] != "==" or not isinstance(left, dict) or len(left) != 1:
            raise ConfigError("dscp saved rule: a match the tuner does not write")
        (lkind, lbody), = left.items()
        shape = _LEFT.get(lkind)
        if shape is None or not isinstance(lbody, dict) or any(
                k in shape and lbody.get(k) not in shape[k] for k in lbody) \
                or not set(shape) <= set(lbody) or not set(lbody) <= set(shape) | {"level"}:
            raise ConfigError(f"dscp saved rule: match on {shown(left, 60)} is not one the tuner writes")
        _right(body["right"])
        return
    if kind == "mangle" and isinstance(body, dict) and set(body) == {"key", "value"} \
            and body["key"] in ({"payload": {"protocol": "ip", "field": "dscp"}},
                                {"payload": {"protocol": "ip6", "field": "dscp"}}) \
            and isinstance(body["value"], _RIGHT_SCALARS):
        return
    raise ConfigError(f"dscp saved rule: statement {shown(kind)} is not one the tuner writes")


def _nft_objects(objects: Any) -> list[dscp_nft.RuleValues]:
    """The rule values of a saved ``nft -j list table inet wanprobe``, schema-checked."""
    if not isinstance(objects, list) or len(objects) > 1024:
        raise ConfigError("dscp saved state is not a list of nftables objects")
    rules = []
    for obj in objects:
        if not isinstance(obj, dict) or len(obj) != 1 or next(iter(obj)) not in dscp_nft.KINDS:
            raise ConfigError("dscp saved state: only the table, its chain and rules may be restored")
        (kind, body), = obj.items()
        if not isinstance(body, dict) or body.get("family") != "inet":
            raise ConfigError(f"dscp saved {kind}: not of family inet")
        if kind == "table" and body != dscp_nft.TABLE:
            raise ConfigError(f"dscp saved table {shown(body.get('name'))} is not inet wanprobe")
        if kind == "chain" and body != dscp_nft.CHAIN:
            raise ConfigError("dscp saved chain is not the tuner's output chain")
        if kind == "rule":
            extra = set(body) - {"family", "table", "chain", "comment", "expr"}
            if extra or body.get("table") != "wanprobe" or body.get("chain") != "out" \
                    or not isinstance(body.get("expr"), list) \
                    or not isinstance(body.get("comment", ""), str):
                raise ConfigError("dscp saved rule is not in the tuner's table and chain")
            for e in body["expr"]:
                _expr(e)
            try:
                rules.append(dscp_nft.rule_values(body["expr"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigError(f"dscp saved rule does not decode: {exc}") from None
    return rules


_IPT_FLAGS = {"-d": r"[0-9A-Fa-f.:/]{1,50}", "-p": r"tcp|udp", "-m": r"tcp|udp|owner|cgroup|comment",
              "--dport": r"\d{1,5}(:\d{1,5})?", "--uid-owner": r"\d{1,10}",
              "--path": r"/?[A-Za-z0-9_.@:+/-]{1,4096}", "--comment": r"wanprobe:[0-9a-f]{1,64}",
              "-j": r"DSCP", "--set-dscp": r"0x[0-9a-fA-F]{1,2}"}


def _ipt_lines(lines: Any) -> list[dscp_nft.RuleValues]:
    """The rule values of saved ``iptables -S WANPROBE`` lines, schema-checked."""
    if not isinstance(lines, dict) or not set(lines) <= {"ip", "ip6"}:
        raise ConfigError("dscp saved state is not iptables lines per family")
    out: list[dscp_nft.RuleValues] = []
    for fam, rows in lines.items():
        if not isinstance(rows, list) or len(rows) > 1024 or not all(isinstance(r, str) for r in rows):
            raise ConfigError("dscp saved state: iptables lines must be a list of text")
        for row in rows:
            try:
                args = shlex.split(row)
            except ValueError:
                raise ConfigError(f"dscp saved iptables line {shown(row, 60)} does not parse") from None
            if args == ["-N", dscp.CHAIN]:
                continue
            pairs = args[2:]
            if args[:2] != ["-A", dscp.CHAIN] or len(pairs) % 2 or not all(
                    flag in _IPT_FLAGS and re.fullmatch(_IPT_FLAGS[flag], value)
                    for flag, value in zip(pairs[::2], pairs[1::2], strict=True)):
                raise ConfigError(f"dscp saved iptables line {shown(row, 80)} is not one the tuner writes")
            values = dscp._ipt_rule_values(args)
            out.append((fam, (values[0],) if values[0] else (), (values[1],) if values[1] else (),
                        values[2], values[3], values[4], values[5]))
    return out


def _classifier_of(values: dscp_nft.RuleValues) -> dict[str, Any]:
    fam, nets, protos, dport, uid, cgroup, dscp_value = values
    return {"dscp": dscp_value, "daddr": list(nets) or None,
            "proto": protos[0] if len(protos) == 1 else None, "dport": dport, "uid": uid,
            "cgroup": cgroup}


def _dscp(key: str, new: str, old: str | None, permitted: DscpPolicy) -> None:
    if key not in (dscp.NFT_KEY, dscp.IPT_KEY):
        raise ConfigError(f"unknown dscp key {shown(key)}")
    dscp.canonical(new)  # compared with the live rules, never written by a rollback
    if old is None:
        return
    import json

    try:
        data = json.loads(old)
    except (json.JSONDecodeError, RecursionError):
        raise ConfigError("dscp saved state is not JSON") from None
    if dscp.is_spec(data):
        dscp.check_policy(dscp.canonical(data), permitted)
        return
    rules = _nft_objects(data) if key == dscp.NFT_KEY else _ipt_lines(data)
    if not rules:
        return
    try:  # judged together, as a plan is (dscp_scope): no "everything" rule by rule
        spec = dscp.canonical([{k: v for k, v in _classifier_of(values).items() if v is not None}
                               for values in rules])
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"dscp saved rule: {exc}") from None
    dscp.check_policy(spec, permitted)


# -- the journal ------------------------------------------------------------------------------
def _persist(persist: Any, sysctl_dirs: tuple[Path, ...]) -> None:
    if persist in ({}, None):
        return
    if not isinstance(persist, dict) or set(persist) != {"path", "previous"}:
        raise ConfigError("persist must be {path, previous}")
    path, previous = persist["path"], persist["previous"]
    allowed = [str(d / PERSIST_NAME) for d in sysctl_dirs]
    if not isinstance(path, str) or path not in allowed:
        raise ConfigError(f"persist path {shown(path)} is not {' or '.join(allowed)} (the "
                          "configured sysctl.d; --sysctl-d names another)")
    if previous is None:
        return
    if not isinstance(previous, str) or len(previous) > MAX_VALUE_CHARS:
        raise ConfigError("persist previous text is not text of at most 64 KiB")
    for line in previous.splitlines():
        body = line.strip()
        if not body or body.startswith(("#", ";")):
            continue
        k, sep, v = body.partition("=")
        try:
            if not sep:
                raise ConfigError("not key = value")
            _sysctl(k.strip(), [v.strip()])
        except ConfigError as exc:
            raise ConfigError(f"persist previous line {shown(body, 60)}: {exc}") from None


def check(doc: Any, *, jid: str, sysctl_dirs: tuple[Path, ...], permitted: DscpPolicy) -> None:
    """Raise ConfigError (one line) unless journal document ``doc`` (file ``<jid>.json``) holds
    only what the tuners would write themselves."""
    if not isinstance(doc, dict):
        raise ConfigError("not a JSON object")
    if doc.get("id") != jid:
        raise ConfigError(f"its id {shown(doc.get('id'))} is not its file name")
    if doc.get("state") not in STATES:
        raise ConfigError(f"unknown state {shown(doc.get('state'))}")
    for name in ("netns_inode", "pid"):
        if isinstance(doc.get(name, 0), bool) or not isinstance(doc.get(name, 0), int):
            raise ConfigError(f"{name} is not an integer")
    entries = doc.get("entries", [])
    if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
        raise ConfigError(f"entries must be a list of at most {MAX_ENTRIES}")
    checks = {"sysctl": _sysctl, "link": _link, "roce": _roce}
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or e.get("status", "pending") not in STATUSES:
            raise ConfigError(f"entry {i}: not an entry with a known status")
        tuner, key, new, old = e.get("tuner"), e.get("key"), e.get("new"), e.get("old")
        if not isinstance(key, str) or not isinstance(new, str) or not (old is None or isinstance(old, str)) \
                or len(new) > MAX_VALUE_CHARS or len(old or "") > MAX_VALUE_CHARS:
            raise ConfigError(f"entry {i}: key, new and old must be text")
        try:
            if tuner == "dscp":
                _dscp(key, new, old, permitted)
            elif tuner in checks:
                checks[tuner](key, [new] + ([old] if old is not None else []))
            else:
                raise ConfigError(f"unknown tuner {shown(tuner)}")
        except ConfigError as exc:
            raise ConfigError(f"entry {i}: {exc}") from None
    _persist(doc.get("persist"), sysctl_dirs)

