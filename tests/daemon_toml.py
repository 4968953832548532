"""The one writer of ``wanprobe daemon`` TOML for the tests that start a daemon (process, lab,
path events, fleet): tables as dicts, so each test states only what its daemon differs in."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

# Probing in the netns labs: 20 probes every 0.5 s, enough sessions for a baseline in seconds.
LAB_PROBE = {"interval": "500ms", "jitter": "50ms", "count": 20, "packet_interval": "10ms",
             "timeout": "400ms"}


def scrape_command(port: int = 9862) -> str:
    """``python -c`` text that prints the daemon's /metrics (run inside a lab namespace)."""
    return ("import sys, urllib.request; "
            f"sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:{port}/metrics', "
            "timeout=5).read().decode())")


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return str(v)
    if isinstance(v, Sequence) and not isinstance(v, str):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a JSON string is a TOML basic string


def _table(header: str, values: Mapping[str, Any]) -> str:
    return "".join([f"[{header}]\n"] + [f"{k} = {_value(v)}\n" for k, v in values.items()])


def daemon_toml(daemon: Mapping[str, Any], *, probe: Mapping[str, Any],
                counters: Mapping[str, Any], peers: Sequence[Mapping[str, Any]] = (),
                **tables: Mapping[str, Any]) -> str:
    """The config text: ``[daemon]``, ``[probe]``, ``[counters]``, any other ``tables``
    (``throughput=``, ``baseline=``...) and one ``[[peers]]`` table per peer."""
    return "".join([_table("daemon", daemon), _table("probe", probe),
                    _table("counters", counters)]
                   + [_table(name, values) for name, values in tables.items()]
                   + [_table("[peers]", peer) for peer in peers])
