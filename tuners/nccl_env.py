"""NCCL settings for this host and path, each with the reason, in five file formats.

Rules (roce-nccl.md §1.5, §2.6, §4.1-4.4; tcp-tuning.md R-4, R-33):
* NCCL_SOCKET_IFNAME=``=<if>`` (exact match) for the interface that reaches the peer;
* NCCL_IB_HCA=``=<dev>:<port>`` for active RDMA ports on that interface;
* NCCL_IB_TC = DSCP<<2 | ECN, ECN = ECT(0) (2) unless ECN is known to be off for the priority
  (DSCP 26 → 106; 104 without ECT);
* NCCL_IB_TIMEOUT: smallest t with 4.096 µs·2^t ≥ 4·RTT, never below 20 (the NCCL ≥ 2.23
  default; older releases default to 18/14, i.e. 1.07 s/67 ms, too short on long paths);
* NCCL_IB_QPS_PER_CONNECTION=4 on ECMP fabrics (more QPs = more hash entropy);
* NCCL_SOCKET_NTHREADS × NCCL_NSOCKS_PERTHREAD ≤ 64 sockets, enough that the per-socket
  ceiling min(window/RTT, cc loss bound) adds up to the link rate;
* NCCL_IB_GID_INDEX only where NCCL's own choice (≥ 2.21) is wrong: NCCL < 2.21, or the
  automatic pick lands on another netdev/VLAN than the one NCCL should use;
* NCCL_BUFFSIZE / NCCL_ALGO / NCCL_PROTO only when a report finding asks, with its reason.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuners import sysfs_path
from tuners.nccl_xdc import Flow, JobSites, qps_for_paths, xdc_settings
from tuners.rdma_sysfs import RdmaPort, best_gid_for_netdev, nccl_gid_index, read_ports
from wanprobe.errors import UsageError
from wanprobe.models.collectives import MAX_SOCKETS, split_sockets

if TYPE_CHECKING:
    from wanprobe.diagnose.measured import PathMeasured

FORMATS = ("env", "nccl.conf", "shell", "systemd", "k8s")
IB_TIMEOUT_UNIT_S = 4.096e-6
IB_TIMEOUT_DEFAULT = 20
DEFAULT_ROCE_DSCP = 26  # AF31: priority 3 with the default dscp>>3 map (roce-nccl.md §2.6)


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "value": self.value, "reason": self.reason}


@dataclass(frozen=True)
class PathFacts:
    """What the computation needs, from a report and/or sysfs; None = unknown."""

    iface: str | None = None
    rtt_ms: float | None = None
    loss: float | None = None
    link_bps: float | None = None
    tcp_rmem_max: int | None = None
    tcp_wmem_max: int | None = None
    mtu: int | None = None
    cc: str | None = None
    dscp: int | None = None
    ecmp: bool = False
    nccl_knobs: tuple[tuple[str, str, str], ...] = ()
    # issue 13: the far end's buffers (host_facts) and the per-stream rates diagnose measured
    peer_tcp_rmem_max: int | None = None
    peer_tcp_wmem_max: int | None = None
    per_stream_bps: tuple[tuple[int, float], ...] = ()  # (streams, rate per stream)
    # issue 24: the ECMP flows `wanprobe paths` measured, and the sites the job spans
    flows: tuple[Flow, ...] = ()
    job: JobSites | None = None


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


def _report_knobs(report: dict[str, Any]) -> tuple[int | None, bool, list[tuple[str, str, str]]]:
    """From the report's findings: the training DSCP a dscp knob asks for, whether a finding
    asked for more QPs (ECMP), and the NCCL knobs with their reasons."""
    dscp, ecmp = None, False
    knobs: list[tuple[str, str, str]] = []
    for f in report.get("findings") or []:
        for k in (f or {}).get("knobs") or []:
            if not isinstance(k, dict):
                continue
            reason = k.get("reason") or f.get("title", "")
            if k.get("tuner") == "dscp" and dscp is None:
                v = k.get("value")
                if isinstance(v, str) and v.lstrip().startswith(("[", "{")):
                    try:
                        v = json.loads(v)
                    except json.JSONDecodeError:
                        v = None
                first = (v[0] if isinstance(v, list) and v else v) or {}
                if isinstance(first, dict) and isinstance(first.get("dscp"), int | str):
                    from wanprobe.units import parse_dscp
                    dscp = parse_dscp(first["dscp"])
            if k.get("tuner") == "nccl":
                knobs.append((str(k.get("key")), str(k.get("value")), f"[{f.get('id', '?')}] {reason}"))
                if k.get("key") == "NCCL_IB_QPS_PER_CONNECTION":
                    ecmp = True
    return dscp, ecmp, knobs


def _link_bps(report: dict[str, Any], path: PathMeasured | None,
              speed_mbps: float | None) -> float | None:
    """The rate to size for: the measured (or operator's) path capacity (``path``: the typed
    ``PathMeasured``), else the rate a rule sized for (unless it only assumed one), else the
    egress NIC speed."""
    if path is not None and path.capacity and path.capacity.bits_per_second \
            and path.capacity_method in ("udp_burst", "operator"):
        return path.capacity.bits_per_second
    for f in report.get("findings") or []:  # rules' evidence: link_rate_bps / link_rate_assumed
        ev = (f or {}).get("evidence") or {}
        if isinstance(ev, dict) and _num(ev.get("link_rate_bps")) and ev.get("link_rate_assumed") is not True:
            return _num(ev["link_rate_bps"])
    return speed_mbps * 1e6 if speed_mbps and speed_mbps > 0 else None


def parse_nccl_version(text: str) -> tuple[int, int]:
    """``"2.21"`` (or ``"2.21.5"``) as (major, minor); a bad one is a one-line UsageError."""
    from wanprobe.errors import UsageError

    try:
        major, minor = (int(x) for x in text.split(".")[:2])
    except ValueError:
        raise UsageError(f"bad NCCL version {text!r} (want e.g. 2.21)") from None
    return major, minor


def facts_from_report(report: dict[str, Any] | None) -> PathFacts:
    """A diagnose report's figures, from its typed view (the report codec, ``parts_of``: the
    measurements — the probe's p99 RTT and loss, the MTU search's interface, the path capacity,
    the peer's host facts, the 1/2/4/8-stream scan — and this host). Every part is optional."""
    from wanprobe.report.codec import parts_of

    if not report:
        return PathFacts()
    m, host = parts_of(report)
    path = m.path
    iface = m.egress_iface
    if not iface and host:
        real = [i.name for i in host.ifaces if i.name != "lo"]
        iface = real[0] if len(real) == 1 else None
    link = host.iface(iface) if host and iface else None
    dscp, ecmp, knobs = _report_knobs(report)
    peer = m.peer_facts
    scan = tuple((n, per) for n, per in m.streams_scan if n and per)
    return PathFacts(iface=iface, rtt_ms=path.rtt_p99_ms if path else None,
                     loss=path.loss_ratio if path else None,
                     link_bps=_link_bps(report, path, link.speed_mbps if link else None),
                     peer_tcp_rmem_max=peer.tcp_rmem_bytes[2] if peer and peer.tcp_rmem_bytes else None,
                     peer_tcp_wmem_max=peer.tcp_wmem_bytes[2] if peer and peer.tcp_wmem_bytes else None,
                     per_stream_bps=scan,
                     tcp_rmem_max=host.tcp_rmem_bytes[2] if host and host.tcp_rmem_bytes else None,
                     tcp_wmem_max=host.tcp_wmem_bytes[2] if host and host.tcp_wmem_bytes else None,
                     mtu=link.mtu_bytes if link else None, cc=host.cc_current if host else None,
                     dscp=dscp, ecmp=ecmp, nccl_knobs=tuple(knobs))


def with_live_sysctls(facts: PathFacts, proc_root: Path) -> PathFacts:
    """Fill buffer maxima and cc from this host's /proc when the report did not carry them."""
    from dataclasses import replace

    from tuners.sysctl import SysctlTuner

    t = SysctlTuner(proc_root, init_netns=True)

    def last(key: str) -> int | None:
        v = t.current(key)
        return int(v.split()[-1]) if v and v.split()[-1].isdigit() else None

    return replace(facts, tcp_rmem_max=facts.tcp_rmem_max or last("net.ipv4.tcp_rmem"),
                   tcp_wmem_max=facts.tcp_wmem_max or last("net.ipv4.tcp_wmem"),
                   cc=facts.cc or t.current("net.ipv4.tcp_congestion_control"))


def ib_timeout(rtt_ms: float, rtts: int = 4) -> int:
    """Smallest t with 4.096 µs · 2^t ≥ ``rtts`` × RTT (IB spec local ACK timeout), in 1..31."""
    need_s = rtts * rtt_ms / 1e3
    return max(1, min(31, math.ceil(math.log2(need_s / IB_TIMEOUT_UNIT_S))))


def _socket_ceiling(f: PathFacts, rtt_ms: float, loss: float | None) -> float:
    """What one socket reaches at ``rtt_ms`` and ``loss``: the link, the smallest buffer's
    window per RTT, the congestion control's loss bound."""
    from wanprobe.models.bdp import window_from_buffer_bytes, window_limited_rate_bps
    from wanprobe.models.tcp_rate import cc_limited_rate_bps

    if loss is not None and loss >= 1.0:
        return 0.0  # every probe lost: a socket hashed onto that path stalls
    rtt_s = rtt_ms / 1e3
    ceiling = f.link_bps or 0.0
    # both directions of an all-reduce: each end's receive and send buffers bound a socket
    bufs = [b for b in (f.tcp_rmem_max, f.tcp_wmem_max, f.peer_tcp_rmem_max,
                        f.peer_tcp_wmem_max) if b]
    if bufs:
        ceiling = min(ceiling, window_limited_rate_bps(window_from_buffer_bytes(min(bufs)), rtt_s))
    if loss:
        mss = (f.mtu or 1500) - 52
        ceiling = min(ceiling, cc_limited_rate_bps(f.cc or "cubic", f.link_bps or 0.0, mss, rtt_s, loss))
    return ceiling


def flow_ceilings(f: PathFacts) -> list[tuple[Flow, float]]:
    """Each measured ECMP flow with what one socket on its path reaches (its own RTT and
    loss; the path's RTT where the flow has none)."""
    if not f.link_bps or not f.rtt_ms:
        return []
    return [(fl, _socket_ceiling(f, fl.rtt_p99_ms or f.rtt_ms, fl.loss_ratio)) for fl in f.flows]


def sockets_needed(f: PathFacts) -> tuple[int, float] | None:
    """(sockets, per-socket ceiling bit/s) so that sockets × ceiling ≥ link rate (not capped).
    With measured ECMP flows the ceiling is the slowest flow's: NCCL splits a transfer equally
    over its sockets, so all of them move at the slowest one's pace (nccl-tests#83)."""
    if not f.rtt_ms or not f.link_bps:
        return None
    ceiling = _socket_ceiling(f, f.rtt_ms, min(f.loss, 1.0) if f.loss else None)
    flows = flow_ceilings(f)
    if flows:
        ceiling = min(ceiling, min(c for _, c in flows))
    if f.per_stream_bps:  # measured: the best one stream reached on this path
        ceiling = min(ceiling, max(bps for _, bps in f.per_stream_bps))
    if ceiling <= 0:
        return MAX_SOCKETS + 1, 0.0
    return max(1, math.ceil(f.link_bps / ceiling)), ceiling


def _ecn_on(sys_root: Path, netdev: str, prio: int) -> bool | None:
    vals = [sysfs_path.read(sys_root, "class/net", netdev, "ecn", sub, "enable", str(prio))
            for sub in ("roce_np", "roce_rp")]
    if all(v is None for v in vals):
        return None
    return any(v == "1" for v in vals)


def _socket_why(f: PathFacts, ceiling: float) -> str:
    """Where the per-socket ceiling came from: the slowest measured ECMP flow, or the path."""
    flows = flow_ceilings(f)
    slow = min(flows, key=lambda x: x[1]) if flows else None
    if slow is None or slow[1] > ceiling:
        return (f"one socket tops out at ~{ceiling / 1e6:.0f} Mbit/s (window/RTT"
                f"{', loss' if f.loss else ''}) at {f.rtt_ms:.3g} ms")
    fl, rate = slow
    mean = sum(c for _, c in flows) / len(flows)
    loss = f"{fl.loss_ratio * 100:.2g} % loss" if fl.loss_ratio else "no loss"
    return (f"the slowest of {len(flows)} measured ECMP flows (source port {fl.src_port}, "
            f"{loss}, p99 {fl.rtt_p99_ms or f.rtt_ms:.3g} ms; `wanprobe paths`) tops out at "
            f"~{rate / 1e6:.0f} Mbit/s per socket, the flows' average ~{mean / 1e6:.0f}: NCCL "
            "moves every socket at the slowest one's pace (nccl-tests#83)")


def _socket_vars(f: PathFacts) -> list[EnvVar]:
    """NCCL_SOCKET_NTHREADS × NCCL_NSOCKS_PERTHREAD: enough sockets at the per-socket ceiling
    for the link rate, within NCCL's 16 threads and 64 sockets."""
    need = sockets_needed(f)
    if not need or need[0] <= 1 or not f.link_bps:  # a need implies a link rate
        return []
    n, ceiling = need
    threads, per = split_sockets(min(n, MAX_SOCKETS))
    total = threads * per
    why = f"{_socket_why(f, ceiling)}; {threads}×{per}={total} sockets "
    if n <= MAX_SOCKETS:
        why += f"cover {f.link_bps / 1e9:g} Gbit/s (≤ 64)"
    else:
        why += (f"(NCCL's cap of 64) reach ~{total * ceiling / 1e9:.2g} of {f.link_bps / 1e9:g} "
                f"Gbit/s; {n} would be needed: raise tcp_rmem/tcp_wmem max, or mend the slow path")
    return [EnvVar("NCCL_SOCKET_NTHREADS", str(threads), why),
            EnvVar("NCCL_NSOCKS_PERTHREAD", str(per), why)]


def _ib_vars(f: PathFacts) -> list[EnvVar]:
    """NCCL_IB_TIMEOUT from the measured RTT; NCCL_IB_QPS_PER_CONNECTION from the measured
    ECMP paths (or 4 where a finding only said the fabric is ECMP)."""
    out = []
    if f.rtt_ms:
        t = ib_timeout(f.rtt_ms)
        chosen = max(t, IB_TIMEOUT_DEFAULT)
        out.append(EnvVar("NCCL_IB_TIMEOUT", str(chosen),
                          f"4.096 µs × 2^{chosen} = {IB_TIMEOUT_UNIT_S * 2**chosen:.3g} s ≥ 4 × RTT "
                          f"({f.rtt_ms:.3g} ms needs t ≥ {t}); NCCL < 2.23 defaults to 18 or 14 (67 ms)"))
    paths = qps_for_paths(f.flows)
    if paths:
        out.append(EnvVar("NCCL_IB_QPS_PER_CONNECTION", str(paths[0]),
                          f"{paths[1]}: {paths[0]} QPs per connection (each its own 5-tuple for the "
                          f"switch hash) spread it over all of them at {f.rtt_ms or 0:.3g} ms"))
    elif f.ecmp:
        out.append(EnvVar("NCCL_IB_QPS_PER_CONNECTION", "4",
                          "ECMP fabric: 4 QPs per connection give the switch hash 4× the entropy"))
    return out


def compute(facts: PathFacts, sys_root: Path = Path("/sys"), *,
            nccl_version: tuple[int, int] = (2, 21), transport: str = "auto",
            notes: list[str] | None = None) -> list[EnvVar]:
    """The variables to set, in a stable order; nothing is emitted without a reason. What
    could not be set and why goes to ``notes`` when given."""
    out: list[EnvVar] = []
    ports = [p for p in read_ports(sys_root) if p.active]
    iface = facts.iface
    roce = [p for p in ports if p.link_layer == "Ethernet" and (iface is None or iface in p.netdevs
                                                                 or any(g.ndev == iface for g in p.gids))]
    ib = [p for p in ports if p.link_layer == "InfiniBand"]
    rdma = (roce or ib) if transport in ("auto", "ib") else []
    if iface is None and roce:
        iface = roce[0].netdevs[0] if roce[0].netdevs else None
    if iface:
        out.append(EnvVar("NCCL_SOCKET_IFNAME", f"={iface}",
                          f"bootstrap/socket traffic on {iface}, the interface toward the peer (exact match, "
                          "no prefix surprises)"))
    xdc, xdc_notes = (xdc_settings([(p.device, p.port, p.rate_gbps) for p in rdma], facts.job,
                                   nccl_version) if facts.job else ([], []))
    if notes is not None:
        notes += xdc_notes
    if rdma and not xdc:
        hcas = ",".join(f"{p.device}:{p.port}" for p in rdma)
        out.append(EnvVar("NCCL_IB_HCA", f"={hcas}", f"active {'RoCE' if roce else 'IB'} port(s) "
                          f"{hcas}{' bound to ' + iface if roce and iface else ''}"))
    out += [EnvVar(*x) for x in xdc]
    if roce:
        out += _roce_vars(roce, iface, facts, sys_root, nccl_version)
    if rdma:
        out += _ib_vars(facts)
    if not rdma or transport == "socket":
        out += _socket_vars(facts)
    have = {v.name for v in out}
    for name, value, reason in facts.nccl_knobs:
        if name in have:
            continue
        if name.startswith("NCCL_") and reason.strip():  # e.g. BUFFSIZE/ALGO/PROTO: only with a reason
            out.append(EnvVar(name, value, reason))
            have.add(name)
    buffsize = buffsize_var(facts)
    spans = facts.job is not None and facts.job.spans
    if buffsize and buffsize.name not in have and (not rdma or transport == "socket" or spans):
        out.append(buffsize)
    return out


NCCL_BUFFSIZE_DEFAULT = 4 * 2**20
NCCL_BUFFSIZE_MAX = 64 * 2**20


def buffsize_var(f: PathFacts) -> EnvVar | None:
    """NCCL_BUFFSIZE on a long path: a channel keeps at most about BUFFSIZE in flight, so it
    carries ≤ BUFFSIZE/RTT (fleet-multipath.md §4, NVIDIA "NCCL Deep Dive: Cross Data Center",
    2025; an inference from the protocol, to verify on a build). Raised to the BDP (power of
    two, ≤ 64 MiB) when the default bound is below the path capacity."""
    if not f.rtt_ms or not f.link_bps:
        return None
    rtt_s = f.rtt_ms / 1e3
    bound = NCCL_BUFFSIZE_DEFAULT * 8 / rtt_s
    if bound >= f.link_bps:
        return None
    bdp = f.link_bps * rtt_s / 8
    size = min(NCCL_BUFFSIZE_MAX, 2 ** math.ceil(math.log2(bdp)))
    return EnvVar("NCCL_BUFFSIZE", str(size),
                  f"the default 4 MiB per channel carries ≤ {bound / 1e6:.0f} Mbit/s at "
                  f"{f.rtt_ms:.3g} ms, below the path's {f.link_bps / 1e6:.0f} Mbit/s; "
                  f"{size / 2**20:g} MiB covers its BDP (fleet-multipath.md §4; verify on your "
                  "NCCL build)")


def _roce_vars(roce: list[RdmaPort], iface: str | None, facts: PathFacts, sys_root: Path,
               nccl_version: tuple[int, int]) -> list[EnvVar]:
    out = []
    dscp = facts.dscp if facts.dscp is not None else DEFAULT_ROCE_DSCP
    netdev = iface or (roce[0].netdevs[0] if roce[0].netdevs else None)
    ecn = _ecn_on(sys_root, netdev, dscp >> 3) if netdev else None
    tc = dscp << 2 | (0 if ecn is False else 2)
    why_ecn = (f"ECN off for priority {dscp >> 3}, so no ECT" if ecn is False
               else "ECT(0) so switches can ECN-mark (DCQCN)")
    out.append(EnvVar("NCCL_IB_TC", str(tc), f"DSCP {dscp} << 2 | {tc & 3}: {why_ecn}; "
                      f"priority {dscp >> 3} with the default dscp>>3 map"))
    for p in roce:
        auto = nccl_gid_index(p.gids)
        auto_gid = next((g for g in p.gids if g.index == auto), None)
        want = best_gid_for_netdev(p.gids, netdev) if netdev else None
        if nccl_version < (2, 21) and want is not None:
            out.append(EnvVar("NCCL_IB_GID_INDEX", str(want),
                              f"NCCL < 2.21 does not pick the GID: {p.device} index {want} is RoCE v2 IPv4 on {netdev}"))
        elif want is not None and auto_gid is not None and auto_gid.ndev != netdev:
            out.append(EnvVar("NCCL_IB_GID_INDEX", str(want),
                              f"NCCL's automatic choice on {p.device} (index {auto}) is bound to "
                              f"{auto_gid.ndev}, not {netdev}; index {want} is RoCE v2 IPv4 on {netdev}"))
        if any(v.name == "NCCL_IB_GID_INDEX" for v in out):
            break
    return out


def _quote_sh(v: str) -> str:
    return "'" + v.replace("'", "'\\''") + "'"


def render(variables: list[EnvVar], fmt: str, *, header: str = "generated by wanprobe nccl-env",
           notes: list[str] | tuple[str, ...] = ()) -> str:
    """``env``/``nccl.conf``: NAME=VALUE with ``#`` comment lines (NCCL's parser: no quoting);
    ``shell``: export lines; ``systemd``: Environment= lines; ``k8s``: a container ``env:`` list.
    ``notes`` (what was not set, and why) become comment lines under the header."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")
    lines = [f"# {header}"] + [f"# note: {n}" for n in notes]
    if fmt == "k8s":
        lines.append("env:")
        for v in variables:
            lines += [f"  # {v.reason}", f"  - name: {v.name}", f"    value: {json.dumps(v.value)}"]
        return "\n".join(lines) + "\n"
    for v in variables:
        lines.append(f"# {v.reason}")
        if fmt in ("env", "nccl.conf"):
            lines.append(f"{v.name}={v.value}")
        elif fmt == "shell":
            lines.append(f"export {v.name}={_quote_sh(v.value)}")
        else:
            lines.append(f'Environment="{v.name}={v.value}"')
    if fmt == "systemd":
        lines.insert(1, "[Service]")
    return "\n".join(lines) + "\n"
