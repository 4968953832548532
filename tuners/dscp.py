"""DSCP tuner: mark training traffic in one owned nftables table ``inet wanprobe``.

Classifiers match destination prefix, port range, cgroup v2 path or uid (R-22; NCCL data
sockets use ephemeral ports, so prefix/uid/cgroup are the robust matches). ``ip dscp set``
leaves the ECN bits alone (R-23). nftables is spoken in its JSON form (``nft -j``,
libnftables-json(5), tuners/dscp_nft.py) both ways: apply replaces the table in one ``nft -j -f``
transaction, the live state is ``nft -j list table``, verify decodes both into values (what
each rule matches, the DSCP it sets) and compares them, rollback deletes the table or adds the
listed objects back. Without nft, the same classifiers go to an own ``WANPROBE`` chain in the
iptables/ip6tables mangle table (xt_DSCP, mangle only, tcp-tuning.md §4.5); its state is a JSON
object of ``iptables -S`` lines per family, compared by value too. Keys: ``nft:inet wanprobe``
or ``iptables:mangle WANPROBE``; the value is the canonical JSON list of classifiers. Every
free-form field is validated strictly (a cgroup path with a newline or a quote is refused).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import shlex
import shutil
import subprocess
from typing import TYPE_CHECKING, Any

from tuners import dscp_nft, dscp_scope
from tuners.dscp_classifier import Classifier
from tuners.knob import Change, Skip
from wanprobe.errors import ConfigError, TuneError, UsageError, shown
from wanprobe.units import parse_dscp, parse_port

NFT_KEY = "nft:inet wanprobe"
IPT_KEY = "iptables:mangle WANPROBE"
CHAIN = "WANPROBE"
FIELDS = ("dscp", "daddr", "proto", "dport", "uid", "cgroup")
CGROUP_PART = re.compile(r"[A-Za-z0-9_.@:+-]{1,255}")  # one cgroup v2 directory name, no quotes
DPORT = re.compile(r"\d{1,5}(-\d{1,5})?")
MAX_UID = 2**32 - 2  # (uid_t)-1 is "no uid"
# (-d, -p, --dport, --uid-owner, --path, --set-dscp) of one ``-A WANPROBE`` rule
IptRuleValues = tuple[str | None, str | None, str | None, int | None, str | None, int | None]
IptValues = tuple[tuple[str, tuple[IptRuleValues, ...]], ...]  # per family

if TYPE_CHECKING:
    from wanprobe.probe.access import DscpPolicy


def _daddr(value: Any) -> list[str]:
    items = [value] if isinstance(value, str) else value or []
    if not isinstance(items, list) or not all(isinstance(d, str) for d in items):
        raise ConfigError("dscp daddr must be an address/prefix or a list of them")
    try:
        return sorted(str(ipaddress.ip_network(d.strip(), strict=False)) for d in items)
    except ValueError as exc:
        raise ConfigError(f"dscp daddr: {exc}") from None


def _dport(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)) \
            or not DPORT.fullmatch(str(value)):
        raise ConfigError(f"dscp dport must be a port or a range lo-hi, got {value!r}")
    lo, _, hi = str(value).partition("-")
    try:
        lo_p, hi_p = parse_port(lo), parse_port(hi or lo)
    except UsageError as exc:
        raise ConfigError(str(exc)) from None
    if lo_p > hi_p:
        raise ConfigError(f"dscp dport range {value!r} is reversed")
    return f"{lo_p}-{hi_p}"


def _cgroup(value: Any) -> str | None:
    """A cgroup v2 path relative to the root: directory names of safe characters only."""
    if value is None:
        return None
    parts = value.strip("/").split("/") if isinstance(value, str) else []
    if not parts or len(value) > 4096 or any(
            not CGROUP_PART.fullmatch(p) or p in (".", "..") for p in parts):
        raise ConfigError(f"dscp cgroup must be a cgroup v2 path (letters, digits, _.@:+- "
                          f"between slashes), got {value!r}")
    return "/".join(parts)


def _classifier(item: Any) -> Classifier:
    if not isinstance(item, dict) or "dscp" not in item:
        raise ConfigError("each dscp classifier needs an object with 'dscp'")
    unknown = set(item) - set(FIELDS)
    if unknown:
        raise ConfigError(f"unknown dscp classifier field(s): {', '.join(sorted(map(str, unknown)))}")
    if isinstance(item["dscp"], bool) or not isinstance(item["dscp"], (int, str)):
        raise ConfigError(f"dscp must be 0-63 or a name, got {item['dscp']!r}")
    try:
        dscp = parse_dscp(item["dscp"])
    except UsageError as exc:
        raise ConfigError(str(exc)) from None
    daddr = _daddr(item.get("daddr"))
    proto = item.get("proto")
    if proto not in (None, "tcp", "udp"):
        raise ConfigError(f"dscp proto must be tcp or udp, got {proto!r}")
    dport = _dport(item.get("dport"))
    uid = item.get("uid")
    if uid is not None and (isinstance(uid, bool) or not isinstance(uid, int)
                            or not 0 <= uid <= MAX_UID):
        raise ConfigError(f"dscp uid must be an integer 0-{MAX_UID}, got {uid!r}")
    return {"dscp": dscp, "daddr": daddr, "proto": proto, "dport": dport, "uid": uid,
            "cgroup": _cgroup(item.get("cgroup"))}


def check_policy(spec: list[Classifier], permitted: DscpPolicy) -> None:
    """Refuse (ConfigError, one line) a classifier whose DSCP the host's policy forbids
    (``wanprobe.probe.access.DscpPolicy``: network control, 48-63, unless the operator allowed
    it), naming the classifier."""
    bad = [(i, c) for i, c in enumerate(spec) if not permitted(c["dscp"])]
    if bad:
        i, c = bad[0]
        why = permitted.refusal(c["dscp"], f"dscp classifier #{i + 1} ({dscp_scope.describe(c)})")
        also = f" (so do #{', #'.join(str(j + 1) for j, _ in bad[1:])})" if bad[1:] else ""
        raise ConfigError(f"{why}{also}; tune --allow-network-control-dscp permits it")


def canonical(value: Any) -> list[Classifier]:
    """Validate classifiers and put them in one canonical form (ConfigError on bad input); the
    plan as a whole must not mark effectively everything (``dscp_scope``)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ConfigError(f"dscp value {shown(value[:60])} is not JSON") from None
    out = [_classifier(item) for item in (value if isinstance(value, list) else [value])]
    if not out:
        raise ConfigError("no dscp classifiers")
    dscp_scope.check_scope(out)  # judged together: no "everything" one classifier at a time
    return out


def spec_hash(spec: list[Classifier]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def _families(c: Classifier) -> list[tuple[str, list[str]]]:
    v4 = [d for d in c["daddr"] if ipaddress.ip_network(d).version == 4]
    v6 = [d for d in c["daddr"] if ipaddress.ip_network(d).version == 6]
    if not c["daddr"]:
        return [("ip", []), ("ip6", [])]
    return ([("ip", v4)] if v4 else []) + ([("ip6", v6)] if v6 else [])


def is_spec(data: Any) -> bool:
    """A classifier list (what plans carry), as opposed to a saved live state."""
    return isinstance(data, list) and bool(data) and all(
        isinstance(x, dict) and "dscp" in x for x in data)


def nft_ruleset(spec: list[Classifier], *, replace: bool) -> dscp_nft.Json:
    """The ``nft -j -f`` transaction creating the table (deleting an existing one first)."""
    rules = [(c, fam, nets) for c in spec for fam, nets in _families(c)]
    return dscp_nft.ruleset(rules, f"wanprobe:{spec_hash(spec)}", replace=replace)


def ipt_rules(spec: list[Classifier]) -> list[tuple[str, list[str]]]:
    """(binary family, argv tail) per rule for the WANPROBE chain."""
    tag = f"wanprobe:{spec_hash(spec)}"
    out = []
    for c in spec:
        protos: list[str | None] = [c["proto"]] if c["proto"] else (
            ["tcp", "udp"] if c["dport"] else [None])
        for fam, nets in _families(c):
            for net in nets or (None,):
                for proto in protos:
                    a = ["-A", CHAIN]
                    a += ["-d", net] if net else []
                    a += ["-p", proto] if proto else []
                    a += ["--dport", c["dport"].replace("-", ":")] if c["dport"] else []
                    a += ["-m", "owner", "--uid-owner", str(c["uid"])] if c["uid"] is not None else []
                    a += ["-m", "cgroup", "--path", c["cgroup"]] if c["cgroup"] else []
                    a += ["-m", "comment", "--comment", tag, "-j", "DSCP", "--set-dscp", hex(c["dscp"])]
                    out.append((fam, a))
    return out


def _ipt_rule_values(args: list[str]) -> IptRuleValues:
    """What one ``-A WANPROBE ...`` rule matches and sets (``-m udp``, comments ignored)."""
    v: dict[str, Any] = {"-d": None, "-p": None, "--dport": None, "--uid-owner": None,
                         "--path": None, "--set-dscp": None}
    for flag, value in zip(args, args[1:], strict=False):
        if flag in v:
            v[flag] = value
    if v["-d"] is not None:
        v["-d"] = str(ipaddress.ip_network(v["-d"], strict=False))
    if v["--dport"] is not None:
        lo, _, hi = v["--dport"].partition(":")
        v["--dport"] = f"{int(lo)}-{int(hi or lo)}"
    if v["--uid-owner"] is not None:
        v["--uid-owner"] = int(v["--uid-owner"])
    if v["--path"] is not None:
        v["--path"] = v["--path"].strip("/")
    if v["--set-dscp"] is not None:
        v["--set-dscp"] = int(v["--set-dscp"], 0)
    return (v["-d"], v["-p"], v["--dport"], v["--uid-owner"], v["--path"], v["--set-dscp"])


def ipt_values(lines: dict[str, list[str]]) -> IptValues:
    """Per family, the sorted values of the WANPROBE chain's rules."""
    out = []
    for fam in sorted(lines):
        rules = [shlex.split(line) for line in lines[fam]]
        out.append((fam, tuple(sorted((_ipt_rule_values(a) for a in rules if a[:1] == ["-A"]),
                                      key=repr))))
    return tuple(out)


class DscpTuner:
    """nftables when ``nft`` works, else iptables/ip6tables (``nft=None`` forces the fallback)."""

    name = "dscp"

    def __init__(self, nft: str | None = "nft", iptables: str = "iptables",
                 ip6tables: str = "ip6tables", *, permitted: DscpPolicy | None = None) -> None:
        from wanprobe.probe.access import DscpPolicy

        self.nft = shutil.which(nft) if nft else None
        self.iptables, self.ip6tables = iptables, ip6tables
        self.permitted = permitted or DscpPolicy()  # the one DSCP policy: no 48-63 by default

    def _run(self, argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=20)
        except FileNotFoundError:
            raise TuneError(f"{argv[0]} not found") from None

    def _ipt(self, fam: str) -> str:
        return self.iptables if fam == "ip" else self.ip6tables

    def backend_key(self, spec: list[Classifier] | None = None) -> str:
        """nftables when ``nft`` is there and its JSON parser can say every match in ``spec``;
        else the iptables fallback."""
        if not self.nft:
            return IPT_KEY
        if spec and any(c["cgroup"] for c in spec) and not self._nft_json_has_cgroupv2():
            return IPT_KEY
        return NFT_KEY

    def _nft_json_has_cgroupv2(self) -> bool:
        """Whether this nft parses ``socket cgroupv2`` in JSON (nftables 1.0.6 does not: "Invalid
        socket key value"). Asked with ``nft -c`` (check only, nothing changes)."""
        if not self.nft:
            return False
        rule = {"family": "inet", "table": "wanprobe_probe", "chain": "c", "expr": [
            {"match": {"op": "==", "left": {"socket": {"key": "cgroupv2", "level": 1}},
                       "right": "wanprobe-probe"}}]}
        doc = {"nftables": [{"add": {"table": {"family": "inet", "name": "wanprobe_probe"}}},
                            {"add": {"chain": {"family": "inet", "table": "wanprobe_probe",
                                               "name": "c"}}},
                            {"add": {"rule": rule}}]}
        r = self._run([self.nft, "-c", "-j", "-f", "-"], stdin=json.dumps(doc))
        return "socket key" not in r.stderr

    # -- reading ---------------------------------------------------------------------------
    def _nft_objects(self) -> list[dscp_nft.Json] | None:
        """Table, chain and rules as ``nft -j list table inet wanprobe`` gives them, or None
        when there is no such table."""
        if not self.nft:
            raise TuneError("nft is not available to read the wanprobe table")
        r = self._run([self.nft, "-j", "list", "table", "inet", "wanprobe"])
        if r.returncode != 0:
            return None
        try:
            return dscp_nft.listed_objects(json.loads(r.stdout))
        except (json.JSONDecodeError, AttributeError, TypeError) as exc:
            raise TuneError(f"nft -j list answered something that is not its JSON: {exc}") from None

    def _ipt_lines(self) -> dict[str, list[str]]:
        """``iptables -S WANPROBE`` lines per family that has the chain."""
        out: dict[str, list[str]] = {}
        for fam in ("ip", "ip6"):
            r = self._run([self._ipt(fam), "-t", "mangle", "-S", CHAIN])
            if r.returncode == 0:
                out[fam] = r.stdout.strip().splitlines()
        return out

    def current(self, key: str) -> str | None:
        """The live state as JSON: the listed nft objects, or iptables lines per family."""
        if key == NFT_KEY:
            objects = self._nft_objects()
            return None if objects is None else json.dumps(objects, sort_keys=True)
        if key == IPT_KEY:
            lines = self._ipt_lines()
            return json.dumps(lines, sort_keys=True) if lines else None
        raise ConfigError(f"unknown dscp key {shown(key)} (use {NFT_KEY!r} or {IPT_KEY!r})")

    def _values(self, key: str, state: str) -> dscp_nft.TableValues | IptValues:
        """What a state marks, as values: a classifier list (JSON array) or a saved state."""
        data = json.loads(state)
        if is_spec(data):
            spec = canonical(data)
            if key == NFT_KEY:
                cmds = nft_ruleset(spec, replace=False)["nftables"]
                return dscp_nft.table_values([c["add"] for c in cmds])
            return ipt_values({fam: ["-N " + CHAIN] + [shlex.join(a) for f, a in ipt_rules(spec)
                                                        if f == fam] for fam in ("ip", "ip6")})
        if key == NFT_KEY:
            return dscp_nft.table_values(data)
        return ipt_values(data)

    def verify(self, key: str, wanted: str | None) -> bool:
        """The live rules mark the same packets with the same DSCP as ``wanted`` (tuned's
        would-be vs live value comparison; no text or comment counting)."""
        live = self.current(key)
        if wanted is None or live is None:
            return wanted is None and live is None
        try:
            return self._values(key, live) == self._values(key, wanted)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            return False

    # -- planning / validation -------------------------------------------------------------
    def plan(self, key: str, value: Any, reason: str) -> Change | Skip:
        spec = canonical(value)
        try:
            check_policy(spec, self.permitted)
        except ConfigError as exc:
            return Skip(self.name, key, str(exc))
        key = self.backend_key(spec)
        new = json.dumps(spec, sort_keys=True)
        if self.verify(key, new):
            return Skip(self.name, key, "already marking with these classifiers")
        return Change(self.name, key, self.current(key), new, reason)

    def validate(self, change: Change) -> None:
        if change.key == NFT_KEY and not self.nft:
            raise ConfigError("plan marks DSCP with nftables but nft is not available here; re-plan")
        if change.key not in (NFT_KEY, IPT_KEY):
            raise ConfigError(f"unknown dscp key {shown(change.key)}")
        check_policy(canonical(change.new), self.permitted)

    # -- writing ---------------------------------------------------------------------------
    def _nft_apply(self, doc: dscp_nft.Json) -> None:
        if not self.nft:  # validate() refuses an nft change without nft; a rollback reads first
            raise TuneError("nft is not available to write the wanprobe table")
        r = self._run([self.nft, "-j", "-f", "-"], stdin=json.dumps(doc))
        if r.returncode != 0:
            err = " ".join(r.stderr.split())
            hint = (" (this nft's JSON parser has no socket cgroupv2: use a newer nftables, or "
                    "WANPROBE_NFT= for the iptables backend)" if "socket key" in err else "")
            raise TuneError(f"nft -j failed: {err[:200]}{hint}")

    def _set_nft(self, text: str | None) -> None:
        exists = self._nft_objects() is not None
        if text is None:
            if exists:
                self._nft_apply({"nftables": [{"delete": {"table": dscp_nft.TABLE}}]})
            return
        data = json.loads(text)
        if is_spec(data):
            self._nft_apply(nft_ruleset(canonical(data), replace=exists))
        else:  # a previous listing, added back object by object
            self._nft_apply(dscp_nft.restore(data, replace=exists))

    def _set_ipt(self, text: str | None) -> None:
        for fam in self._ipt_lines():
            ipt = self._ipt(fam)
            self._run([ipt, "-t", "mangle", "-D", "OUTPUT", "-j", CHAIN])
            self._run([ipt, "-t", "mangle", "-F", CHAIN])
            self._run([ipt, "-t", "mangle", "-X", CHAIN])
        if text is None:
            return
        data = json.loads(text)
        if is_spec(data):
            cmds = [(fam, ["-N", CHAIN]) for fam in ("ip", "ip6")] + ipt_rules(canonical(data))
        else:  # {"ip": ["-N WANPROBE", "-A WANPROBE ..."], ...} as read by current()
            cmds = [(fam, shlex.split(line)) for fam, lines in data.items() for line in lines]
        cmds += [(fam, ["-A", "OUTPUT", "-j", CHAIN]) for fam in ("ip", "ip6")]
        for fam, args in cmds:
            r = self._run([self._ipt(fam), "-t", "mangle", *args])
            if r.returncode != 0:
                raise TuneError(f"{self._ipt(fam)} {' '.join(args)} failed: {' '.join(r.stderr.split())[:160]}")

    def _set(self, key: str, text: str | None) -> None:
        (self._set_nft if key == NFT_KEY else self._set_ipt)(text)

    def restore_command(self, change: Change) -> str:
        if change.key == NFT_KEY:
            if change.old is None:
                return "nft delete table inet wanprobe"
            doc = dscp_nft.restore(json.loads(change.old), replace=True)
            return f"nft -j -f - <<'EOF'\n{json.dumps(doc)}\nEOF"
        return ("for t in iptables ip6tables; do $t -t mangle -D OUTPUT -j WANPROBE; "
                "$t -t mangle -F WANPROBE; $t -t mangle -X WANPROBE; done"
                + ("" if change.old is None else f"  # then re-add: {change.old}"))

    def apply(self, change: Change) -> None:
        self._set(change.key, change.new)

    def rollback(self, change: Change) -> None:
        self._set(change.key, change.old)
