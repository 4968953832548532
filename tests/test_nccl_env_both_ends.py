"""nccl-env from measurement (issue 13): the peer's buffers and the measured per-stream ceiling
set the socket count; NCCL_BUFFSIZE is raised on a long path with its reason."""

from __future__ import annotations

from tuners.nccl_env import PathFacts, buffsize_var, compute, facts_from_report, sockets_needed


def report(peer_rmem_max: int | None, scan=None) -> dict:
    return {"schema_version": "1.1", "id": "n13", "peer": {"address": "198.18.0.2"},
            "host": {"sysctls": {"net.ipv4.tcp_rmem": "4096 131072 67108864",
                                 "net.ipv4.tcp_wmem": "4096 131072 67108864"},
                     "ifaces": {"wan0": {"mtu": 1500}}},
            "measurements": {
                "path": {"rtt_ms": {"p99": 100.0}, "loss": {"ratio": 0.0},
                         "capacity_bits_per_second": 1e9, "capacity_source": "udp_burst"},
                "mtu": {"iface": "wan0"}, "streams_scan": scan,
                "peer_facts": None if peer_rmem_max is None else {
                    "version": 1, "tcp_rmem_bytes": [4096, 131072, peer_rmem_max],
                    "tcp_wmem_bytes": [4096, 16384, 67108864]}},
            "findings": []}


def test_peer_buffers_bound_the_socket_ceiling():
    alone = facts_from_report(report(None))
    both = facts_from_report(report(2 * 2**20))  # the peer receives into 2 MiB
    assert alone.link_bps == 1e9 and both.peer_tcp_rmem_max == 2 * 2**20
    n_alone, _ = sockets_needed(alone)
    n_both, ceiling = sockets_needed(both)
    # 2 MiB × 1/2 over 100 ms ≈ 84 Mbit/s per socket → 12 sockets for 1 Gbit/s
    assert n_alone == 1 and n_both == 12 and round(ceiling / 1e6) == 84


def test_measured_per_stream_ceiling_wins_over_the_model():
    scan = [{"streams": n, "per_stream_bits_per_second": r}
            for n, r in ((1, 200e6), (2, 190e6), (4, 180e6), (8, 120e6))]
    f = facts_from_report(report(None, scan))
    n, ceiling = sockets_needed(f)
    assert (n, ceiling) == (5, 200e6)
    names = {v.name: v.value for v in compute(f, sys_root=__import__("pathlib").Path("/nonexistent"))}
    assert int(names["NCCL_SOCKET_NTHREADS"]) * int(names["NCCL_NSOCKS_PERTHREAD"]) >= 5


def test_buffsize_only_on_long_paths():
    long = buffsize_var(PathFacts(rtt_ms=100.0, link_bps=1e9))
    # 4 MiB / 100 ms ≈ 336 Mbit/s < 1 Gbit/s; BDP 12.5 MB → 16 MiB
    assert long.value == str(16 * 2**20) and "336 Mbit/s" in long.reason
    assert buffsize_var(PathFacts(rtt_ms=1.0, link_bps=1e9)) is None
