"""Typed readers for TOML config values: each bad value becomes one problem line naming its key.

Used by :mod:`wanprobe.daemon.config`; units go through :mod:`wanprobe.units`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wanprobe import units
from wanprobe.errors import ConfigError, WanprobeError
from wanprobe.mesh.peer import METHODS
from wanprobe.probe.access import check_sent_dscp


@dataclass(frozen=True)
class TimeWindow:
    """A daily window in local minutes since midnight; ``end < start`` wraps past midnight."""

    start_min: int
    end_min: int

    def contains(self, minute_of_day: int) -> bool:
        if self.start_min <= self.end_min:
            return self.start_min <= minute_of_day < self.end_min
        return minute_of_day >= self.start_min or minute_of_day < self.end_min


class FieldReader:
    """Reads typed values out of TOML tables, recording one problem line per bad key."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.problems: list[str] = []
        self.bad: set[str] = set()

    def problem(self, key: str, message: str) -> None:
        self.bad.add(key)
        self.problems.append(f"{key}: {' '.join(message.split())}")

    def known(self, table: dict, prefix: str, allowed: set[str]) -> None:
        for key in table:
            if key not in allowed:
                full = f"{prefix}.{key}" if prefix else key
                self.problem(full, f"unknown key (known: {', '.join(sorted(allowed))})")

    def table(self, data: dict, key: str) -> dict:
        value = data.get(key, {})
        if not isinstance(value, dict):
            self.problem(key, f"must be a table ([{key}])")
            return {}
        return value

    def _get(self, t: dict, key: str) -> Any:
        return t.get(key.rsplit(".", 1)[-1])

    def _has(self, t: dict, key: str) -> bool:
        return key.rsplit(".", 1)[-1] in t

    def _convert(self, t: dict, key: str, default: Any, fn) -> Any:
        if not self._has(t, key):
            return default
        try:
            return fn(self._get(t, key))
        except WanprobeError as exc:
            self.problem(key, str(exc))
        except (TypeError, ValueError) as exc:
            self.problem(key, str(exc) or "bad value")
        return default

    def string(self, t: dict, key: str, default: str | None) -> str | None:
        def conv(x: Any) -> str:
            if not isinstance(x, str):
                raise TypeError(f"must be a string, not {_toml_type(x)}")
            return x
        return self._convert(t, key, default, conv)

    def boolean(self, t: dict, key: str, default: bool) -> bool:
        def conv(x: Any) -> bool:
            if not isinstance(x, bool):
                raise TypeError(f"must be true or false, not {x!r}")
            return x
        return self._convert(t, key, default, conv)

    def integer(self, t: dict, key: str, default: int, *, lo: int, hi: int) -> int:
        def in_range(x: int) -> int:
            if not lo <= x <= hi:
                raise ValueError(f"{x} out of range {lo}-{hi}")
            return x
        return self._convert(t, key, default, _scalar((int,), "an integer", in_range))

    def duration(self, t: dict, key: str, default: float, *, positive: bool = False) -> float:
        return self._convert(t, key, default, _scalar(
            (int, float, str), 'a duration such as "10s" or "500ms"',
            lambda x: units.parse_duration_s(str(x), default_unit="s", allow_zero=not positive)))

    def ratio(self, t: dict, key: str, default: float) -> float:
        return self._convert(t, key, default, _RATIO)

    def size(self, t: dict, key: str, default: int) -> int:
        return self._convert(t, key, default, _SIZE)

    def dscp(self, t: dict, key: str, default: int) -> int:
        return self._convert(t, key, default, _DSCP)

    def port(self, t: dict, key: str, default: int) -> int:
        return self._convert(t, key, default, _PORT)

    def path(self, t: dict, key: str, default: Path | None) -> Path | None:
        def conv(x: Any) -> Path:
            if not isinstance(x, str) or not x.strip():
                raise TypeError(f"must be a non-empty path string, not {x!r}")
            p = Path(x)
            return p if p.is_absolute() else self.base_dir / p
        return self._convert(t, key, default, conv)

    def choice(self, t: dict, key: str, default: str, choices: tuple[str, ...]) -> str:
        def conv(x: Any) -> str:
            if x not in choices:
                raise ValueError(f"{x!r} is not one of {', '.join(choices)}")
            return x
        return self._convert(t, key, default, conv)

    def str_list(self, t: dict, key: str, default: list[str]) -> list[str]:
        def conv(x: Any) -> list[str]:
            if isinstance(x, str):
                return [x]
            if not isinstance(x, list) or not all(isinstance(i, str) for i in x):
                raise TypeError(f"must be a list of strings, not {x!r}")
            return list(x)
        return self._convert(t, key, default, conv)

    def methods(self, t: dict, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        out = tuple(self.str_list(t, key, list(default)))
        bad = [m for m in out if m not in METHODS]
        if bad:
            self.problem(key, f"unknown method {bad[0]!r} (use {', '.join(METHODS)})")
            return default
        if not out:
            self.problem(key, "must name at least one method")
            return default
        return out

    def address(self, t: dict, key: str) -> str | None:
        if not self._has(t, key):
            self.problem(key, "is required (an IPv4 or IPv6 address)")
            return None

        def conv(x: Any) -> str:
            try:
                return str(ipaddress.ip_address(x))
            except ValueError:
                raise ValueError(f"{x!r} is not an IPv4 or IPv6 address") from None
        return self._convert(t, key, None, conv)

    def listen(self, key: str, text: str | None) -> tuple[str, int]:
        """Parse ``"host:port"`` / ``"[v6]:port"`` (see :func:`parse_listen`)."""
        if text is None:
            return ("127.0.0.1", 9862)
        try:
            return parse_listen(text)
        except WanprobeError as exc:
            self.problem(key, str(exc))
            return ("127.0.0.1", 9862)

    def window(self, key: str, text: str) -> TimeWindow | None:
        try:
            return parse_window(text)
        except WanprobeError as exc:
            self.problem(key, str(exc))
            return None


def parse_listen(text: str) -> tuple[str, int]:
    """``"127.0.0.1:9862"`` → ("127.0.0.1", 9862); ``"[::1]:9862"``; ``":9862"`` → all IPv4."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ConfigError(f"listen address {text!r} must be \"host:port\"")
    host = host.strip("[]") or "0.0.0.0"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"listen address {text!r}: {host!r} is not an IP address") from None
    if port.strip() == "0":  # an ephemeral port: only useful in tests, logged at start
        return host, 0
    return host, units.parse_port(port)


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def scrape_problem(listen: tuple[str, int], address: str, port: int) -> str | None:
    """Why Prometheus, scraping this host at ``address:port`` (its mesh entry: the target
    ``wanprobe fleet targets`` writes), would reach no /metrics listening on ``listen``, as one
    line; None when it would. ``daemon --check`` prints it as a warning: the daemon itself runs
    fine, but every scrape of it fails (WanprobeDaemonDown). ``::`` counts as dual-stack (Linux's
    default, net.ipv6.bindv6only=0); port 0 (an ephemeral port, tests) is not judged."""
    host, lport = listen
    ip, target = ipaddress.ip_address(host), ipaddress.ip_address(address)
    why = []
    if ip.is_loopback and not target.is_loopback:
        why.append("answers on loopback only")
    elif ip.is_unspecified and ip.version == 4 and target.version == 6:
        why.append("takes IPv4 only")
    elif not ip.is_unspecified and ip != target and not ip.is_loopback:
        why.append("is bound to another address")
    if lport and lport != port:
        why.append(f"listens on port {lport}")
    if not why:
        return None
    wildcard = "[::]" if target.version == 6 else "0.0.0.0"
    return (f"daemon.metrics_listen {_host_port(host, lport)} {' and '.join(why)}, but "
            f"Prometheus scrapes this host at {_host_port(address, port)} (its mesh entry, as "
            "`wanprobe fleet targets` writes it): every scrape would fail; listen on "
            f"{_host_port(address, port)} or {wildcard}:{port}")


def exposure_problem(listen: tuple[str, int], web_config_file: Path | None) -> str | None:
    """Why a listener other processes' hosts can reach is open to them, as one line; None on
    loopback or with a web config. ``daemon --check`` prints it as a warning: /metrics, the
    fleet page and /peer/NAME name every peer, site, address, path event and tuning change."""
    host, port = listen
    if web_config_file is not None or ipaddress.ip_address(host).is_loopback:
        return None
    return (f"daemon.metrics_listen {_host_port(host, port)} is not loopback and no "
            "daemon.web_config_file secures it: the fleet's topology and tuning history are "
            "open to anyone who can reach it; set web_config_file (TLS and basic auth, "
            "exporter-toolkit format) and scrape with `wanprobe fleet targets --format "
            "scrape-config --scheme https ...`")


def parse_window(text: str) -> TimeWindow:
    """``"01:00-05:30"`` (local time) → minutes 60..330; ``"22:00-04:00"`` wraps midnight."""
    try:
        start, end = (s.strip() for s in text.split("-"))
        start_min, end_min = (_hhmm(start), _hhmm(end))
    except ValueError:
        raise ConfigError(f"time window {text!r} must look like \"01:00-05:00\"") from None
    if start_min == end_min:
        raise ConfigError(f"time window {text!r} is empty")
    return TimeWindow(start_min, end_min)


def _hhmm(s: str) -> int:
    hh, mm = s.split(":")
    h, m = int(hh), int(mm)
    if not (0 <= h <= 24 and 0 <= m < 60) or (h == 24 and m):
        raise ValueError(s)
    return h * 60 + m


def _scalar(types: tuple[type, ...], what: str,
            parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A converter for ``FieldReader._convert``: a value not of ``types`` is a TypeError "must be
    <what>" (so is a boolean, although Python's bool is an int); the rest is ``parse``d."""
    def conv(x: Any) -> Any:
        if isinstance(x, bool) or not isinstance(x, types):
            raise TypeError(f"must be {what}, not {x!r}")
        return parse(x)
    return conv


# values with units: units.py is their one parser (a TOML number goes in as its text)
_RATIO = _scalar((int, float, str), 'a ratio such as "1%" or 0.01',
                 lambda x: units.parse_ratio(str(x)))
_SIZE = _scalar((int, str), 'a size such as "10GiB"', lambda x: units.parse_bytes(str(x)))
_DSCP = _scalar((int, str), "a DSCP number or name",  # what probes send: never 48-63 (access.py)
                lambda x: check_sent_dscp(units.parse_dscp(x), "DSCP"))
_PORT = _scalar((int,), "an integer port", units.parse_port)


def _toml_type(x: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a float", list: "an array",
            dict: "a table"}.get(type(x), type(x).__name__)
