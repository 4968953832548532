"""Window and send-buffer rules, per measured direction and per host.

A transfer that waited on the receive window is the receiver's ``tcp_rmem``; one whose send
buffer ran dry is the sender's ``tcp_wmem``. Forward (this host sends) the receiver is the peer,
reverse it is this host, so every finding and knob names its host and direction, and the
evidence quotes that host's buffers (from its :class:`HostFacts`), never the other one's.

Buffer size: ``models.bdp.tuned_buffer_bytes`` (BDP × cc gain × loss-recovery headroom ÷ the
window scaling ratio measured on this transfer), capped by 1 GiB (R-3), 16 × BDP and the
receiver's per-flow TCP memory budget (``tcp_mem[1]`` ÷ expected concurrent flows). Where a host's
``net.core.rmem_max``/``wmem_max`` is below that size, they are raised with it: an application
that sizes its own socket buffers (SO_RCVBUF: ``iperf3 -w``, the UDP capacity test's far end) is
capped there, whatever tcp_rmem says (bpftune#188, tcp_rmem grown past rmem_max).

When one stream cannot fill the path even so — the capped buffer's window per RTT, or the rate
one stream reached while its host's CPU was the limit, is below the path's rate — the plan says
how many streams it takes and the NCCL socket settings that open them (``path.streams_needed``,
nccl-tests#83: NCCL moves every socket at the slowest one's pace).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypedDict

from wanprobe.diagnose import inputs as I
from wanprobe.diagnose.finding import Finding, Knob
from wanprobe.diagnose.host_inputs import Host, Triple, buffer_field, triple_text
from wanprobe.diagnose.inputs import DiagnoseConfig
from wanprobe.diagnose.measured import Measured
from wanprobe.diagnose.rule import mbit, mib, ms, rule
from wanprobe.diagnose.transfer import Hosts, Transfer, hosts, pooled_loss, transfers
from wanprobe.models.bdp import (
    DEFAULT_WINDOW_SCALING_RATIO,
    bdp_bytes,
    measured_scaling_ratio,
    per_flow_budget_bytes,
    tuned_buffer_bytes,
    window_limited_rate_bps,
)
from wanprobe.models.collectives import MAX_SOCKETS, split_sockets

LIMITED_SHARE = 0.1          # rwnd_limited / busy_time > 0.1
MAX_BUFFER_BYTES = 2**30     # clamp tcp_rmem[2] <= 1 GiB
CAPACITY_ERROR = 0.15        # the capacity measurement's error band
MAX_BDP_MULTIPLE = 16        # issue 13: 16 MiB on a 1.6 MB BDP path did no better than 4×BDP
FLOW_BUFFER_BYTES = 512 * 2**20  # beyond that, add flows instead of buffer
# A ratio below this means autotuning had not grown the buffer to its max yet, not the kernel's
# skb overhead (len/truesize of a full-MSS skb is ≥ 0.4 on every driver the kernel documents).
MIN_CREDIBLE_RATIO = 0.25
DEFAULT_TRIPLE = (4096, 131072)


class _Sizing(TypedDict):
    """One direction's buffer sizing (:func:`_sizing`): what it was sized for and the result."""

    rtt: float               # s
    target: float            # bit/s, the path rate sized for
    target_src: str
    assumed: bool            # the target is the assumed tier, not a measured or known rate
    bdp: float               # bytes, per flow
    need: int                # bytes, the modelled buffer (tuned_buffer_bytes)
    size: int                # bytes, ``need`` capped
    cap_src: str             # what set the cap
    cc: str | None
    loss: float
    flows: int               # streams the capped buffer needs


def _triple(hs: Hosts, which: str, name: str) -> tuple[tuple[int, int, int] | None, str]:
    """``name`` (tcp_rmem/tcp_wmem) of host ``which`` and where it came from."""
    facts = hs.facts(which)
    field = buffer_field(name)
    if facts is not None and getattr(facts, field) is not None:
        return getattr(facts, field), f"{which} host facts net.ipv4.{name}"
    if which == "local" or hs.legacy:  # a report from before 1.1 knows one host only
        t = getattr(hs.local, field) if hs.local else None
        return t, f"local net.ipv4.{name}" if t else "unknown"
    return None, f"unknown: the peer sent no host facts ({hs.peer_error or 'not asked'})"


def _buffer_knob(name: str, cur: tuple[int, int, int] | None, target: int, which: str,
                 why: str) -> Knob | None:
    """tcp_rmem/tcp_wmem with max ``target``, unless the host already has more (R-5)."""
    if cur and cur[2] >= target:
        return None
    lo, default = (cur[0], cur[1]) if cur else DEFAULT_TRIPLE
    side = "local" if which == "local" else "peer"
    return Knob("sysctl", f"net.ipv4.{name}", f"{lo} {default} {target}", why, side=side,
                host=which)


def _cap(rate: float, rtt: float, hs: Hosts, which: str, config: DiagnoseConfig
         ) -> tuple[int, str]:
    """Largest buffer worth giving one flow on host ``which`` and what set it."""
    caps = [(MAX_BUFFER_BYTES, "1 GiB (R-3)"),
            (int(MAX_BDP_MULTIPLE * bdp_bytes(rate, rtt)), f"{MAX_BDP_MULTIPLE}×BDP")]
    facts = hs.facts(which)
    if facts and facts.tcp_mem_pages and facts.page_size_bytes:
        pressure = facts.tcp_mem_pages[1] * facts.page_size_bytes
        caps.append((per_flow_budget_bytes(pressure, config.concurrent_flows),
                     f"{which} tcp_mem[1] ÷ {config.concurrent_flows} flows"))
    return min(caps)


def _sizing(t: Transfer, m: Measured, config: DiagnoseConfig, hs: Hosts, ratio: float
            ) -> _Sizing | None:
    rtt, _ = I.rtt_s(m)
    if not rtt:
        return None
    target, target_src, assumed = I.target_rate_bps(m, hs.local, config)
    loss, _ = pooled_loss(m)
    # a measured capacity is good to ±15 % (tests/test_throughput_capacity.py): size for the top
    # of that band, since a buffer short of the BDP costs rate and one above it costs nothing
    # but memory (issue 13: 16 MiB did as well as 4×BDP)
    measured_cap = target_src.startswith("measured")
    per_flow = target / t.streams
    sized_for = per_flow / (1 - CAPACITY_ERROR) if measured_cap else per_flow
    cc = sizing_cc(t, hs)
    need = tuned_buffer_bytes(sized_for, rtt, cc=cc, loss=min(loss or 0.0, 0.5),
                              scaling_ratio=ratio, mss_bytes=m.mss_bytes)
    cap, cap_src = _cap(per_flow, rtt, hs, t.receiver, config)  # 16× the measured BDP
    bdp = bdp_bytes(per_flow, rtt)
    return {"rtt": rtt, "target": target, "target_src": target_src, "assumed": assumed,
            "bdp": bdp, "need": need, "size": min(need, cap), "cap_src": cap_src,
            "cc": cc, "loss": loss or 0.0,
            "flows": max(1, math.ceil(need / min(cap, FLOW_BUFFER_BYTES)))}


def host_model_buffer(m: Measured, host: Host | None, config: DiagnoseConfig
                      ) -> tuple[int, str] | None:
    """For the host-config rule: the modelled buffer when the path capacity was measured
    (schema 1.1), else None (the rule keeps the R-1 2×BDP floor). No transfer to read the
    window ratio from: the kernel's starting 1/2; cc bbr when this host offers it."""
    rtt, _ = I.rtt_s(m)
    target, src, _ = I.target_rate_bps(m, host, config)
    if not rtt or not src.startswith("measured"):
        return None
    loss, _ = pooled_loss(m)
    cc = "bbr" if host and "bbr" in host.cc_available else (host.cc_current if host else None)
    need = tuned_buffer_bytes(target / (1 - CAPACITY_ERROR), rtt, cc=cc,
                              loss=min(loss or 0.0, 0.5), mss_bytes=m.mss_bytes)
    size = min(need, MAX_BUFFER_BYTES, int(MAX_BDP_MULTIPLE * bdp_bytes(target, rtt)))
    return size, (f"{size / bdp_bytes(target, rtt):.1f}×BDP for the measured {mbit(target)} × "
                  f"{ms(rtt)} ({cc}, loss {loss or 0.0:.2%}; model, tcp-tuning.md §3)")


def sizing_cc(t: Transfer, hs: Hosts) -> str | None:
    """The cc the buffer must serve: bbr where the sender can run it (the path rules move long
    lossy paths to it, R-9, and it needs the most: cwnd gain 2), else what the transfer used."""
    facts = hs.facts(t.sender)
    offered = set(facts.cc_available or facts.cc_allowed) if facts else set()
    return "bbr" if "bbr" in offered or t.cc == "bbr" else (t.cc or (facts.cc_current
                                                                     if facts else None))


def _window_ratio(t: Transfer, rmem: tuple[int, int, int] | None) -> tuple[float, str]:
    r = measured_scaling_ratio(t.peer_window_max_bytes, rmem[2] if rmem else None)
    if r is not None and r >= MIN_CREDIBLE_RATIO:
        return r, "measured: the receiver's largest advertised window ÷ its tcp_rmem[2]"
    return DEFAULT_WINDOW_SCALING_RATIO, ("assumed 1/2 (TCP_DEFAULT_SCALING_RATIO, "
                                          "include/net/tcp.h): not measurable on this transfer")


APP_LIMITED_LOSS = 1e-4  # above it the sender's cwnd, not the reader, can explain the gap


def _waited(t: Transfer, verdict: str, share: float | None) -> bool:
    """R-7: the transfer's verdict is ``verdict``, or it spent over 10 % of its busy time
    limited by it (``share``)."""
    return t.verdict == verdict or (share is not None and share > LIMITED_SHARE)


def _target_bps(s: _Sizing | None, m: Measured, config: DiagnoseConfig, hs: Hosts) -> float:
    return s["target"] if s else I.target_rate_bps(m, hs.local, config)[0]


def _receiver_lagged(t: Transfer, window: float | None, window_src: str, cap: float | None,
                     rmem: tuple[int, int, int] | None, ratio: float, legacy: bool,
                     m: Measured) -> bool:
    """The window allowed ≥ 2× what came through, although the receiver's buffer had not
    reached its configured max and no loss held the sender's cwnd down: the reading
    application lagged (the buffer was full, not small)."""
    measured = t.bits_per_second
    if not (window_src.startswith("TCP_INFO") and cap and measured and cap >= 2 * measured):
        return False
    loss, _ = pooled_loss(m)
    if loss is not None and loss > APP_LIMITED_LOSS:
        return False
    at_max = rmem is not None and window is not None and window >= 0.9 * rmem[2] * ratio
    return legacy or not at_max


def _app_limited(t: Transfer, evidence: dict[str, Any], window: float, cap: float,
                 target: float | None) -> Finding:
    measured = t.bits_per_second or 0.0
    evidence["window_allows_x_measured"] = cap / measured
    return Finding(
        id="path.receiver_app_limited", severity="warning",
        title=f"Receive window full on the {t.receiver} host: its application does not "
              "keep up", evidence=evidence,
        recommendation=("Check the receiver's CPU and how it reads the socket; more "
                        "parallel streams spread the work. Raising tcp_rmem will not help: "
                        "the advertised window already allows more."),
        expected_effect=(f"the {mib(window)} window allows ≈ {mbit(cap)}, "
                         f"{cap / measured:.0f}× the {mbit(measured)} delivered"),
        impact=1 - measured / target if target else None, host=t.receiver,
        direction=t.direction)


def _core_max_knob(name: str, hs: Hosts, which: str, size: int) -> Knob | None:
    """net.core.rmem_max/wmem_max up to ``size`` where host ``which`` reported less."""
    facts = hs.facts(which)
    current = getattr(facts, f"{name}_bytes", None) if facts else None
    if current is None or current >= size:
        return None
    return Knob("sysctl", f"net.core.{name}", str(size),
                f"{name} {current} B caps an application's own SO_{'RCV' if name[0] == 'r' else 'SND'}"
                f"BUF below the {mib(size)} the plan sets (bpftune#188)",
                side="local" if which == "local" else "peer", host=which)


def _buffer_plan(t: Transfer, s: _Sizing, rmem: Triple | None, wmem: Triple | None,
                 ratio: float, hs: Hosts) -> tuple[list[Knob], list[str]]:
    """The receiver's tcp_rmem and the sender's tcp_wmem knobs (with rmem_max/wmem_max where
    they are below), and the prose for them."""
    why = (f"{s['need'] / s['bdp']:.1f}×BDP for {mbit(s['target'])} × {ms(s['rtt'])} "
           f"({s['cc'] or 'cc unknown'}, loss {s['loss']:.2%}, window ratio {ratio:.2f})")
    knobs = [k for k in (_buffer_knob("tcp_rmem", rmem, s["size"], t.receiver, why),
                         _buffer_knob("tcp_wmem", wmem, s["size"], t.sender, why),
                         _core_max_knob("rmem_max", hs, t.receiver, s["size"]),
                         _core_max_knob("wmem_max", hs, t.sender, s["size"])) if k]
    parts = [f"set tcp_rmem max on the {t.receiver} host to {mib(s['size'])} = "
             f"{s['size'] / s['bdp']:.1f}×BDP at {ms(s['rtt'])} (≥ 2×BDP: BDP × cc gain × "
             f"loss recovery ÷ window ratio, {s['cap_src']} cap)"]
    if s["flows"] > 1 and s["size"] < s["need"]:
        parts.append(f"and use ≥ {s['flows']} streams (R-4)")
    return knobs, parts


def window_finding(t: Transfer, m: Measured, config: DiagnoseConfig, hs: Hosts) -> Finding | None:
    """One direction's transfer waited on the receiver's window (R-7): size its tcp_rmem."""
    share = t.rwnd_limited_share
    if not _waited(t, "receive_window", share):
        return None
    rmem, rmem_src = _triple(hs, t.receiver, "tcp_rmem")
    wmem, _ = _triple(hs, t.sender, "tcp_wmem")
    ratio, ratio_src = _window_ratio(t, rmem)
    window, window_src = t.peer_window_max_bytes, "TCP_INFO snd_wnd (receiver's advertised window)"
    if window is None and rmem:
        window = rmem[2] * ratio
        window_src = f"{rmem_src}[2] × scaling ratio {ratio:.2f} (tcp_win_from_space)"
    s = _sizing(t, m, config, hs, ratio)
    rtt = s["rtt"] if s else I.rtt_s(m)[0]
    cap = window_limited_rate_bps(window, rtt) if rtt and window else None
    measured = t.bits_per_second
    target = _target_bps(s, m, config, hs)
    evidence: dict[str, Any] = {
        "host": t.receiver, "direction": t.direction, "verdict": t.verdict,
        "rwnd_limited_share": share, "bits_per_second": measured,
        "rtt_ms": rtt * 1e3 if rtt else None, "window_bytes": window,
        "tcp_rmem": triple_text(rmem),
        "window_scaling_ratio": ratio, "link_rate_bps": target,
        "link_rate_assumed": s["assumed"] if s else None, "streams": t.streams,
        "window_limited_rate_bps": cap,
        "sources": {"verdict": "throughput limited_by", "window_bytes": window_src,
                    "tcp_rmem": rmem_src, "window_scaling_ratio": ratio_src,
                    "link_rate_bps": s["target_src"] if s else None,
                    "bits_per_second": "throughput receiver goodput"}}
    # cap is known only with a window; _receiver_lagged needs both
    if window is not None and cap is not None \
            and _receiver_lagged(t, window, window_src, cap, rmem, ratio, hs.legacy, m):
        return _app_limited(t, evidence, window, cap, target)
    if cap is not None and target and cap >= target and t.verdict != "receive_window":
        # its own evidence would contradict it (issue 36): a window that carries the whole path
        # did not limit the transfer, whatever share of time the kernel counted rwnd-limited
        return None
    parts = [f"{t.direction} ({t.sender} → {t.receiver}): measured {mbit(measured)} of "
             f"{mbit(target)}"]
    if cap is not None:
        parts.append(f"a {mib(window)} window caps one stream at ≈ {mbit(cap)}")
    knobs: list[Knob] = []
    if s:
        evidence.update(bdp_bytes=s["bdp"], buffer_needed_bytes=s["need"],
                        buffer_bytes=s["size"], buffer_cap=s["cap_src"])
        knobs, more = _buffer_plan(t, s, rmem, wmem, ratio, hs)
        parts += more
    got = measured if measured is not None else cap
    return Finding(
        id="path.window_limited",
        severity="info" if measured is not None and target and measured >= target else "critical",
        title=(f"Throughput is limited by the TCP receive window of the {t.receiver} host "
               f"({t.direction}: {t.sender} → {t.receiver})"),
        evidence=evidence,
        recommendation=(f"Raise net.ipv4.tcp_rmem max on the {t.receiver} host (the receiver; "
                        f"tcp_wmem on the {t.sender} host, the sender) with `wanprobe tune plan "
                        f"--host {t.receiver}`, or split the transfer over parallel streams; do "
                        "not set SO_RCVBUF in the application (it disables autotuning)."),
        expected_effect="; ".join(parts), knobs=tuple(knobs),
        impact=(1 - got / target) if got is not None and target else share,
        host=t.receiver, direction=t.direction)


def send_buffer_finding(t: Transfer, m: Measured, config: DiagnoseConfig, hs: Hosts
                        ) -> Finding | None:
    """The sender's buffer ran dry (tcpi_sndbuf_limited dominates, R-7): its tcp_wmem."""
    share = t.sndbuf_limited_share
    if not _waited(t, "send_buffer", share):
        return None
    wmem, wmem_src = _triple(hs, t.sender, "tcp_wmem")
    s = _sizing(t, m, config, hs, DEFAULT_WINDOW_SCALING_RATIO)
    target = _target_bps(s, m, config, hs)
    knobs: tuple[Knob, ...] = ()
    effect = f"{t.direction}: measured {mbit(t.bits_per_second)} against {mbit(target)}"
    if s:
        k = _buffer_knob("tcp_wmem", wmem, s["size"], t.sender,
                         f"sender buffer {s['size'] / s['bdp']:.1f}×BDP (R-7, model)")
        knobs = (k,) if k else ()
        effect += (f"; set tcp_wmem max on the {t.sender} host ≥ {mib(s['size'])} at "
                   f"{s['rtt'] * 1e3:.0f} ms")
    return Finding(
        id="path.send_buffer_limited", severity="critical",
        title=(f"Throughput is limited by the sender's socket buffer on the {t.sender} host "
               f"({t.direction}: {t.sender} → {t.receiver})"),
        evidence={"host": t.sender, "direction": t.direction, "verdict": t.verdict,
                  "sndbuf_limited_share": share, "bits_per_second": t.bits_per_second,
                  "tcp_wmem": triple_text(wmem),
                  "link_rate_bps": target, "rtt_ms": s["rtt"] * 1e3 if s else None,
                  "sources": {"verdict": "throughput limited_by", "tcp_wmem": wmem_src}},
        recommendation=f"Raise net.ipv4.tcp_wmem max on the {t.sender} host (the sender).",
        expected_effect=effect, knobs=knobs,
        impact=1 - t.bits_per_second / target if t.bits_per_second is not None and target
        else share, host=t.sender, direction=t.direction)


DirectionRule = Callable[[Transfer, Measured, DiagnoseConfig, Hosts], Finding | None]


def _per_direction(fn: DirectionRule, m: Measured, host: Host | None, config: DiagnoseConfig
                   ) -> Finding | list[Finding] | None:
    hs = hosts(m, host)
    out = [f for t in transfers(m) if (f := fn(t, m, config, hs)) is not None]
    if not out:
        return None
    return out[0] if len(out) == 1 else out


def streams_finding(t: Transfer, m: Measured, config: DiagnoseConfig, hs: Hosts
                    ) -> Finding | None:
    """One direction where one stream cannot carry the path's measured rate: the window its
    capped buffer allows per RTT, or what one stream reached while a host's CPU was the limit."""
    rmem, _ = _triple(hs, t.receiver, "tcp_rmem")
    ratio, _ = _window_ratio(t, rmem)
    s = _sizing(t, m, config, hs, ratio)
    if s is None or s["assumed"]:
        return None  # a guessed link rate sizes no streams
    target, rtt = s["target"], s["rtt"]
    window = max(s["size"], rmem[2] if rmem else 0) * ratio
    ceilings = [(window_limited_rate_bps(window, rtt),
                 f"a {mib(window)} window ({mib(s['size'])} buffer, {s['cap_src']} cap, ratio "
                 f"{ratio:.2f}) carries ≈ {{rate}} per stream at {ms(rtt)}")]
    if t.verdict == "host_cpu" and t.bits_per_second:
        ceilings.append((t.bits_per_second / t.streams,
                         f"one stream reached {{rate}} while a host's CPU was its limit "
                         f"({t.direction} throughput verdict host_cpu)"))
    ceiling, why = min(ceilings, key=lambda c: c[0])
    if ceiling <= 0 or ceiling >= target:
        return None
    n = math.ceil(target / ceiling)
    threads, per = split_sockets(min(n, MAX_SOCKETS))
    reason = (f"{why.format(rate=mbit(ceiling))}; the path carries {mbit(target)} "
              f"({s['target_src']}): {n} streams, NCCL {threads}×{per} sockets")
    return Finding(
        id="path.streams_needed", severity="warning",
        title=f"One stream cannot fill this path: use {n} streams ({t.direction})",
        evidence={"direction": t.direction, "streams_needed": n,
                  "per_stream_ceiling_bps": ceiling, "link_rate_bps": target,
                  "rtt_ms": rtt * 1e3, "buffer_bytes": s["size"], "window_bytes": window,
                  "nccl_socket_nthreads": threads, "nccl_nsocks_perthread": per,
                  "sources": {"link_rate_bps": s["target_src"], "buffer_cap": s["cap_src"]}},
        recommendation=(f"Spread transfers over ≥ {n} parallel streams; for NCCL set "
                        f"NCCL_SOCKET_NTHREADS={threads} NCCL_NSOCKS_PERTHREAD={per} "
                        "(`wanprobe nccl-env`)."),
        expected_effect=reason,
        knobs=(Knob("nccl", "NCCL_SOCKET_NTHREADS", str(threads), reason, side="both"),
               Knob("nccl", "NCCL_NSOCKS_PERTHREAD", str(per), reason, side="both")),
        impact=1 - ceiling / target, direction=t.direction)


@rule("path.streams_needed")
def streams_needed(m: Measured, host: Host | None,
                   config: DiagnoseConfig) -> Finding | list[Finding] | None:
    """Each measured direction where one stream cannot fill the path."""
    return _per_direction(streams_finding, m, host, config)


@rule("path.window_limited")
def window_limited(m: Measured, host: Host | None,
                   config: DiagnoseConfig) -> Finding | list[Finding] | None:
    """Each measured direction whose transfer waited on the receive window."""
    return _per_direction(window_finding, m, host, config)


@rule("path.send_buffer_limited")
def send_buffer_limited(m: Measured, host: Host | None,
                        config: DiagnoseConfig) -> Finding | list[Finding] | None:
    """Each measured direction whose sender's buffer ran dry."""
    return _per_direction(send_buffer_finding, m, host, config)
