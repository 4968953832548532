"""DSCP tuner: mark training traffic in one owned nftables table ``inet wanprobe``.

Classifiers match destination prefix, port range, cgroup v2 path or uid (R-22; NCCL data
sockets use ephemeral ports, so prefix/uid/cgroup are the robust matches). ``ip dscp set``
leaves the ECN bits alone (R-23). Apply replaces the table in one ``nft -f`` transaction;
rollback deletes it (or restores the previous listing). Without nft, the same classifiers go to
an own ``WANPROBE`` chain in the iptables/ip6tables mangle table (xt_DSCP, mangle only,
tcp-tuning.md §4.5). Keys: ``nft:inet wanprobe`` or ``iptables:mangle WANPROBE``; the value is
the canonical JSON list of classifiers.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import shlex
import shutil
import subprocess
from typing import Any

from tuners.knob import Change, Skip, normalise
from wanprobe.errors import ConfigError, TuneError, UsageError, shown
from wanprobe.units import parse_dscp, parse_port

NFT_KEY = "nft:inet wanprobe"
IPT_KEY = "iptables:mangle WANPROBE"
CHAIN = "WANPROBE"


def canonical(value: Any) -> list[dict[str, Any]]:
    """Validate classifiers and put them in one canonical form (ConfigError on bad input)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ConfigError(f"dscp value {shown(value[:60])} is not JSON") from None
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if not isinstance(item, dict) or "dscp" not in item:
            raise ConfigError("each dscp classifier needs an object with 'dscp'")
        unknown = set(item) - {"dscp", "daddr", "proto", "dport", "uid", "cgroup"}
        if unknown:
            raise ConfigError(f"unknown dscp classifier field(s): {', '.join(sorted(unknown))}")
        try:
            c: dict[str, Any] = {"dscp": parse_dscp(item["dscp"])}
        except UsageError as exc:
            raise ConfigError(str(exc)) from None
        daddr = item.get("daddr") or []
        daddr = [daddr] if isinstance(daddr, str) else daddr
        try:
            c["daddr"] = sorted(str(ipaddress.ip_network(d, strict=False)) for d in daddr)
        except ValueError as exc:
            raise ConfigError(f"dscp daddr: {exc}") from None
        proto = item.get("proto")
        if proto not in (None, "tcp", "udp"):
            raise ConfigError(f"dscp proto must be tcp or udp, got {shown(proto)}")
        c["proto"] = proto
        dport = item.get("dport")
        if dport is not None:
            lo, _, hi = str(dport).partition("-")
            try:
                lo_p, hi_p = parse_port(lo), parse_port(hi or lo)
            except UsageError as exc:
                raise ConfigError(str(exc)) from None
            if lo_p > hi_p:
                raise ConfigError(f"dscp dport range {shown(dport)} is reversed")
            dport = f"{lo_p}-{hi_p}"
        c["dport"] = dport
        uid = item.get("uid")
        if uid is not None and (not isinstance(uid, int) or uid < 0):
            raise ConfigError(f"dscp uid must be a non-negative integer, got {shown(uid)}")
        c["uid"] = uid
        cg = item.get("cgroup")
        if cg is not None and (not isinstance(cg, str) or '"' in cg or not cg.strip("/")):
            raise ConfigError(f"dscp cgroup must be a cgroup v2 path, got {shown(cg)}")
        c["cgroup"] = cg.strip("/") if cg else None
        if not (c["daddr"] or dport or uid is not None or c["cgroup"]):
            raise ConfigError("a dscp classifier needs daddr, dport, uid or cgroup (never mark everything)")
        out.append(c)
    if not out:
        raise ConfigError("no dscp classifiers")
    return out


def spec_hash(spec: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def _families(c: dict[str, Any]) -> list[tuple[str, list[str]]]:
    v4 = [d for d in c["daddr"] if ipaddress.ip_network(d).version == 4]
    v6 = [d for d in c["daddr"] if ipaddress.ip_network(d).version == 6]
    if not c["daddr"]:
        return [("ip", []), ("ip6", [])]
    return ([("ip", v4)] if v4 else []) + ([("ip6", v6)] if v6 else [])


def nft_script(spec: list[dict[str, Any]], *, replace: bool) -> str:
    """The ``nft -f`` text creating the table (deleting an existing one first, atomically)."""
    tag = f"wanprobe:{spec_hash(spec)}"
    rules = []
    for c in spec:
        for fam, nets in _families(c):
            m = [f"meta nfproto {'ipv4' if fam == 'ip' else 'ipv6'}"]
            if nets:
                m.append(f"{fam} daddr {{ {', '.join(nets)} }}")
            if c["proto"]:
                m.append(f"meta l4proto {c['proto']}")
                if c["dport"]:
                    m.append(f"{c['proto']} dport {c['dport']}")
            elif c["dport"]:
                m.append(f"meta l4proto {{ tcp, udp }} th dport {c['dport']}")
            if c["uid"] is not None:
                m.append(f"meta skuid {c['uid']}")
            if c["cgroup"]:
                m.append(f'socket cgroupv2 level {c["cgroup"].count("/") + 1} "{c["cgroup"]}"')
            rules.append(f"    {' '.join(m)} {fam} dscp set {c['dscp']} comment \"{tag}\"")
    head = "table inet wanprobe\ndelete table inet wanprobe\n" if replace else ""
    body = "\n".join(rules)
    return (f"{head}table inet wanprobe {{\n  chain out {{\n    type filter hook output priority mangle; "
            f"policy accept;\n{body}\n  }}\n}}\n")


def ipt_rules(spec: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """(binary family, argv tail) per rule for the WANPROBE chain."""
    tag = f"wanprobe:{spec_hash(spec)}"
    out = []
    for c in spec:
        protos = [c["proto"]] if c["proto"] else (["tcp", "udp"] if c["dport"] else [None])
        for fam, nets in _families(c):
            for net in nets or [None]:
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


class DscpTuner:
    """nftables when ``nft`` works, else iptables/ip6tables (``nft=None`` forces the fallback)."""

    name = "dscp"

    def __init__(self, nft: str | None = "nft", iptables: str = "iptables",
                 ip6tables: str = "ip6tables") -> None:
        self.nft = shutil.which(nft) if nft else None
        self.iptables, self.ip6tables = iptables, ip6tables

    def _run(self, argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=20)
        except FileNotFoundError:
            raise TuneError(f"{argv[0]} not found") from None

    def _ipt(self, fam: str) -> str:
        return self.iptables if fam == "ip" else self.ip6tables

    def backend_key(self) -> str:
        return NFT_KEY if self.nft else IPT_KEY

    # -- reading ---------------------------------------------------------------------------
    def current(self, key: str) -> str | None:
        if key == NFT_KEY:
            if not self.nft:
                raise TuneError("nft is not available to read the wanprobe table")
            r = self._run([self.nft, "list", "table", "inet", "wanprobe"])
            return normalise(r.stdout) if r.returncode == 0 else None
        if key == IPT_KEY:
            parts = []
            for fam in ("ip", "ip6"):
                r = self._run([self._ipt(fam), "-t", "mangle", "-S", CHAIN])
                if r.returncode == 0:
                    parts.append(f"{fam}: " + " ; ".join(r.stdout.strip().splitlines()))
            return " | ".join(parts) if parts else None
        raise ConfigError(f"unknown dscp key {shown(key)} (use {shown(NFT_KEY)} or {shown(IPT_KEY)})")

    def verify(self, key: str, wanted: str | None) -> bool:
        live = self.current(key)
        if wanted is None or live is None:
            return wanted is None and live is None
        if wanted.lstrip().startswith(("[", "{")):
            spec = canonical(wanted)
            tag = f"wanprobe:{spec_hash(spec)}"
            n = len(ipt_rules(spec)) if key == IPT_KEY else nft_script(spec, replace=False).count(tag)
            return live.count(tag) == n
        return normalise(live) == normalise(wanted)

    # -- planning / validation -------------------------------------------------------------
    def plan(self, key: str, value: Any, reason: str) -> Change | Skip:
        spec = canonical(value)
        key = self.backend_key()
        new = json.dumps(spec, sort_keys=True)
        if self.verify(key, new):
            return Skip(self.name, key, "already marking with these classifiers")
        return Change(self.name, key, self.current(key), new, reason)

    def validate(self, change: Change) -> None:
        if change.key == NFT_KEY and not self.nft:
            raise ConfigError("plan marks DSCP with nftables but nft is not available here; re-plan")
        if change.key not in (NFT_KEY, IPT_KEY):
            raise ConfigError(f"unknown dscp key {shown(change.key)}")
        canonical(change.new)

    # -- writing ---------------------------------------------------------------------------
    def _set_nft(self, text: str | None) -> None:
        exists = self.current(NFT_KEY) is not None
        if text is None:
            script = "delete table inet wanprobe\n" if exists else ""
        elif text.lstrip().startswith(("[", "{")):
            script = nft_script(canonical(text), replace=exists)
        else:  # a previous listing, restored verbatim
            script = ("table inet wanprobe\ndelete table inet wanprobe\n" if exists else "") + text + "\n"
        if script:
            r = self._run([self.nft, "-f", "-"], stdin=script)
            if r.returncode != 0:
                raise TuneError(f"nft failed: {' '.join(r.stderr.split())[:200]}")

    def _set_ipt(self, text: str | None) -> None:
        for fam in ("ip", "ip6"):
            ipt = self._ipt(fam)
            if self._run([ipt, "-t", "mangle", "-S", CHAIN]).returncode == 0:
                self._run([ipt, "-t", "mangle", "-D", "OUTPUT", "-j", CHAIN])
                self._run([ipt, "-t", "mangle", "-F", CHAIN])
                self._run([ipt, "-t", "mangle", "-X", CHAIN])
        if text is None:
            return
        if text.lstrip().startswith(("[", "{")):
            cmds = [(fam, ["-N", CHAIN]) for fam in ("ip", "ip6")]
            cmds += ipt_rules(canonical(text))
        else:  # "ip: -N WANPROBE ; -A ... | ip6: ..." as read by current()
            cmds = []
            for part in text.split(" | "):
                fam, _, lines = part.partition(": ")
                cmds += [(fam, shlex.split(line)) for line in lines.split(" ; ") if line.strip()]
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
            return f"nft -f - <<'EOF'\ntable inet wanprobe\ndelete table inet wanprobe\n{change.old}\nEOF"
        return ("for t in iptables ip6tables; do $t -t mangle -D OUTPUT -j WANPROBE; "
                "$t -t mangle -F WANPROBE; $t -t mangle -X WANPROBE; done"
                + ("" if change.old is None else f"  # then re-add: {change.old}"))

    def apply(self, change: Change) -> None:
        self._set(change.key, change.new)

    def rollback(self, change: Change) -> None:
        self._set(change.key, change.old)
