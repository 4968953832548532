"""Random but valid measurement sets for the rule engine's golden (tests/test_rules_golden.py).

Each set is what ``run_rules`` takes once the report codec has typed it: a report's
``measurements`` and ``host`` dicts and a ``DiagnoseConfig``, in the shapes the producers write (the builders of test_diagnose_rules.py for
probe, throughput, host and peer facts; ``probe.path_groups.summarize`` for the ECMP summary).
Each set draws from its own ``random.Random(SEED + i)``, so one set does not depend on another,
and nothing reads the clock or the host.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from test_diagnose_rules import host, peer_facts, probe, throughput
from test_paths_unit import _flow

from wanprobe.diagnose.inputs import OPERATOR_SOURCE, DiagnoseConfig
from wanprobe.probe.path_groups import summarize

SEED = 21_000
SETS = 600

RTTS_MS = (0.4, 5.0, 20.0, 35.0, 60.0, 130.0, 250.0)
LOSSES = (0.0, 0.0, 0.0, 1e-4, 1e-3, 0.005, 0.02, 0.3)
BUFFERS = ("4096 131072 6291456", "4096 65536 262144", "4096 131072 33554432",
           "4096 131072 1073741824", "4096 16384 4194304")
CCS = ("bbr", "cubic", "reno")
VERDICTS = ("network", "receive_window", "send_buffer", "congestion", "pacing", "host_cpu",
            "cpu", "unknown")
FABRIC_IDS = (("roce.lossless_drops", "critical"), ("roce.drops", "warning"),
              ("pfc.pause_storm", "warning"), ("roce.ecn_disabled", "warning"),
              ("nic.rx_out_of_buffer", "warning"), ("tcp.retransmissions", "info"))


def _maybe(rng: random.Random, p: float) -> bool:
    return rng.random() < p


def _host(rng: random.Random) -> dict | None:
    if _maybe(rng, 0.05):
        return None
    h = host(net__ipv4__tcp_rmem=rng.choice(BUFFERS), net__ipv4__tcp_wmem=rng.choice(BUFFERS),
             net__ipv4__tcp_congestion_control=rng.choice(CCS),
             net__core__default_qdisc=rng.choice(("fq", "pfifo_fast", "fq_codel")),
             net__ipv4__tcp_mtu_probing=rng.choice(("0", "1", "2")),
             net__ipv4__tcp_slow_start_after_idle=rng.choice(("0", "1")),
             net__ipv4__tcp_notsent_lowat=rng.choice(("131072", "4294967295")),
             net__ipv4__tcp_no_metrics_save=rng.choice(("0", "1")))
    h["fq_available"] = rng.choice((True, False, None))
    h["available_cc"] = rng.choice((["reno", "bbr", "cubic"], ["reno", "cubic"]))
    wan = h["ifaces"]["wan0"]
    wan.update(mtu=rng.choice((1500, 9000, 1380)), qdisc=rng.choice(("fq", "pfifo_fast", None)),
               speed_mbps=rng.choice((None, 100, 1000, 10000, 25000)))
    if _maybe(rng, 0.3):
        wan.update(rx_ring=rng.choice((256, 1024)), rx_ring_max=4096,
                   tx_ring=rng.choice((256, 4096)), tx_ring_max=4096)
    if _maybe(rng, 0.4):
        h["facts"] = peer_facts(h["sysctls"]["net.ipv4.tcp_congestion_control"])
    return h


def _path(rng: random.Random, rtt: float) -> dict | None:
    if _maybe(rng, 0.1):
        return None
    dscp = rng.choice(((26, 26, 26), (26, 0, 0), (26, 26, 0), (26, 26, 26), (0, 0, 0)))
    p = probe(rtt, loss=rng.choice(LOSSES), sent=rng.choice((10, 200, 1000)), dscp=dscp)
    cap = rng.choice(("udp_burst", "udp_burst_lower_bound", "operator", "missing", "none"))
    if cap == "operator":
        p.update(capacity_bits_per_second=rng.choice((1e8, 1e9, 1e10)),
                 capacity_source=OPERATOR_SOURCE)
    elif cap == "missing":
        p.update(capacity_bits_per_second=None, capacity_source="not measured: skipped")
    elif cap != "none":
        p.update(capacity_bits_per_second=rng.choice((9.5e7, 4.8e8, 9.4e8, 9.6e9)),
                 capacity_source=cap)
    return p


def _mtu(rng: random.Random) -> dict | None:
    if _maybe(rng, 0.3):
        return None
    iface_mtu = rng.choice((1500, 9000))
    return {"path_mtu": rng.choice((1500, 1380, 1280, iface_mtu)), "iface": "wan0",
            "iface_mtu": iface_mtu, "search_max_bytes": min(iface_mtu, 9244),
            "icmp_seen": rng.choice((True, False, None)), "method": "stamp"}


def _throughput(rng: random.Random, rtt: float) -> dict | None:
    if _maybe(rng, 0.25):
        return None
    bps = rng.choice((5e6, 3e7, 1.9e8, 9e8, 4e9, 9.4e9)) * rng.uniform(0.8, 1.2)
    ev: dict[str, Any] = {}
    for key, choices in (("rwnd_limited_share", (0.0, 0.3, 0.95)),
                         ("sndbuf_limited_share", (0.0, 0.2, 0.9)),
                         ("retransmit_rate", (0.0, 1e-4, 0.02)),
                         ("peer_window_max_bytes", (65536, 262144, 6291456)),
                         ("side", ("sender", "receiver"))):
        if _maybe(rng, 0.4):
            ev[key] = rng.choice(choices)
    busy = rng.choice((1_000_000, 2_000_000))
    return throughput(bps, rng.choice(VERDICTS), cc=rng.choice(CCS), rtt_ms=rtt,
                      rwnd_us=int(busy * rng.choice((0.0, 0.1, 0.5, 0.95))), busy_us=busy,
                      retrans=rng.choice((0, 10**5, 10**7)), sent=rng.choice((10**8, 10**9)),
                      **ev)


def _peer(rng: random.Random, m: dict) -> None:
    kind = rng.choice(("legacy", "error", "facts", "facts", "facts"))
    if kind == "legacy":
        return
    if kind == "error":
        m["peer_facts"] = None
        m["errors"]["peer_facts"] = "the peer sent no host facts (an older wanprobe)"
        return
    facts = peer_facts(rng.choice(CCS), available=rng.choice((("reno", "cubic", "bbr"),
                                                              ("reno", "cubic"))),
                       qdisc=rng.choice(("fq", "pfifo_fast")))
    facts["tcp_rmem_bytes"] = [int(x) for x in rng.choice(BUFFERS).split()]
    facts["tcp_wmem_bytes"] = [int(x) for x in rng.choice(BUFFERS).split()]
    if _maybe(rng, 0.5):
        facts["tcp_mem_pages"] = [rng.choice((92_000, 1_500_000)), 2_000_000, 3_000_000]
    m["peer_facts"] = facts


def _counters(rng: random.Random) -> dict | None:
    """The counters document as diagnose writes it, with the fabric findings it recorded."""
    if not _maybe(rng, 0.15):
        return None
    findings = []
    for fid, sev in rng.sample(FABRIC_IDS, rng.randint(1, 3)):
        knobs = [{"tuner": "roce", "key": "eth0/pfc", "value": "3", "reason": "lossless",
                  "side": "local", "iface": "eth0"}] if fid.startswith("roce") else []
        findings.append({"id": fid, "severity": sev, "title": f"{fid} on eth0",
                         "evidence": {"subject": "eth0", "delta": rng.randint(1, 10**6),
                                      "window_s": 10.0},
                         "recommendation": "check the fabric", "expected_effect": "",
                         "knobs": knobs, "impact": None})
    return {"taken_at_s": 1.0, "rates": {"interval_s": 10.0, "resets": []},
            "findings": findings}


def _paths(rng: random.Random) -> dict | None:
    if not _maybe(rng, 0.1):
        return None
    good, bad = ("r1", "p0", "dst"), ("r1", "p1", "dst")
    lost = rng.choice((0, 2, 9, 20))
    flows = [_flow(1, good, 0), _flow(2, bad, lost), _flow(3, good, 0), _flow(4, good, 0)]
    return {"summary": summarize(flows)[1]}


def measurement_set(i: int) -> tuple[dict, dict | None, DiagnoseConfig]:
    """Set ``i``: (measurements, host, config)."""
    rng = random.Random(SEED + i)
    rtt = rng.choice(RTTS_MS)
    m: dict[str, Any] = {"path": _path(rng, rtt), "mtu": _mtu(rng),
                         "throughput": _throughput(rng, rtt), "counters": _counters(rng),
                         "errors": {}}
    if _maybe(rng, 0.5):
        m["throughput_reverse"] = _throughput(rng, rtt)
    _peer(rng, m)
    if (paths := _paths(rng)) is not None:
        m["paths"] = paths
    cfg = DiagnoseConfig(link_rate_bps=rng.choice((None, None, 1e8, 1e9, 1e10)),
                         dscp=rng.choice((None, 26)), concurrent_flows=rng.choice((16, 1, 64)),
                         flows=rng.choice((1, 1, 4)))
    return m, _host(rng), cfg


def digest(obj: Any) -> str:
    """A short digest of a JSON-able value (the inputs of a set; its findings)."""
    text = json.dumps(obj, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_json(cfg: DiagnoseConfig) -> dict:
    return {"link_rate_bps": cfg.link_rate_bps, "dscp": cfg.dscp,
            "concurrent_flows": cfg.concurrent_flows, "flows": cfg.flows}
