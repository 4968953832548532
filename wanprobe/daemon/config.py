"""Daemon configuration: one TOML file, validated whole before it takes effect.

Every problem becomes one line naming the key (``probe.interval: duration 'fast' ...``), all
problems are reported together, and nothing is half-applied: :func:`load_config` either returns a
complete :class:`DaemonConfig` or raises :class:`ConfigInvalid`. Everything but one peer (or a
mesh file) has a default, so the issue's six-line config works as is.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuners.registry import AUTO_APPLY_TUNERS
from wanprobe.daemon.config_fields import (
    FieldReader,
    TimeWindow,
    parse_listen,
    parse_window,
)
from wanprobe.daemon.config_job import JobSettings, job_settings
from wanprobe.daemon.config_reflector import (
    DAEMON_KEYS,
    DAEMON_SERVER,
    SERVER_KEYS,
    reflector_access,
    server_limits,
)
from wanprobe.daemon.config_ring import RingSettings, ring_settings
from wanprobe.errors import ConfigError, ConfigInvalid
from wanprobe.mesh.peer import Peer
from wanprobe.probe.access import DEFAULT_COS_DSCP
from wanprobe.throughput.limits import ServerLimits
from wanprobe.units import format_bytes
from wanprobe.userfiles import key_problem, read_key_file, read_text

__all__ = ["DaemonConfig", "ProbeSettings", "RingSettings", "ThroughputSettings", "TimeWindow",
           "load_config", "parse_config", "parse_listen", "parse_window"]

DEFAULT_CONFIG_PATH = Path("/etc/wanprobe/wanprobe.toml")
MAX_FLOWS = 64


MAX_CONFIG_BYTES = 2**20  # a config is a few kB; a mesh file tens of kB


@dataclass(frozen=True)
class ProbeSettings:
    """A probe session every ``interval_s`` ± ``jitter_s``: ``count`` packets ``packet_interval_s``
    apart, each waited for ``timeout_s``."""

    interval_s: float = 10.0
    jitter_s: float = 1.0
    count: int = 10
    packet_interval_s: float = 0.02
    timeout_s: float = 1.0
    dscp: int = 0
    methods: tuple[str, ...] = ("stamp",)
    port: int = 862
    flows: int = 1


@dataclass(frozen=True)
class ThroughputSettings:
    """Scheduled throughput tests: off by default; when on, each peer at most every
    ``interval_s``, only inside ``windows`` (empty = any time), spread over the hours of the
    week so each gets a test within ``lookback_s`` (daemon/throughput_spread.py), never over
    ``budget_bytes_per_day`` for the host nor ``budget_bytes_per_peer_per_day`` for one peer."""

    enabled: bool = False
    interval_s: float = 2 * 3600.0      # 168 hours x 2 h = 14 days: the profile's look-back
    duration_s: float = 5.0
    streams: int = 4
    budget_bytes_per_day: int = 10 * 2**30
    max_bytes_per_test: int = 2 * 2**30
    windows: tuple[TimeWindow, ...] = ()
    lookback_s: float = 14 * 86400.0
    budget_bytes_per_peer_per_day: int = 10 * 2**30


@dataclass(frozen=True)
class CounterSettings:
    """Counter sampling (collectors/), rates between consecutive samples."""

    enabled: bool = True
    interval_s: float = 15.0
    sys_root: Path = Path("/sys")
    proc_root: Path = Path("/proc")


@dataclass(frozen=True)
class RetentionSettings:
    """Raw rows live ``raw_s``; older ones are folded into ``bucket_s`` buckets kept ``downsampled_s``."""

    raw_s: float = 7 * 86400.0
    downsampled_s: float = 90 * 86400.0
    bucket_s: float = 300.0
    maintenance_interval_s: float = 3600.0


@dataclass(frozen=True)
class BaselineSettings:
    """Regression detection: compare the median of the last ``recent`` sessions with the rolling
    baseline of up to ``window`` earlier ones; enter above a threshold, clear below
    ``clear_fraction`` of it (hysteresis)."""

    window: int = 60
    recent: int = 5
    min_samples: int = 10
    rtt_increase_ratio: float = 0.25
    rtt_increase_min_ms: float = 1.0
    loss_increase: float = 0.01
    throughput_drop_ratio: float = 0.3
    clear_fraction: float = 0.5
    # sessions the loss regression pools (issue 36), against a baseline of up to twice as many
    # older ones: 60 of 10 probes tell a 2 % step from none (daemon/baseline.py)
    loss_window: int = 60
    # the windowed loss the page, the matrix and the metrics show (probe/loss_window.py)
    loss_short_s: float = 300.0
    loss_long_s: float = 3600.0


@dataclass(frozen=True)
class AutoApply:
    """Automatic tuning: off unless enabled, then only whitelisted tuners from a signed-off plan."""

    enabled: bool = False
    tuners: tuple[str, ...] = ()
    plan: Path | None = None
    plan_sha256: str | None = None  # the sign-off: the operator pins the reviewed plan's hash
    min_interval_s: float = 3600.0  # at most one apply request per this long


@dataclass(frozen=True)
class DaemonConfig:
    """The whole, validated configuration."""

    state_dir: Path
    # the tuner's journals, read (never written) for the page's tuning changes (docs/runbook.md)
    tune_state_dir: Path = Path("/var/lib/wanprobe-tune")
    metrics_listen: tuple[str, int] = ("127.0.0.1", 9862)
    # the listener's TLS and basic auth, exporter-toolkit format (httpd/web_config.py)
    web_config_file: Path | None = None
    web_healthz_open: bool = False  # /healthz answers without authentication (kubelet probes)
    reflector_listen: tuple[tuple[str, int], ...] = (("0.0.0.0", 862),)
    reflector_enabled: bool = True
    hmac_key: bytes | None = None
    allow: tuple[str, ...] = ()                      # CIDRs that may use the reflector
    cos_dscp: frozenset[int] = DEFAULT_COS_DSCP      # DSCP a CoS TLV may ask replies to carry
    throughput_server: ServerLimits = DAEMON_SERVER  # what clients of our reflector may run
    hostname: str = ""
    site: str = ""
    mesh_file: Path | None = None
    log_format: str = "journal"
    peers: tuple[Peer, ...] = ()
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    throughput: ThroughputSettings = field(default_factory=ThroughputSettings)
    ring: RingSettings = field(default_factory=RingSettings)   # scheduled ring tests (issue 39)
    job: JobSettings = field(default_factory=JobSettings)      # a job's step stream (issue 41)
    counters: CounterSettings = field(default_factory=CounterSettings)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    baseline: BaselineSettings = field(default_factory=BaselineSettings)
    auto_apply: AutoApply = field(default_factory=AutoApply)
    source: str = "<memory>"

    @property
    def reports_dir(self) -> Path:
        return self.state_dir / "reports"

    @property
    def db_path(self) -> Path:
        return self.state_dir / "history.sqlite3"


def load_config(path: Path | str) -> DaemonConfig:
    """Read and validate ``path``; raise :class:`ConfigInvalid` listing every bad key."""
    path = Path(path)
    text = read_text(path, "config", MAX_CONFIG_BYTES)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigInvalid(str(path), [f"not valid TOML: {exc}"]) from None
    except RecursionError:  # tomllib recurses per nesting level of arrays and inline tables
        raise ConfigInvalid(str(path), ["not valid TOML: nested too deeply"]) from None
    return parse_config(data, source=str(path), base_dir=path.parent)


def parse_config(data: dict[str, Any], *, source: str = "<memory>",
                 base_dir: Path | None = None) -> DaemonConfig:
    """Validate a TOML document (already parsed) into a :class:`DaemonConfig`."""
    v = FieldReader(base_dir or Path.cwd())
    v.known(data, "", {"daemon", "peers", "probe", "throughput", "counters", "retention",
                       "baseline", "auto_apply", "ring", "job"})
    d = v.table(data, "daemon")
    v.known(d, "daemon", {"state_dir", "tune_state_dir", "metrics_listen", "reflector_listen", "reflector",
                          "hmac_key", "hmac_key_file", "hostname", "site", "mesh_file",
                          "log_format", "web_config_file", "web_healthz_open"} | DAEMON_KEYS)
    allow, cos_dscp = reflector_access(v, d)
    throughput_t = v.table(data, "throughput")
    throughput = _throughput(v, throughput_t)
    state_dir = v.path(d, "daemon.state_dir", None)
    if state_dir is None and "state_dir" not in d:
        v.problem("daemon.state_dir", "is required (e.g. \"/var/lib/wanprobe\")")
    probe = _probe(v, v.table(data, "probe"))
    cfg_kwargs: dict[str, Any] = dict(
        tune_state_dir=v.path(d, "daemon.tune_state_dir", Path("/var/lib/wanprobe-tune")),
        metrics_listen=v.listen("daemon.metrics_listen",
                                v.string(d, "daemon.metrics_listen", "127.0.0.1:9862")),
        reflector_listen=tuple(v.listen("daemon.reflector_listen", x) for x in
                               v.str_list(d, "daemon.reflector_listen", ["0.0.0.0:862"])),
        web_config_file=v.path(d, "daemon.web_config_file", None),
        web_healthz_open=v.boolean(d, "daemon.web_healthz_open", False),
        reflector_enabled=v.boolean(d, "daemon.reflector", True),
        hmac_key=_hmac_key(v, d),
        allow=allow,
        cos_dscp=cos_dscp,
        throughput_server=server_limits(v, throughput_t, enabled=throughput.enabled,
                                        max_bytes_per_test=throughput.max_bytes_per_test),
        hostname=v.string(d, "daemon.hostname", ""),
        site=v.string(d, "daemon.site", ""),
        mesh_file=v.path(d, "daemon.mesh_file", None),
        log_format=v.choice(d, "daemon.log_format", "journal", ("journal", "logfmt")),
        peers=_peers(v, data.get("peers", []), probe),
        probe=probe,
        throughput=throughput,
        counters=_counters(v, v.table(data, "counters")),
        retention=_retention(v, v.table(data, "retention")),
        baseline=_baseline(v, v.table(data, "baseline")),
        auto_apply=_auto_apply(v, v.table(data, "auto_apply")),
    )
    _far_end_limits(v, throughput, cfg_kwargs["throughput_server"])
    cfg_kwargs["job"] = job_settings(v, v.table(data, "job"))
    cfg_kwargs["ring"] = ring_settings(v, v.table(data, "ring"), hmac_key=cfg_kwargs["hmac_key"],
                                       server=cfg_kwargs["throughput_server"])
    if not data.get("peers") and cfg_kwargs["mesh_file"] is None and "peers" not in v.bad:
        v.problem("peers", "no [[peers]] and no daemon.mesh_file: nothing to probe")
    if v.problems:
        raise ConfigInvalid(source, v.problems)
    return DaemonConfig(state_dir=state_dir, source=source, **cfg_kwargs)


def _probe(v: FieldReader, t: dict) -> ProbeSettings:
    v.known(t, "probe", {"interval", "jitter", "count", "packet_interval", "timeout", "dscp",
                         "methods", "port", "flows"})
    interval_s = v.duration(t, "probe.interval", 10.0, positive=True)
    jitter_s = v.duration(t, "probe.jitter", min(1.0, interval_s / 10))
    if jitter_s >= interval_s and "jitter" in t:
        v.problem("probe.jitter", f"must be smaller than probe.interval ({interval_s:g} s)")
    return ProbeSettings(
        interval_s=interval_s, jitter_s=jitter_s,
        count=v.integer(t, "probe.count", 10, lo=1, hi=10000),
        packet_interval_s=v.duration(t, "probe.packet_interval", 0.02, positive=True),
        timeout_s=v.duration(t, "probe.timeout", 1.0, positive=True),
        dscp=v.dscp(t, "probe.dscp", 0),
        methods=v.methods(t, "probe.methods", ("stamp",)),
        port=v.port(t, "probe.port", 862),
        flows=v.integer(t, "probe.flows", 1, lo=1, hi=MAX_FLOWS),
    )


def _peers(v: FieldReader, raw: Any, probe: ProbeSettings) -> tuple[Peer, ...]:
    if not isinstance(raw, list) or not all(isinstance(p, dict) for p in raw):
        v.problem("peers", "must be an array of tables ([[peers]])")
        return ()
    peers, names = [], set()
    for i, p in enumerate(raw):
        key = f"peers[{i}]"
        v.known(p, key, {"name", "address", "site", "methods", "port", "flows"})
        name = v.string(p, f"{key}.name", None)
        address = v.address(p, f"{key}.address")
        site = v.string(p, f"{key}.site", "")
        methods = v.methods(p, f"{key}.methods", probe.methods)
        port = v.port(p, f"{key}.port", probe.port)
        flows = v.integer(p, f"{key}.flows", probe.flows, lo=1, hi=MAX_FLOWS)
        if name is None:
            if "name" not in p:
                v.problem(f"{key}.name", "is required")
        elif not name.strip():
            v.problem(f"{key}.name", "must not be empty")
        elif name in names:
            v.problem(f"{key}.name", f"duplicate peer name {name!r}")
        if name and address:
            names.add(name)
            peers.append(Peer(name=name, address=address, site=site, methods=methods, port=port,
                              flows=flows))
    return tuple(peers)


def _throughput(v: FieldReader, t: dict) -> ThroughputSettings:
    v.known(t, "throughput", {"enabled", "interval", "duration", "streams", "budget_per_day",
                              "max_bytes_per_test", "windows", "lookback",
                              "budget_per_peer_per_day"} | SERVER_KEYS)
    windows = tuple(w for w in (v.window(f"throughput.windows[{i}]", s) for i, s in
                                enumerate(v.str_list(t, "throughput.windows", []))) if w)
    d = ThroughputSettings()
    return ThroughputSettings(
        enabled=v.boolean(t, "throughput.enabled", False),
        interval_s=v.duration(t, "throughput.interval", d.interval_s, positive=True),
        duration_s=v.duration(t, "throughput.duration", d.duration_s, positive=True),
        streams=v.integer(t, "throughput.streams", d.streams, lo=1, hi=64),
        budget_bytes_per_day=v.size(t, "throughput.budget_per_day", d.budget_bytes_per_day),
        max_bytes_per_test=v.size(t, "throughput.max_bytes_per_test", d.max_bytes_per_test),
        windows=windows,
        lookback_s=v.duration(t, "throughput.lookback", d.lookback_s, positive=True),
        budget_bytes_per_peer_per_day=v.size(t, "throughput.budget_per_peer_per_day",
                                             d.budget_bytes_per_peer_per_day),
    )


def _far_end_limits(v: FieldReader, tput: ThroughputSettings, server: ServerLimits) -> None:
    """A fleet shares one config, so the limits this host's server puts on one client are what
    the far end puts on this host: its own scheduled tests must stay inside them."""
    if not tput.enabled:
        return
    for key, ours, theirs, what in (
            ("throughput.duration", tput.duration_s, server.max_duration_s, "max_duration"),
            ("throughput.streams", tput.streams, server.max_streams, "max_streams"),
            ("throughput.budget_per_peer_per_day", tput.budget_bytes_per_peer_per_day,
             server.bytes_per_day_per_client, "bytes_per_day_per_client"),
            ("throughput.interval", 3600.0 / tput.interval_s, server.tests_per_hour_per_client,
             "tests_per_hour_per_client")):
        if ours > theirs:
            shown_limit = (format_bytes(theirs) if what.startswith("bytes") else f"{theirs:g}")
            v.problem(key, f"exceeds what a far end with this config accepts from one client "
                           f"(throughput.{what} = {shown_limit})")


def _counters(v: FieldReader, t: dict) -> CounterSettings:
    v.known(t, "counters", {"enabled", "interval", "sys_root", "proc_root"})
    return CounterSettings(
        enabled=v.boolean(t, "counters.enabled", True),
        interval_s=v.duration(t, "counters.interval", 15.0, positive=True),
        sys_root=v.path(t, "counters.sys_root", Path("/sys")),
        proc_root=v.path(t, "counters.proc_root", Path("/proc")),
    )


def _retention(v: FieldReader, t: dict) -> RetentionSettings:
    v.known(t, "retention", {"raw", "downsampled", "bucket", "maintenance_interval"})
    raw_s = v.duration(t, "retention.raw", 7 * 86400.0, positive=True)
    down_s = v.duration(t, "retention.downsampled", 90 * 86400.0, positive=True)
    if down_s < raw_s:
        v.problem("retention.downsampled", "must be at least retention.raw")
    return RetentionSettings(raw_s=raw_s, downsampled_s=down_s,
                             bucket_s=v.duration(t, "retention.bucket", 300.0, positive=True),
                             maintenance_interval_s=v.duration(
                                 t, "retention.maintenance_interval", 3600.0, positive=True))


def _baseline(v: FieldReader, t: dict) -> BaselineSettings:
    v.known(t, "baseline", {"window", "recent", "min_samples", "rtt_increase",
                            "rtt_increase_min", "loss_increase", "throughput_drop",
                            "clear_fraction", "loss_window", "loss_short", "loss_long"})
    return BaselineSettings(
        window=v.integer(t, "baseline.window", 60, lo=2, hi=100000),
        recent=v.integer(t, "baseline.recent", 5, lo=1, hi=1000),
        min_samples=v.integer(t, "baseline.min_samples", 10, lo=1, hi=100000),
        rtt_increase_ratio=v.ratio(t, "baseline.rtt_increase", 0.25),
        rtt_increase_min_ms=v.duration(t, "baseline.rtt_increase_min", 0.001) * 1e3,
        loss_increase=v.ratio(t, "baseline.loss_increase", 0.01),
        throughput_drop_ratio=v.ratio(t, "baseline.throughput_drop", 0.3),
        clear_fraction=v.ratio(t, "baseline.clear_fraction", 0.5),
        loss_window=v.integer(t, "baseline.loss_window", 60, lo=1, hi=100000),
        loss_short_s=v.duration(t, "baseline.loss_short", 300.0, positive=True),
        loss_long_s=v.duration(t, "baseline.loss_long", 3600.0, positive=True),
    )


def _auto_apply(v: FieldReader, t: dict) -> AutoApply:
    v.known(t, "auto_apply", {"enabled", "tuners", "plan", "plan_sha256", "min_interval"})
    tuners = tuple(v.str_list(t, "auto_apply.tuners", []))
    for name in tuners:
        if name not in AUTO_APPLY_TUNERS:
            v.problem("auto_apply.tuners", f"unknown tuner {name!r} (use {', '.join(AUTO_APPLY_TUNERS)})")
    enabled = v.boolean(t, "auto_apply.enabled", False)
    plan = v.path(t, "auto_apply.plan", None)
    if enabled and plan is None:
        v.problem("auto_apply.plan", "is required when auto_apply.enabled = true (a signed-off plan)")
    if enabled and not tuners:
        v.problem("auto_apply.tuners", "must list the whitelisted tuners when auto_apply.enabled = true")
    digest = v.string(t, "auto_apply.plan_sha256", None)
    if digest is not None and not re.fullmatch(r"[0-9a-f]{64}", digest):
        v.problem("auto_apply.plan_sha256", "must be 64 lowercase hex digits (sha256sum of the plan)")
        digest = None
    if enabled and digest is None and "auto_apply.plan_sha256" not in v.bad:
        v.problem("auto_apply.plan_sha256", "is required when auto_apply.enabled = true: it is the "
                  "sign-off of the reviewed plan (sha256sum plan.json)")
    min_interval_s = v.duration(t, "auto_apply.min_interval", 3600.0, positive=True)
    return AutoApply(enabled=enabled, tuners=tuners, plan=plan, plan_sha256=digest,
                     min_interval_s=min_interval_s)


def _hmac_key(v: FieldReader, d: dict) -> bytes | None:
    key = v.string(d, "daemon.hmac_key", None)
    key_file = v.path(d, "daemon.hmac_key_file", None)
    if key is not None and key_file is not None:
        v.problem("daemon.hmac_key", "set hmac_key or hmac_key_file, not both")
        return None
    if key_file is not None:
        try:  # the CLI's reader (userfiles.read_key_file): one set of rules for the key file
            return read_key_file(key_file, "file")
        except ConfigError as exc:
            v.problem("daemon.hmac_key_file", str(exc))
            return None
    if key is None:
        return None
    problem = key_problem(key)
    if problem is not None:
        v.problem("daemon.hmac_key", problem)
        return None
    return key.encode()


