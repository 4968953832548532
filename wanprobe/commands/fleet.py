"""CLI commands: ``wanprobe fleet targets | rules | matrix`` (Prometheus for a whole fleet)."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from wanprobe import units
from wanprobe.commands import windows_view as views
from wanprobe.commands.options import http_url
from wanprobe.errors import UsageError, shown
from wanprobe.safe_text import SafeConsole as Console  # external text is data (issue 19)
from wanprobe.windows.profile import require_goodput

app = typer.Typer(name="fleet", help="Run a fleet on Prometheus: scrape targets from the mesh file, "
                       "recording and alerting rules, the site x site matrix, transfer "
                       "windows per site pair.",
                  no_args_is_help=True)

WINDOW_HELP = "rate() window for loss and liveness, e.g. 5m."
TIMEOUT_HELP = "Each query as a whole: connecting, Prometheus's evaluation and the last byte."


# Bounds an operator would not exceed: a rate() window or `for:` over 6 h hides every incident
# it should page on; baselines look back at most 30 days (Prometheus's usual local retention).
MAX_WINDOW_S = 6 * 3600.0
MAX_EVAL_S = 600.0
MAX_BASELINE_S = 30 * 86400.0
_JOB = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,63}")
_RUNBOOK = re.compile(r"(https?://[!-~]{1,200}|[A-Za-z0-9_./#-]{1,200}\.md(#[A-Za-z0-9_-]*)?)")


def _duration(option: str, text: str, *, allow_zero: bool = True,
              maximum_s: float = MAX_WINDOW_S) -> float:
    try:
        return units.parse_duration_s(text, default_unit="s", allow_zero=allow_zero,
                                      maximum_s=maximum_s)
    except UsageError as exc:
        raise UsageError(f"{option}: {exc}") from None


def _ratio(option: str, text: str) -> float:
    try:
        value = units.parse_ratio(text)
    except UsageError as exc:
        raise UsageError(f"{option}: {exc}") from None
    if not 0 < value < 1:
        raise UsageError(f"{option}: must lie strictly between 0 and 100%, not {text!r}")
    return value


def _matching(option: str, pattern: re.Pattern, text: str, what: str) -> str:
    if not pattern.fullmatch(text):
        raise UsageError(f"{option}: {shown(text)} is not {what}")
    return text


TARGET_FORMATS = ("file-sd", "scrape-config")


@app.command("targets")
def targets(
    mesh: Annotated[Path, typer.Option("--mesh", help="The fleet's mesh file (TOML or JSON).")],
    site: Annotated[str | None, typer.Option("--site", help="Only this site's daemons (for a "
                                             "per-site Prometheus).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="file-sd (JSON for file_sd_configs) or "
                                     "scrape-config (the prometheus.yml job, with the TLS and "
                                     "basic auth settings below).")] = "file-sd",
    job: Annotated[str | None, typer.Option("--job", help="scrape-config: the job name (as "
                                            "`fleet rules --job`; default wanprobe).")] = None,
    targets_file: Annotated[str | None, typer.Option(
        "--targets-file", help="scrape-config: read the daemons from this file_sd file (the "
        "file-sd output) instead of listing them inline.")] = None,
    scheme: Annotated[str, typer.Option("--scheme", help="https when the daemons have a "
                                        "web_config_file with tls_server_config.")] = "http",
    ca_file: Annotated[str | None, typer.Option("--ca-file", help="CA of the daemons' "
                                                "certificates (default: the system's).")] = None,
    server_name: Annotated[str | None, typer.Option(
        "--server-name", help="Name the daemons' certificates carry, when it is not their "
        "mesh address.")] = None,
    client_cert: Annotated[str | None, typer.Option(
        "--client-cert", help="Prometheus's client certificate (client_auth_type).")] = None,
    client_key: Annotated[str | None, typer.Option("--client-key", help="Its key.")] = None,
    user: Annotated[str | None, typer.Option("--basic-auth-user", help="A user of the web "
                                             "config's basic_auth_users.")] = None,
    password_file: Annotated[str | None, typer.Option(
        "--password-file", help="File holding that user's password.")] = None,
) -> None:
    """Print Prometheus file_sd JSON (every daemon in the mesh, with site and host labels), or
    with --format scrape-config the whole scrape job, https and basic auth included."""
    from wanprobe.fleet.targets import ScrapeAuth, file_sd, scrape_config
    from wanprobe.fleet.yaml_text import dumps
    from wanprobe.mesh.topology import load_mesh

    if fmt not in TARGET_FORMATS:
        raise UsageError(f"--format: {shown(fmt)} is not one of {', '.join(TARGET_FORMATS)}")
    auth = ScrapeAuth(scheme=scheme, ca_file=ca_file, server_name=server_name,
                      cert_file=client_cert, key_file=client_key, username=user,
                      password_file=password_file)
    if fmt == "file-sd" and (auth.secured or targets_file is not None or job is not None):
        raise UsageError("--job, --scheme, TLS, basic auth and --targets-file are settings of "
                         "the scrape job, which file_sd cannot carry: add --format scrape-config")
    m = load_mesh(mesh)
    if site is not None and site not in m.sites:
        raise UsageError(f"--site: {site!r} is not a site of {mesh} ({', '.join(m.sites)})")
    if fmt == "file-sd":
        typer.echo(json.dumps(file_sd(m, site=site), indent=2))
        return
    job = _matching("--job", _JOB, job or "wanprobe", "a Prometheus job name")
    typer.echo(dumps(scrape_config(m, job=job, auth=auth, site=site,
                                   targets_file=targets_file)), nl=False)


@app.command("rules")
def rules(
    window: Annotated[str, typer.Option("--window", help=WINDOW_HELP)] = "5m",
    for_: Annotated[str, typer.Option("--for", help="How long a condition holds before its "
                                      "alert fires, e.g. 5m (short in tests).")] = "5m",
    eval_interval: Annotated[str | None, typer.Option(
        "--eval-interval", help="Rule group evaluation interval (default: Prometheus's "
        "global one).")] = None,
    loss_slo: Annotated[str, typer.Option("--loss-slo", help="Loss SLO per direction and "
                                          "site pair, e.g. 1% or 0.01.")] = "1%",
    floor_step: Annotated[str, typer.Option("--floor-step", help="RTT floor rise that "
                                            "counts as a step, e.g. 20%.")] = "20%",
    throughput_drop: Annotated[str, typer.Option("--throughput-drop", help="Alert below "
                                                 "(1 - this) x the throughput baseline.")] = "30%",
    floor_baseline: Annotated[str, typer.Option("--floor-baseline", help="The RTT floor is "
                                                "compared with its minimum over this long.")] = "1h",
    throughput_baseline: Annotated[str, typer.Option(
        "--throughput-baseline", help="Throughput baseline: median over this long.")] = "168h",
    job: Annotated[str, typer.Option("--job", help="Scrape job name of the daemons.")] = "wanprobe",
    runbook_url: Annotated[str, typer.Option("--runbook-url", help="Base URL of the runbook "
                                             "(an anchor per alert is appended).")] = "docs/runbook.md",
) -> None:
    """Print Prometheus recording and alerting rules (YAML) for a wanprobe fleet."""
    from wanprobe.fleet.rules import RuleSettings, rule_groups
    from wanprobe.fleet.yaml_text import dumps

    s = RuleSettings(window_s=_duration("--window", window, allow_zero=False),
                     for_s=_duration("--for", for_),
                     eval_interval_s=None if eval_interval is None else
                     _duration("--eval-interval", eval_interval, allow_zero=False,
                               maximum_s=MAX_EVAL_S),
                     loss_slo_ratio=_ratio("--loss-slo", loss_slo),
                     floor_step_ratio=_ratio("--floor-step", floor_step),
                     throughput_drop_ratio=_ratio("--throughput-drop", throughput_drop),
                     floor_baseline_s=_duration("--floor-baseline", floor_baseline,
                                                allow_zero=False, maximum_s=MAX_BASELINE_S),
                     throughput_baseline_s=_duration("--throughput-baseline", throughput_baseline,
                                                     allow_zero=False, maximum_s=MAX_BASELINE_S),
                     job=_matching("--job", _JOB, job, "a Prometheus job name"),
                     runbook_url=_matching("--runbook-url", _RUNBOOK, runbook_url,
                                           "an http(s) URL or a .md path"))
    typer.echo(dumps(rule_groups(s)), nl=False)


def _labels(option: str, items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{option}: {shown(item)} is not KEY=VALUE")
        out[key] = value
    return out


@app.command("kubernetes")
def kubernetes(
    mesh: Annotated[Path, typer.Option("--mesh", help="The fleet's mesh file (TOML or JSON).")],
    namespace: Annotated[str, typer.Option("--namespace", help="The agent's namespace.")] = "wanprobe",
    image: Annotated[str | None, typer.Option("--image", help="Container image (built with the "
                                              "Containerfile; default wanprobe:VERSION).")] = None,
    key_secret: Annotated[str | None, typer.Option(
        "--key-secret", help="An existing Secret holding the reflector's HMAC key as hmac.key "
        "(never written into a ConfigMap).")] = None,
    site_label: Annotated[str, typer.Option("--site-label", help="Node label whose value is the "
                                            "node's site.")] = "topology.kubernetes.io/region",
    site: Annotated[str | None, typer.Option("--site", help="Only this site's agents (one "
                                             "cluster per site).")] = None,
    job: Annotated[str, typer.Option("--job", help="Scrape job name (as `fleet rules --job`).")] = "wanprobe",
    monitor_label: Annotated[list[str] | None, typer.Option(
        "--monitor-label", help="KEY=VALUE on the ServiceMonitor and PrometheusRule (your "
        "Prometheus' selectors, e.g. release=kube-prometheus-stack); repeatable.")] = None,
    scrape_interval: Annotated[str, typer.Option("--scrape-interval")] = "30s",
    rules_file: Annotated[Path | None, typer.Option(
        "--rules", help="A rules file from `wanprobe fleet rules` (default: its defaults).")] = None,
    tuner: Annotated[bool, typer.Option("--tuner", help="Also the tuner (NET_ADMIN, its own "
                                        "privileged namespace); needs --plan.")] = False,
    tuner_namespace: Annotated[str, typer.Option("--tuner-namespace")] = "wanprobe-tuner",
    plan: Annotated[Path | None, typer.Option("--plan", help="The signed-off plan the tuner may "
                                              "apply (from `wanprobe tune plan`).")] = None,
    web_config_secret: Annotated[str | None, typer.Option(
        "--web-config-secret", help="Secure the listener: an existing Secret holding "
        "web-config.yml (exporter-toolkit format); needs --tls-secret.")] = None,
    tls_secret: Annotated[str | None, typer.Option(
        "--tls-secret", help="An existing kubernetes.io/tls Secret: the listener's certificate "
        "(tls.crt, tls.key; ca.crt for Prometheus unless --ca-secret).")] = None,
    ca_secret: Annotated[str | None, typer.Option(
        "--ca-secret", help="A Secret whose ca.crt Prometheus verifies the certificate "
        "with (default: the --tls-secret).")] = None,
    server_name: Annotated[str | None, typer.Option(
        "--server-name", help="The DNS name in the certificate (default: "
        "wanprobe-agent.NAMESPACE.svc).")] = None,
    client_cert_secret: Annotated[str | None, typer.Option(
        "--scrape-client-cert-secret", help="A kubernetes.io/tls Secret: Prometheus's client "
        "certificate (for the web config's client_auth_type).")] = None,
    basic_auth_secret: Annotated[str | None, typer.Option(
        "--basic-auth-secret", help="A Secret with keys username and password Prometheus "
        "scrapes with (a user of basic_auth_users).")] = None,
) -> None:
    """Print Kubernetes manifests (one YAML stream): agent DaemonSets, config, Service,
    ServiceMonitor, PrometheusRule, and the opt-in tuner.

    Long because each of its options is a typer parameter with its --help text."""
    from wanprobe.fleet.kubernetes import KubeSettings, render
    from wanprobe.fleet.rules import prom_duration

    if tuner != (plan is not None):
        raise UsageError("--tuner and --plan go together: the tuner applies only the signed-off plan")
    settings = KubeSettings(namespace=namespace, tuner_namespace=tuner_namespace,
                            key_secret=key_secret, site_label=site_label, site=site,
                            job=_matching("--job", _JOB, job, "a Prometheus job name"),
                            monitor_labels=_labels("--monitor-label", monitor_label or []),
                            scrape_interval=prom_duration(_duration(
                                "--scrape-interval", scrape_interval, allow_zero=False)),
                            web_config_secret=web_config_secret, tls_secret=tls_secret,
                            ca_secret=ca_secret, server_name=server_name,
                            client_cert_secret=client_cert_secret,
                            basic_auth_secret=basic_auth_secret)
    if image is not None:
        settings = replace(settings, image=image)
    typer.echo(render(mesh, settings, rules_file, plan), nl=False)


@app.command("matrix")
def matrix(
    prometheus: Annotated[str, typer.Option("--prometheus", help="Prometheus base URL, e.g. "
                                            "http://prometheus:9090.")],
    window: Annotated[str, typer.Option("--window", help=WINDOW_HELP)] = "5m",
    timeout: Annotated[str, typer.Option("--timeout", help=TIMEOUT_HELP)] = "10s",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Show the site x site matrix (RTT, loss per direction, throughput, firing alerts)."""
    from wanprobe.fleet.matrix import site_matrix
    from wanprobe.fleet.rules import RuleSettings

    http_url("--prometheus", prometheus)
    pairs = site_matrix(prometheus, RuleSettings(window_s=_duration("--window", window,
                                                                    allow_zero=False)),
                        timeout_s=_duration("--timeout", timeout, allow_zero=False))
    if as_json:
        typer.echo(json.dumps({"pairs": [p.to_json() for p in pairs]}, indent=2))
        return
    _print_matrix(pairs)


def _cell(p) -> str:
    """One matrix cell; a figure outside its range (assemble refuses them; this is the last
    guard against "loss inf%" and a 300-digit rate) shows as "?", no data as "-"."""
    from wanprobe.fleet.matrix import RANGES

    def fig(name: str, show) -> str:
        x = getattr(p, name)
        return "-" if x is None else show(x) if 0 <= x <= RANGES[name].high else "?"

    def ms(name: str) -> str:
        return fig(name, lambda x: f"{x * 1e3:.1f}")

    def pct(name: str) -> str:
        return fig(name, lambda x: f"{x * 100:.2f}%")

    lines = [f"{ms('rtt_p50_seconds')} / {ms('rtt_p99_seconds')} ms",
             f"loss {pct('loss_forward_ratio')} → {pct('loss_reverse_ratio')} ←"]
    if p.throughput_bits_per_second is not None:
        lines.append(fig("throughput_bits_per_second", units.format_rate))
    lines += [f"[bold red]{a}[/]" for a in p.alerts]
    return "\n".join(lines)


def _print_matrix(pairs) -> None:
    console = Console()
    if not pairs:
        console.print("no wanprobe site pairs in Prometheus (are the daemons scraped?)")
        return
    srcs = sorted({p.src_site for p in pairs})
    dsts = sorted({p.dst_site for p in pairs})
    by_pair = {(p.src_site, p.dst_site): p for p in pairs}
    table = Table(title="site x site: RTT p50 / p99, loss forward → reverse ←, throughput, "
                        "alerts", show_lines=True)
    table.add_column("from \\ to", style="bold")
    for d in dsts:
        table.add_column(d, justify="right")
    for s in srcs:
        table.add_row(s, *(_cell(by_pair[(s, d)]) if (s, d) in by_pair else "" for d in dsts))
    console.print(table)


@app.command("windows")
def windows(
    prometheus: Annotated[str, typer.Option("--prometheus", help="Prometheus base URL, e.g. "
                                            "http://prometheus:9090.")],
    from_site: Annotated[str, typer.Option("--from-site", help="Site the data leaves.")],
    to_site: Annotated[str, typer.Option("--to-site", help="Site the data goes to.")],
    size: Annotated[str, typer.Option("--bytes", help=views.BYTES_HELP)],
    deadline: views.DeadlineOpt = None,
    lookback: views.LookbackOpt = "14d",
    as_json: Annotated[bool, typer.Option("--json", help="Same as --format json.")] = False,
    fmt: views.FormatOpt = "text",
    tz: views.TzOpt = None,
    top: views.TopOpt = 5,
    throttle: views.ThrottleOpt = "10mbit",
    unit: views.UnitOpt = "wanprobe-sync.service",
    series: Annotated[str, typer.Option("--series", help="auto (recording rules when their "
                                        "history covers the lookback), raw or recorded.")] = "auto",
    timeout: Annotated[str, typer.Option("--timeout", help=TIMEOUT_HELP)] = "30s",
) -> None:
    """When to move SIZE from one site to another: the hour-of-week profile of the pair (goodput
    p10/p50, loss, RTT; hour 0 = Monday 00:00 UTC) and the best start hours, best first."""
    from wanprobe.windows.from_prometheus import check_site, prometheus_profile
    from wanprobe.windows.plan import answer

    http_url("--prometheus", prometheus)
    req = views.parse_request(size=size, deadline=deadline, lookback=lookback, top=top, fmt=fmt,
                              as_json=as_json, tz=tz, throttle=throttle, unit=unit)
    src, dst = check_site("--from-site", from_site), check_site("--to-site", to_site)
    timeout_s = _duration("--timeout", timeout, allow_zero=False, maximum_s=MAX_EVAL_S)
    now = time.time()
    profile = prometheus_profile(prometheus, src, dst, lookback_s=req.lookback_s, now_ts=now,
                                 timeout_s=timeout_s, series=series)
    require_goodput(profile, f"{src} -> {dst}")
    views.emit(answer(profile, req.size_bytes, now, top=req.top, deadline_s=req.deadline_s),
               req, f"{src} -> {dst}")
