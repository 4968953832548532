"""The daemon's reflector is bound by its config (issue 14): ``daemon.hmac_key`` for STAMP and
throughput, ``daemon.allow``, ``daemon.cos_dscp`` and the ``[throughput]`` limits, and its
refusals are exported as ``wanprobe_reflector_refusals_total{reason}``."""

from __future__ import annotations

import pytest
from reflector_helpers import KEY, LoopThread

from wanprobe.daemon.config import ThroughputSettings, parse_config
from wanprobe.daemon.metrics import DaemonMetrics
from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.errors import ConfigInvalid, ProbeError
from wanprobe.mesh.peer import Peer
from wanprobe.services import measure
from wanprobe.services.reflect import ReflectService
from wanprobe.throughput.client import run_throughput


def config(tmp_path, daemon=None, throughput=None):
    return parse_config({"daemon": {"state_dir": str(tmp_path), **(daemon or {})},
                         "throughput": throughput or {},
                         "peers": [{"name": "b", "address": "127.0.0.1"}]})


class DaemonReflector:
    """``ReflectService.from_config(cfg)`` on 127.0.0.1 (ephemeral port), in a loop thread."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg

    def __enter__(self):
        self.lt = LoopThread()
        self.reflector = ReflectService.from_config(self.cfg)

        async def start() -> None:
            await self.reflector.start((("127.0.0.1", 0),))

        self.lt.run(start())
        self.port = self.reflector.throughput_ports[0]
        return self

    def __exit__(self, *exc) -> None:
        self.lt.run(self.reflector.close())
        self.lt.stop()


def test_throughput_section_binds_the_server(tmp_path):
    off = config(tmp_path, throughput={"enabled": False})
    with DaemonReflector(off) as d:
        with pytest.raises(ProbeError, match="disabled"):
            run_throughput("127.0.0.1", port=d.port, duration_s=0.5, max_bytes=10**6, judge=JUDGE)
    # its own scheduled tests inside the limits it serves (a far end with this config): 1 s, 2 streams
    on = config(tmp_path, throughput={"enabled": True, "max_bytes_per_test": "1MB",
                                      "max_duration": "2s", "max_streams": 2, "duration": "1s",
                                      "streams": 2})
    with DaemonReflector(on) as d:
        for kw, named in (({"max_bytes": 10**7}, "max_bytes_per_test"),
                          ({"duration_s": 5.0}, "max_duration"), ({"streams": 3}, "max_streams")):
            args = {"duration_s": 0.5, "max_bytes": 10**6, **kw}
            with pytest.raises(ProbeError, match=named):
                run_throughput("127.0.0.1", port=d.port, max_duration_s=10, **args, judge=JUDGE)
        r = run_throughput("127.0.0.1", port=d.port, duration_s=0.5, max_bytes=10**6, judge=JUDGE)
        assert r.bytes_received == 10**6
        assert {k: n for k, n in d.reflector.refusals().items() if n} == {"over_limit": 3}


def test_one_key_for_both_services_and_refusals_exported(tmp_path):
    cfg = config(tmp_path, daemon={"hmac_key": KEY.decode()}, throughput={"enabled": True})
    metrics = DaemonMetrics()
    with DaemonReflector(cfg) as d:
        metrics.watch_refusals(d.reflector.refusals)
        with pytest.raises(ProbeError, match="requires authentication"):
            run_throughput("127.0.0.1", port=d.port, duration_s=0.5, max_bytes=10**6, judge=JUDGE)
        keyed = measure.with_key(measure.throughput, cfg.hmac_key)
        doc = keyed(Peer("b", "127.0.0.1", port=d.port),
                    ThroughputSettings(duration_s=0.5, streams=1, max_bytes_per_test=10**6))
        assert doc["bytes_received"] == 10**6
        text = metrics.exposition().decode()
    assert 'wanprobe_reflector_refusals_total{reason="unauthenticated"} 1.0' in text


def test_allow_and_cos_dscp_are_validated_config_keys(tmp_path):
    cfg = config(tmp_path, daemon={"allow": ["10.0.0.0/8", "2001:db8::/32"],
                                   "cos_dscp": ["AF31", 46, "CS6"]})
    assert cfg.allow == ("10.0.0.0/8", "2001:db8::/32")
    assert cfg.cos_dscp == frozenset({26, 46, 48})
    assert 48 not in config(tmp_path).cos_dscp
    with pytest.raises(ConfigInvalid) as exc:
        config(tmp_path, daemon={"allow": ["not-a-net"], "cos_dscp": ["XX"]},
               throughput={"tests_per_hour": 0})
    problems = " | ".join(exc.value.problems)
    for key in ("daemon.allow", "daemon.cos_dscp", "throughput.tests_per_hour"):
        assert key in problems, problems


def test_daemon_allow_drops_other_sources(tmp_path):
    cfg = config(tmp_path, daemon={"allow": ["10.0.0.0/8"]}, throughput={"enabled": True})
    with DaemonReflector(cfg) as d:
        with pytest.raises(ProbeError):
            run_throughput("127.0.0.1", port=d.port, duration_s=0.5, max_bytes=10**6, judge=JUDGE)
        assert d.reflector.refusals()["not_allowed"] == 1
