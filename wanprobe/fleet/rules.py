"""Prometheus recording and alerting rules for a wanprobe fleet (``wanprobe fleet rules``).

Recording rules turn host-pair series into site pairs, the view Pingmesh's SLA dashboards and
site x site heatmap gave (Guo et al., SIGCOMM 2015, §4). Loss is computed by Prometheus from
the raw packet counters over a window (``rate()``), never by the daemon
(https://prometheus.io/docs/practices/instrumentation/#counter-vs-gauge-summary-vs-histogram).
Forward is the probing host towards its peer; reverse the way back (RFC 8762 counters).
Every alert carries ``src_site`` and ``dst_site`` and a summary that names what to look at;
``docs/runbook.md`` has one section per alert. The same PromQL serves ``fleet matrix``.

The daemon's names pass ``promtool check metrics`` (daemon/metrics.py): RTT percentiles are
``wanprobe_rtt_seconds{stat="p50"}`` and goodput ``wanprobe_throughput_bytes_per_second``.
Daemons that predate issue 36 export ``quantile="0.5"`` and ``wanprobe_throughput_bits_per_second``
instead; :func:`rtt_series` and :func:`throughput_bits` read both, so a fleet upgraded host by
host keeps its site-pair figures and alerts, and ``fleet windows`` still finds the hours
recorded before the upgrade in its look-back. A daemon exports one or the other, so an instant
query never counts a host pair twice (only an hourly ``fleet windows`` point in the hour of its
upgrade sees both, as two host pairs of the RTT median); the old forms can go once no such
daemon runs and a look-back (14 days) has passed. The recorded series keep their names
(``site_pair:wanprobe_throughput:bits_per_second`` is bit/s, as ``fleet matrix`` reports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PAIR = "src_site, dst_site"
PATH = "src_site, src_host, dst_site, dst_host"
FLOOR_METRIC = "wanprobe_path_rtt_floor_seconds"  # exported by the multi-path work (branch paths)
RTT_METRIC = "wanprobe_rtt_seconds"
# stat label value -> the quantile label value daemons before issue 36 exported instead
LEGACY_RTT_QUANTILE = {"p50": "0.5", "p99": "0.99"}
THROUGHPUT_METRIC = "wanprobe_throughput_bytes_per_second"
LEGACY_THROUGHPUT_METRIC = "wanprobe_throughput_bits_per_second"  # daemons before issue 36


@dataclass(frozen=True)
class RuleSettings:
    """Windows, thresholds and names the rules are written with."""

    window_s: float = 300.0              # rate() window for loss and liveness
    for_s: float = 300.0                 # how long a condition holds before an alert fires
    eval_interval_s: float | None = None  # group interval; None = Prometheus's global one
    loss_slo_ratio: float = 0.01         # per direction, site pair
    floor_step_ratio: float = 0.2        # RTT floor rise that counts as a step (reroute)
    floor_step_min_s: float = 0.001      # ... and at least this much
    floor_baseline_s: float = 3600.0     # floor compared with its minimum over this long
    throughput_drop_ratio: float = 0.3   # below (1 - this) x median of the baseline window
    throughput_baseline_s: float = 7 * 86400.0
    job: str = "wanprobe"                # scrape job of the daemons
    method: str = "stamp"                # probe method the site-pair view uses
    runbook_url: str = "docs/runbook.md"


def prom_duration(seconds: float) -> str:
    """Seconds as a Prometheus duration: ``300`` → ``5m``, ``1.5`` → ``1500ms``."""
    ms = round(seconds * 1000)
    if ms <= 0:
        return "0s"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _either(now: str, before: str, scale: str, range_s: str, fn: str) -> str:
    """``now <scale> or before`` (for an aggregation's argument or parentheses); with ``fn`` (a
    ``*_over_time`` call up to its range argument, e.g. ``quantile_over_time(0.5, ``) and
    ``range_s`` (``1h``) around each selector, as a range selector must be."""
    if range_s:
        now, before = f"{fn}{now}[{range_s}])", f"{fn}{before}[{range_s}])"
    return f"{now}{scale} or {before}"


def rtt_series(selector: str, stat: str, range_s: str = "", fn: str = "") -> str:
    """``wanprobe_rtt_seconds`` for ``stat`` (p50, p99) under ``selector`` (label matchers,
    comma-separated), from daemons of either label scheme."""
    return _either(f'{RTT_METRIC}{{{selector}, stat="{stat}"}}',
                   f'{RTT_METRIC}{{{selector}, quantile="{LEGACY_RTT_QUANTILE[stat]}"}}',
                   "", range_s, fn)


def throughput_bits(selector: str = "", range_s: str = "", fn: str = "") -> str:
    """A host pair's last goodput in bit/s (the gauge's bytes × 8), from daemons of either
    name; ``selector`` as for :func:`rtt_series`."""
    sel = f"{{{selector}}}" if selector else ""
    return _either(THROUGHPUT_METRIC + sel, LEGACY_THROUGHPUT_METRIC + sel, " * 8", range_s, fn)


def site_pair_queries(s: RuleSettings) -> dict[str, str]:
    """PromQL per site-pair figure; the keys are the recording rules' (and matrix's) names."""
    w, m = prom_duration(s.window_s), f'method="{s.method}"'

    def rate(name: str, sel: str = "") -> str:
        return f"sum by ({PAIR}) (rate({name}{{{m}{sel}}}[{w}]))"

    sent = rate("wanprobe_probe_packets_sent_total")
    fwd = rate("wanprobe_probe_packets_lost_total", ', direction="forward"')
    rev = rate("wanprobe_probe_packets_lost_total", ', direction="reverse"')
    return {
        # median over the pair's host pairs of each one's last-session median
        "site_pair:wanprobe_rtt_p50:seconds":
            f"quantile by ({PAIR}) (0.5, {rtt_series(m, 'p50')})",
        # the worst host pair's last-session p99
        "site_pair:wanprobe_rtt_p99:seconds":
            f"max by ({PAIR}) ({rtt_series(m, 'p99')})",
        "site_pair:wanprobe_loss_forward:ratio": f"{fwd} / {sent}",
        # replies lost out of the probes that reached the reflector
        "site_pair:wanprobe_loss_reverse:ratio": f"{rev} / ({sent} - {fwd})",
        "site_pair:wanprobe_throughput:bits_per_second":
            f"avg by ({PAIR}) ({throughput_bits()})",
    }


def profile_queries(s: RuleSettings) -> dict[str, str]:
    """Per-second site-pair rates the transfer-window profile averages per hour
    (``wanprobe fleet windows``): with them one profile query reads one recorded series per
    figure instead of every host pair's raw samples (bench/windows_query_cost.py)."""
    w, m = prom_duration(s.window_s), f'method="{s.method}"'

    def rate(name: str, sel: str = "") -> str:
        return f"sum by ({PAIR}) (rate({name}{{{m}{sel}}}[{w}]))"

    return {
        "site_pair:wanprobe_probe_packets_sent:rate": rate("wanprobe_probe_packets_sent_total"),
        "site_pair:wanprobe_probe_packets_lost_forward:rate":
            rate("wanprobe_probe_packets_lost_total", ', direction="forward"'),
        "site_pair:wanprobe_probe_packets_lost_reverse:rate":
            rate("wanprobe_probe_packets_lost_total", ', direction="reverse"'),
        "site_pair:wanprobe_probe_sessions:rate": rate("wanprobe_probe_sessions_total"),
    }


def _alert(name: str, expr: str, s: RuleSettings, severity: str, summary: str,
           description: str, extra_labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"alert": name, "expr": expr, "for": prom_duration(s.for_s),
            "labels": {"severity": severity, **(extra_labels or {})},
            "annotations": {"summary": summary, "description": description,
                            "runbook_url": f"{s.runbook_url}#{name.lower()}"}}


LOSS_TEXT = {  # direction -> (who sends the lost packets, who receives them, what to check)
    "forward": ("{{ $labels.src_site }} -> {{ $labels.dst_site }}",
                "Probes from {{ $labels.src_site }} are lost on the way to {{ $labels.dst_site }} "
                "(the reflector's counters say they never arrived). Check the links and carrier "
                "from {{ $labels.src_site }} towards {{ $labels.dst_site }}; `wanprobe fleet "
                "matrix` shows whether other pairs share the loss."),
    "reverse": ("{{ $labels.dst_site }} -> {{ $labels.src_site }}",
                "Probes from {{ $labels.src_site }} reach {{ $labels.dst_site }} but the replies "
                "are lost on the way back. Check the return path from {{ $labels.dst_site }}; "
                "with asymmetric routing it is not the forward one."),
}


def _loss_alerts(s: RuleSettings) -> list[dict[str, Any]]:
    """Loss above the SLO, one alert per direction (RFC 8762 forward/reverse counters)."""
    slo, pct, w = f"{s.loss_slo_ratio:g}", f"{s.loss_slo_ratio * 100:g} %", prom_duration(s.window_s)
    return [_alert(f"WanprobeLoss{d.title()}AboveSLO",
                   f"site_pair:wanprobe_loss_{d}:ratio > {slo}", s, "critical",
                   f"{way}: {d} loss " "{{ $value | humanizePercentage }}" f" over {w} (SLO {pct})",
                   description, {"direction": d})
            for d, (way, description) in LOSS_TEXT.items()]


def _path_alerts(s: RuleSettings) -> list[dict[str, Any]]:
    w, m = prom_duration(s.window_s), f'method="{s.method}"'
    base = prom_duration(s.floor_baseline_s)
    now_floor = f"min_over_time({FLOOR_METRIC}[{w}])"
    old_floor = f"min_over_time({FLOOR_METRIC}[{base}])"
    tput = f"({throughput_bits()})"  # bit/s: the summary's {{ $value }} is the left side
    tbase = f"({throughput_bits('', prom_duration(s.throughput_baseline_s), 'quantile_over_time(0.5, ')})"
    return [
        _alert("WanprobeRttFloorStep",
               f"({now_floor} > {old_floor} * {1 + s.floor_step_ratio:g}) and "
               f"({now_floor} - {old_floor} > {s.floor_step_min_s:g})", s, "warning",
               "{{ $labels.src_host }} ({{ $labels.src_site }}) -> {{ $labels.dst_host }} "
               "({{ $labels.dst_site }}): RTT floor stepped up to {{ $value | humanizeDuration }}",
               "The lowest RTT of the path rose by more than " f"{s.floor_step_ratio * 100:g} % "
               f"over its {base} minimum: the traffic was most likely rerouted onto a longer "
               "path. Run `wanprobe paths` / a traceroute from {{ $labels.src_host }} and "
               "compare with the carrier's maintenance notices."),
        _alert("WanprobeReflectorNotAnswering",
               f"sum by ({PATH}) (increase(wanprobe_probe_sessions_total{{{m}}}[{w}])) > 0 unless "
               f"sum by ({PATH}) (increase(wanprobe_probe_packets_received_total{{{m}}}[{w}])) > 0",
               s, "warning",
               "{{ $labels.src_host }} ({{ $labels.src_site }}) gets no reply from "
               "{{ $labels.dst_host }} ({{ $labels.dst_site }}) for " + w,
               "Every probe session to {{ $labels.dst_host }} failed or came back empty. Check "
               "that its daemon runs and its reflector listens (`wanprobe daemon --check`, "
               "/healthz there), and that UDP port 862 is open between the sites."),
        _alert("WanprobeThroughputBelowBaseline",
               f"{tput} < {1 - s.throughput_drop_ratio:g} * {tbase}", s, "warning",
               "{{ $labels.src_site }} -> {{ $labels.dst_site }}: throughput "
               "{{ $value | humanize }}bit/s is below " +
               f"{(1 - s.throughput_drop_ratio) * 100:g} % of its baseline "
               "({{ $labels.src_host }} -> {{ $labels.dst_host }})",
               "The last scheduled throughput test fell well below the median of the past " +
               prom_duration(s.throughput_baseline_s) + ". Look for loss or an RTT step on the "
               "same pair first; then `wanprobe diagnose` on {{ $labels.src_host }}."),
    ]


def _daemon_alerts(s: RuleSettings) -> list[dict[str, Any]]:
    w = prom_duration(s.window_s)
    # `up` has only the target labels (site, host from `fleet targets`); name them src_*
    up = (f'label_replace(label_replace(up{{job="{s.job}"}} == 0, "src_site", "$1", "site", '
          f'"(.*)"), "src_host", "$1", "host", "(.*)")')
    return [
        _alert("WanprobeDaemonDown", up, s, "warning",
               "wanprobe on {{ $labels.src_host }} ({{ $labels.src_site }}) cannot be scraped",
               "Prometheus gets no /metrics from {{ $labels.instance }}: every pair from "
               "{{ $labels.src_site }} through this host is unmeasured. `systemctl status "
               "wanprobe` and `journalctl -u wanprobe` on the host.", {"dst_site": "any"}),
        _alert("WanprobeDaemonStale",
               f"sum by (src_site, src_host) (rate(wanprobe_probe_sessions_total[{w}])) == 0", s,
               "warning",
               "wanprobe on {{ $labels.src_host }} ({{ $labels.src_site }}) runs but has not "
               "probed for " + w,
               "The daemon answers scrapes but its probe loop ran no session: a stuck loop or "
               "an empty peer list. Check /healthz and `wanprobe daemon --check` on the host.",
               {"dst_site": "any"}),
    ]


def _job_alerts(s: RuleSettings) -> list[dict[str, Any]]:
    """Training steps a daemon put on the path (its ``[job]`` stream, daemon/job_ingest.py)."""
    w = prom_duration(s.window_s)
    slow = (f'label_replace(label_replace(increase(wanprobe_job_slow_steps_total'
            f'{{attribution="path"}}[{w}]) > 0, "src_site", "$1", "site", "(.*)"), '
            f'"src_host", "$1", "host", "(.*)")')
    return [_alert("WanprobeJobSlowStepsOnPath", slow, s, "warning",
                   "{{ $labels.training_job }} on {{ $labels.src_host }} ({{ $labels.src_site }}): "
                   "{{ $value }} slow steps in " + w + " put on the path",
                   "Steps of the training job ran slower than 1.3x its recent median while a "
                   "probed path had a loss burst, a reroute or a queue. `wanprobe job explain "
                   "--steps STEPS --daemon URL` on the host names the edge and the figures.",
                   {"dst_site": "any"})]


def rule_groups(s: RuleSettings) -> dict[str, Any]:
    """The whole rules file as a document (``groups: [...]``)."""
    def group(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
        g: dict[str, Any] = {"name": name}
        if s.eval_interval_s is not None:
            g["interval"] = prom_duration(s.eval_interval_s)
        return g | {"rules": rules}

    records = [{"record": k, "expr": v}
               for k, v in (site_pair_queries(s) | profile_queries(s)).items()]
    return {"groups": [group("wanprobe-site-pairs", records),
                       group("wanprobe-alerts", _loss_alerts(s) + _path_alerts(s)
                             + _daemon_alerts(s) + _job_alerts(s))]}


ALERT_NAMES = ("WanprobeLossForwardAboveSLO", "WanprobeLossReverseAboveSLO", "WanprobeRttFloorStep",
               "WanprobeReflectorNotAnswering", "WanprobeThroughputBelowBaseline",
               "WanprobeDaemonDown", "WanprobeDaemonStale", "WanprobeJobSlowStepsOnPath")
