"""The DSCP tuner's nftables side in libnftables JSON (``nft -j``, libnftables-json(5)): the
ruleset a classifier list becomes, and the decoding of a ``nft -j list table`` answer back into
comparable values (what each rule matches and the DSCP it sets).

nft normalises what it lists: the implied ``meta nfproto`` and ``meta l4proto`` matches vanish, a
/32 prefix prints as a plain address, a one-element set as its element, and the DSCP as a name
(``af41``). :func:`rule_values` undoes all of that, so verify compares values, never text.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from tuners.dscp_classifier import Classifier
from wanprobe.units import parse_dscp

TABLE = {"family": "inet", "name": "wanprobe"}
CHAIN = {"family": "inet", "table": "wanprobe", "name": "out", "type": "filter",
         "hook": "output", "prio": -150, "policy": "accept"}  # -150: priority mangle
KINDS = ("table", "chain", "rule")

Json = dict[str, Any]  # a libnftables JSON object: its shape is libnftables-json(5)'s
# (family, nets, protos, dport, uid, cgroup, dscp) of one rule
RuleValues = tuple[str | None, tuple[str, ...], tuple[str, ...], str | None, int | None,
                   str | None, int | None]
ChainValues = tuple[str | None, str | None, int | None, str | None]  # type, hook, prio, policy
TableValues = tuple[tuple[ChainValues, ...], tuple[RuleValues, ...]]


def _match(left: Json, right: Any) -> Json:
    return {"match": {"op": "==", "left": left, "right": right}}


def _meta(key: str) -> Json:
    return {"meta": {"key": key}}


def _payload(protocol: str, field: str) -> Json:
    return {"payload": {"protocol": protocol, "field": field}}


def _prefix(net: str) -> Json:
    n = ipaddress.ip_network(net)
    return {"prefix": {"addr": str(n.network_address), "len": n.prefixlen}}


def _ports(dport: str) -> Any:
    lo, _, hi = dport.partition("-")
    return int(lo) if lo == hi else {"range": [int(lo), int(hi)]}


def rule_exprs(c: Classifier, fam: str, nets: list[str]) -> list[Json]:
    """The statements of one rule: matches, then ``<fam> dscp set`` (ECN bits kept, R-23)."""
    m = [_match(_meta("nfproto"), "ipv4" if fam == "ip" else "ipv6")]
    if nets:
        m.append(_match(_payload(fam, "daddr"), {"set": [_prefix(n) for n in nets]}))
    if c["proto"]:
        m.append(_match(_meta("l4proto"), c["proto"]))
        if c["dport"]:
            m.append(_match(_payload(c["proto"], "dport"), _ports(c["dport"])))
    elif c["dport"]:
        m.append(_match(_meta("l4proto"), {"set": ["tcp", "udp"]}))
        m.append(_match(_payload("th", "dport"), _ports(c["dport"])))
    if c["uid"] is not None:
        m.append(_match(_meta("skuid"), c["uid"]))
    if c["cgroup"]:
        m.append(_match({"socket": {"key": "cgroupv2", "level": c["cgroup"].count("/") + 1}},
                        c["cgroup"]))
    m.append({"mangle": {"key": _payload(fam, "dscp"), "value": c["dscp"]}})
    return m


def ruleset(rules: list[tuple[Classifier, str, list[str]]], tag: str, *, replace: bool) -> Json:
    """``{"nftables": [...]}`` creating the table with one rule per (classifier, family);
    with ``replace`` the old table is deleted first, in the same transaction."""
    cmds: list[Json] = [{"add": {"table": TABLE}}, {"delete": {"table": TABLE}}] if replace else []
    cmds += [{"add": {"table": TABLE}}, {"add": {"chain": CHAIN}}]
    base = {"family": "inet", "table": "wanprobe", "chain": "out", "comment": tag}
    cmds += [{"add": {"rule": {**base, "expr": rule_exprs(c, fam, nets)}}}
             for c, fam, nets in rules]
    return {"nftables": cmds}


def listed_objects(listing: Json) -> list[Json]:
    """Table, chain and rule objects of a ``nft -j list`` answer, handles dropped (what a
    rollback adds back)."""
    out: list[Json] = []
    for item in listing.get("nftables", []):
        for kind in KINDS:
            if kind in item:
                out.append({kind: {k: v for k, v in item[kind].items() if k != "handle"}})
    return out


def restore(objects: list[Json], *, replace: bool) -> Json:
    """The transaction that puts a listed table back as it was."""
    cmds: list[Json] = [{"add": {"table": TABLE}}, {"delete": {"table": TABLE}}] if replace else []
    return {"nftables": cmds + [{"add": obj} for obj in objects]}


def _nets(right: Any) -> tuple[str, ...]:
    items = right["set"] if isinstance(right, dict) and "set" in right else [right]
    out = []
    for x in items:
        if isinstance(x, dict) and "prefix" in x:
            x = f"{x['prefix']['addr']}/{x['prefix']['len']}"
        out.append(str(ipaddress.ip_network(str(x), strict=False)))
    return tuple(sorted(out))


def _protos(right: Any) -> tuple[str, ...]:
    items = right["set"] if isinstance(right, dict) and "set" in right else [right]
    return tuple(sorted(str(x) for x in items))


def _dport(right: Any) -> str:
    if isinstance(right, dict) and "range" in right:
        lo, hi = right["range"]
        return f"{int(lo)}-{int(hi)}"
    return f"{int(right)}-{int(right)}"


def _apply_match(v: dict[str, Any], left: Json, right: Any) -> None:
    if "meta" in left:
        key = left["meta"]["key"]
        if key == "nfproto":
            v["fam"] = "ip" if right == "ipv4" else "ip6"
        elif key == "l4proto":
            v["protos"] = _protos(right)
        elif key == "skuid":
            v["uid"] = int(right)
    elif "payload" in left:
        p = left["payload"]
        if p.get("field") == "daddr":
            v["fam"], v["nets"] = p["protocol"], _nets(right)
        elif p.get("field") == "dport":
            v["dport"] = _dport(right)
            if p["protocol"] in ("tcp", "udp") and not v["protos"]:
                v["protos"] = (p["protocol"],)
    elif "socket" in left and left["socket"].get("key") == "cgroupv2":
        v["cgroup"] = str(right).strip("/")


def rule_values(expr: list[Json]) -> RuleValues:
    """What one listed (or generated) rule matches and sets, as comparable values."""
    v: dict[str, Any] = {"fam": None, "nets": (), "protos": (), "dport": None, "uid": None,
                         "cgroup": None, "dscp": None}
    for e in expr:
        if "match" in e:
            _apply_match(v, e["match"]["left"], e["match"]["right"])
        elif "mangle" in e:
            v["fam"] = e["mangle"]["key"]["payload"]["protocol"]
            v["dscp"] = parse_dscp(e["mangle"]["value"])
    return (v["fam"], v["nets"], v["protos"], v["dport"], v["uid"], v["cgroup"], v["dscp"])


def table_values(objects: list[Json]) -> TableValues:
    """The chain's hook and policy and the sorted rule values of a table: equal tables mark the
    same packets the same way."""
    chains = sorted((c["chain"].get("type"), c["chain"].get("hook"), c["chain"].get("prio"),
                     c["chain"].get("policy")) for c in objects if "chain" in c)
    rules = sorted((rule_values(r["rule"].get("expr", [])) for r in objects if "rule" in r),
                   key=repr)
    return tuple(chains), tuple(rules)
