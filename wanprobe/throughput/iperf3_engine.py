"""`--engine iperf3`: run the iperf3 client (`iperf3 -J`) and map its JSON into ThroughputResult.

Keys as esnet/iperf writes them (src/iperf_api.c, src/iperf_tcp.c): rtt/min_rtt/mean_rtt in µs,
snd_cwnd in bytes, retransmits = the sender's tcpi_total_retrans.

The installed version is read (``iperf3 --version``), not assumed, and named in the result:
from 3.16 each stream of ``-P`` runs in its own thread (RELNOTES 3.16), so its CPU figures are
shares of several cores; from 3.17 ``--json-stream`` gives one ``{"event", "data"}`` object per
line (src/iperf_api.c, JSONStream_Output), read live for the progress line. Debian 12 ships 3.12:
one thread for every stream, a ceiling the result notes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time

from wanprobe.errors import ProbeError, UsageError
from wanprobe.throughput.result import (
    DirectionSummary,
    IntervalResult,
    StreamResult,
    ThroughputResult,
    UdpResult,
    mark_partial_tail,
)
from wanprobe.throughput.verdict import (
    Judge,
    Verdict,
    VerdictInput,
    bdp_bytes,
    need_judge,
    single_stream_buffer_bytes,
    verdict_of,
)

DEFAULT_MSS_BYTES = 1448
THREADS_FROM = (3, 16)      # one thread per stream (RELNOTES 3.16)
JSON_STREAM_FROM = (3, 17)  # --json-stream (RELNOTES 3.17)
_VERSION_RE = re.compile(rb"iperf (\d+)\.(\d+)(?:\.(\d+))?")


def parse_iperf3_version(text: bytes) -> tuple[int, ...] | None:
    """(3, 12) from ``iperf 3.12 (cJSON 1.7.15)``, (3, 16, 1) from ``iperf 3.16.1 ...``."""
    m = _VERSION_RE.search(text)
    if m is None:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def iperf3_version(binary: str) -> tuple[int, ...] | None:
    """The installed client's version, None when it does not say."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_iperf3_version(out.stdout + out.stderr)


def version_notes(version: tuple[int, ...] | None, streams: int) -> tuple[str, ...]:
    """What the version means for the figures (a ceiling the operator should know about)."""
    if version is None:
        return ("iperf3 did not report its version",)
    if version < THREADS_FROM and streams > 1:
        return (f"iperf3 {_v(version)} runs all {streams} streams in one thread (one thread "
                "per stream from 3.16): one core may be its ceiling",)
    return ()


def _v(version: tuple[int, ...] | None) -> str:
    return ".".join(map(str, version)) if version else "unknown"


def read_json_stream(lines, progress=None) -> dict:
    """Assemble the ``-J`` document from ``--json-stream`` lines (start, interval, end, error
    events); ``progress(elapsed_s, bits_per_second)`` is called per interval as it arrives."""
    doc: dict = {"intervals": []}
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if not isinstance(ev, dict):
            continue
        name, data = ev.get("event"), ev.get("data")
        if name == "interval" and isinstance(data, dict):
            doc["intervals"].append(data)
            s = data.get("sum") or {}
            if progress and isinstance(s.get("end"), int | float):
                progress(float(s["end"]), float(s.get("bits_per_second") or 0.0))
        elif name in ("start", "end") and isinstance(data, dict):
            doc[name] = data
        elif name == "error":
            doc["error"] = str(data)
    return doc


def iperf3_argv(peer: str, *, port: int, duration_s: float, streams: int, reverse: bool,
                bidir: bool, cc: str | None, window_bytes: int | None, dscp: int,
                pacing_rate_bps: float | None, udp: bool, udp_rate_bps: float | None,
                interval_s: float, binary: str = "iperf3",
                version: tuple[int, ...] | None = None) -> list[str]:
    """The iperf3 client command line for these options (``--json-stream`` from 3.17)."""
    argv = [binary, "-c", peer, "-p", str(port), "-J", "-t", f"{duration_s:g}",
            "-i", f"{interval_s:g}", "-P", str(streams)]
    if version is not None and version >= JSON_STREAM_FROM:
        argv.append("--json-stream")
    if reverse:
        argv.append("-R")
    if bidir:
        argv.append("--bidir")
    if cc:
        argv += ["-C", cc]
    if window_bytes:
        argv += ["-w", str(int(window_bytes))]
    if dscp:
        argv += ["--dscp", str(dscp)]
    if pacing_rate_bps:
        argv += ["--fq-rate", str(int(pacing_rate_bps))]
    if udp:
        argv += ["-u", "-b", str(int(udp_rate_bps or 0))]
    return argv


def _tcp_info_from_iperf3(sender: dict, last_interval: dict | None, mss: int) -> dict:
    cwnd = sender.get("max_snd_cwnd")
    return {
        "rtt_ms": sender["mean_rtt"] / 1000.0 if sender.get("mean_rtt") else None,
        "min_rtt_ms": sender["min_rtt"] / 1000.0 if sender.get("min_rtt") else None,
        "rttvar_ms": (last_interval or {}).get("rttvar", 0) / 1000.0 if last_interval else None,
        "cwnd_packets": int(cwnd // mss) if cwnd else None,
        "snd_mss_bytes": mss, "total_retrans_packets": sender.get("retransmits"),
        "bytes_retrans": None, "bytes_sent": sender.get("bytes"), "bytes_acked": None,
        "delivery_rate_bits_per_second": None, "pacing_rate_bits_per_second": None,
        "busy_time_ms": None, "rwnd_limited_ms": None, "sndbuf_limited_ms": None,
        "snd_wnd_bytes": sender.get("max_snd_wnd"), "ca_state": None,
        "rtt_max_ms": sender["max_rtt"] / 1000.0 if sender.get("max_rtt") else None,
        "source": "iperf3",
    }


def _streams(end: dict, intervals_raw: list, mss: int, *, udp: bool,
             server_sends: bool) -> list[StreamResult]:
    """The per-stream totals of ``end.streams``, each with the TCP_INFO iperf3 sampled last."""
    streams: list[StreamResult] = []
    for i, s in enumerate(end.get("streams") or []):
        snd, rcv = s.get("sender") or s.get("udp") or {}, s.get("receiver") or s.get("udp") or {}
        last = None
        for iv in intervals_raw:
            for row in iv.get("streams", []):
                if row.get("socket") == snd.get("socket") and row.get("sender"):
                    last = row
        info = None if udp else _tcp_info_from_iperf3(snd, last, mss)
        streams.append(StreamResult(
            stream_id=i, direction="server_to_client" if snd.get("sender") is False or
            server_sends else "client_to_server",
            bytes_sent=int(snd.get("bytes", 0)), bytes_received=int(rcv.get("bytes", 0)),
            seconds=float(rcv.get("seconds", 0.0)),
            bits_per_second=float(rcv.get("bits_per_second", 0.0)),
            sender_bits_per_second=float(snd.get("bits_per_second", 0.0)),
            retransmits=snd.get("retransmits"),
            rtt_mean_ms=info["rtt_ms"] if info else None,
            rtt_max_ms=info["rtt_max_ms"] if info else None, tcp_info=info))
    return streams


def _intervals(intervals_raw: list) -> list[IntervalResult]:
    """Each interval's sum and its per-stream rows; a short last one marked partial."""
    intervals = []
    for iv in intervals_raw:
        sm = iv.get("sum") or {}
        rows = tuple({"id": n, "bytes_received": int(r.get("bytes", 0)),
                      "bits_per_second": float(r.get("bits_per_second", 0.0)),
                      "retransmits": r.get("retransmits"),
                      "rtt_ms": r["rtt"] / 1000.0 if r.get("rtt") else None,
                      "cwnd_bytes": r.get("snd_cwnd")} for n, r in enumerate(iv.get("streams", [])))
        intervals.append(IntervalResult(
            start_s=float(sm.get("start", 0.0)), end_s=float(sm.get("end", 0.0)),
            bytes_received=int(sm.get("bytes", 0)), bytes_sent=int(sm.get("bytes", 0)),
            bits_per_second=float(sm.get("bits_per_second", 0.0)),
            retransmits=sm.get("retransmits"), streams=rows))
    return mark_partial_tail(intervals)


def _udp(end: dict, test: dict, udp_rate_bps: float | None, sent: dict,
         received: dict) -> UdpResult:
    usum = end.get("sum") or {}
    return UdpResult(
        target_bits_per_second=float(udp_rate_bps or test.get("target_bitrate") or 0),
        bits_per_second=float(received.get("bits_per_second", 0.0)),
        sender_bits_per_second=float(sent.get("bits_per_second", 0.0)),
        packet_bytes=int(test.get("blksize") or 0),
        packets_sent=int(usum.get("packets", 0)),
        packets_received=int(usum.get("packets", 0)) - int(usum.get("lost_packets", 0)),
        lost_packets=int(usum.get("lost_packets", 0)),
        lost_percent=float(usum.get("lost_percent", 0.0)),
        out_of_order=int(usum.get("out_of_order", 0) or 0),
        jitter_ms=float(usum.get("jitter_ms", 0.0)))


def _busy(cpu: dict, streams: int, version: tuple[int, ...] | None, local_cores: int,
          reverse: bool) -> tuple[float | None, float | None]:
    """(sender, receiver) CPU share of one thread's time, in percent. host_total is the
    process's CPU time over wall time (getrusage, src/iperf_api.c): with a thread per stream
    (3.16+) a share of min(streams, cores) cores, else of one."""
    local, remote = cpu.get("host_total"), cpu.get("remote_total")
    threads = max(streams, 1) if version is not None and version >= THREADS_FROM else 1
    local = local / min(threads, max(local_cores, 1)) if local is not None else None
    remote = remote / threads if remote is not None else None  # its cores are unknown here
    return (remote, local) if reverse else (local, remote)


def _bidir_reverse(end: dict) -> DirectionSummary:
    rs, rr = end.get("sum_sent_bidir_reverse") or {}, end.get("sum_received_bidir_reverse") or {}
    return DirectionSummary("server_to_client", float(rr.get("bits_per_second", 0.0)),
                            float(rs.get("bits_per_second", 0.0)), int(rr.get("bytes", 0)),
                            int(rs.get("bytes", 0)), rs.get("retransmits"))


def _verdict(vin: VerdictInput, udp_result: UdpResult | None, judge: Judge | None) -> Verdict:
    """A UDP test's fixed verdict, or the caller's judge's on a TCP test's figures; with the
    note that iperf3 gives no limited-time counters."""
    verdict = verdict_of(vin, udp_result.lost_percent if udp_result else None, judge,
                         udp=udp_result is not None)
    return Verdict(verdict.verdict, {**verdict.evidence, "source": "iperf3 (no TCP_INFO "
                                     "limited-time counters; retransmit bytes estimated as "
                                     "retransmits x MSS)"}, verdict.summary)


def parse_iperf3_json(doc: dict, *, peer: str, port: int, requested_duration_s: float,
                      streams_requested: int, window_bytes: int | None, dscp: int,
                      pacing_rate_bps: float | None, udp_rate_bps: float | None,
                      version: tuple[int, ...] | None = None,
                      local_cores: int = 1, judge: Judge | None = None) -> ThroughputResult:
    """Map an `iperf3 -J` document to a ThroughputResult (pure). ``version``: the client's
    (from 3.16 its CPU figures add up one thread per stream); ``judge``: the caller's, which
    decides a TCP test's verdict (verdict.Judge; a UDP test's is fixed)."""
    start, end = doc.get("start") or {}, doc.get("end") or {}
    test = start.get("test_start") or {}
    udp = test.get("protocol") == "UDP"
    need_judge(judge, udp)
    reverse = bool(test.get("reverse"))
    # 3.12 does not echo "bidir" in test_start; the reverse sums give it away.
    bidir = bool(test.get("bidir")) or "sum_sent_bidir_reverse" in end
    mss = start.get("tcp_mss_default") or start.get("tcp_mss") or DEFAULT_MSS_BYTES
    error = doc.get("error")
    intervals_raw = doc.get("intervals") or []
    streams = _streams(end, intervals_raw, mss, udp=udp, server_sends=reverse and not bidir)
    sent = end.get("sum_sent") or end.get("sum") or {}
    received = end.get("sum_received") or end.get("sum") or {}
    udp_result = _udp(end, test, udp_rate_bps, sent, received) if udp else None
    goodput = float(received.get("bits_per_second", 0.0))
    retrans = sent.get("retransmits")
    main = [s for s in streams if s.direction == ("server_to_client" if reverse and not bidir
                                                   else "client_to_server")]
    min_rtts = [s.tcp_info["min_rtt_ms"] for s in main if s.tcp_info and s.tcp_info["min_rtt_ms"]]
    mean_rtts = [s.rtt_mean_ms for s in main if s.rtt_mean_ms]
    cpu = end.get("cpu_utilization_percent") or {}
    snd_cpu, rcv_cpu = _busy(cpu, len(main), version, local_cores, reverse)
    bytes_sent = int(sent.get("bytes", 0))
    vin = VerdictInput(
        goodput_bps=goodput, streams=max(len(main), 1), bytes_sent=bytes_sent or None,
        bytes_retrans=int(retrans * mss) if retrans is not None else None,
        min_rtt_ms=min(min_rtts) if min_rtts else None,
        srtt_ms=sum(mean_rtts) / len(mean_rtts) if mean_rtts else None, mss_bytes=mss,
        window_bytes=window_bytes,
        sender_thread_busy=snd_cpu / 100.0 if snd_cpu is not None else None,
        receiver_thread_busy=rcv_cpu / 100.0 if rcv_cpu is not None else None,
        pacing_rate_bps=pacing_rate_bps)
    rtt_s = (vin.min_rtt_ms or 0) / 1000.0
    return ThroughputResult(
        peer=peer, port=port, engine="iperf3", protocol="udp" if udp else "tcp",
        mode="bidir" if bidir else ("reverse" if reverse else "forward"),
        cc=end.get("sender_tcp_congestion"), requested_duration_s=requested_duration_s,
        duration_s=float(received.get("seconds", 0.0)), streams_requested=streams_requested,
        window_bytes=window_bytes, dscp=dscp, pacing_rate_bps=pacing_rate_bps,
        bits_per_second=udp_result.bits_per_second if udp_result else goodput,
        sender_bits_per_second=float(sent.get("bits_per_second", 0.0)),
        bytes_received=int(received.get("bytes", 0)), bytes_sent=bytes_sent,
        retransmits=retrans, min_rtt_ms=vin.min_rtt_ms, bdp_bytes=bdp_bytes(goodput, rtt_s),
        single_stream_buffer_bytes=single_stream_buffer_bytes(goodput, rtt_s),
        limited_by=_verdict(vin, udp_result, judge),
        streams=tuple(streams), intervals=tuple(_intervals(intervals_raw)),
        cpu={"iperf3_cpu_utilization_percent": cpu,
             "sender_thread_busy_ratio": vin.sender_thread_busy,
             "receiver_thread_busy_ratio": vin.receiver_thread_busy},
        udp=udp_result, reverse=_bidir_reverse(end) if bidir else None, partial=bool(error),
        partial_reason=error or None,
        engine_version=f"iperf3 {_v(version)}" if version else None,
        notes=version_notes(version, streams_requested))


def run_iperf3(peer: str, *, port: int, duration_s: float, streams: int, reverse: bool,
               bidir: bool, cc: str | None, window_bytes: int | None, dscp: int,
               pacing_rate_bps: float | None, udp: bool, udp_rate_bps: float | None,
               interval_s: float, max_bytes: int, progress=None,
               judge: Judge | None = None) -> ThroughputResult:
    """Run `iperf3 -c` and map its result (``judge``: as parse_iperf3_json's); one-line
    ProbeError when it cannot run at all."""
    need_judge(judge, udp)
    binary = shutil.which("iperf3")
    if binary is None:
        raise UsageError("--engine iperf3 needs the iperf3 client installed")
    if port == 862:
        port = 5201  # the wanprobe default is the STAMP port; iperf3 servers listen on 5201
    version = iperf3_version(binary)
    argv = iperf3_argv(peer, port=port, duration_s=duration_s, streams=streams, reverse=reverse,
                       bidir=bidir, cc=cc, window_bytes=window_bytes, dscp=dscp,
                       pacing_rate_bps=pacing_rate_bps, udp=udp, udp_rate_bps=udp_rate_bps,
                       interval_s=interval_s, binary=binary, version=version)
    doc = _run(argv, duration_s + 30, progress,
               streaming=version is not None and version >= JSON_STREAM_FROM)
    if doc.get("error") and not doc.get("intervals"):
        raise ProbeError(f"iperf3: {doc['error']}")
    result = parse_iperf3_json(doc, peer=peer, port=port, requested_duration_s=duration_s,
                               streams_requested=streams, window_bytes=window_bytes, dscp=dscp,
                               pacing_rate_bps=pacing_rate_bps, udp_rate_bps=udp_rate_bps,
                               version=version, local_cores=_cores(), judge=judge)
    if result.bytes_sent > max_bytes:
        # iperf3 has no byte cap next to -t; report that the cap was exceeded rather than hide it.
        result = ThroughputResult(**{**result.__dict__, "partial": True,
                                     "partial_reason": "iperf3 exceeded the byte cap"})
    return result


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except OSError:
        return os.cpu_count() or 1


def _run(argv: list[str], timeout_s: float, progress, *, streaming: bool) -> dict:
    """Run the client; its ``-J`` document, or one assembled from ``--json-stream`` lines."""
    if not streaming:
        done = threading.Event()
        if progress:
            def tick() -> None:
                t0 = time.monotonic()
                while not done.wait(0.25):
                    progress(time.monotonic() - t0, None)
            threading.Thread(target=tick, daemon=True).start()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ProbeError(f"iperf3 did not finish within {timeout_s:g} s") from None
        finally:
            done.set()
        try:
            return json.loads(proc.stdout)
        except ValueError:
            msg = (proc.stderr or proc.stdout).strip().splitlines()
            raise ProbeError(f"iperf3 failed: {msg[-1] if msg else 'no output'}") from None
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killer = threading.Timer(timeout_s, proc.kill)
    killer.start()
    try:
        doc = read_json_stream(proc.stdout, progress)
        err = proc.stderr.read()
        proc.wait()
    finally:
        killer.cancel()
    if proc.returncode < 0:
        raise ProbeError(f"iperf3 did not finish within {timeout_s:g} s")
    if "start" not in doc and "error" not in doc:
        msg = err.strip().splitlines()
        raise ProbeError(f"iperf3 failed: {msg[-1] if msg else 'no output'}")
    return doc
