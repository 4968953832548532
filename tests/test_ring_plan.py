"""The pure part of ``wanprobe ring`` (wanprobe/ring): ring edges, sites by RTT, crossings, the
best order, shared bottlenecks, the assembled result, the NCCL settings and the JSON codec, on
constructed inputs. ``ring_docs`` is the ``measurements.ring`` writer that
tests/test_report_schema_types.py holds to the report schema."""

from __future__ import annotations

import itertools
import json
import math
from types import SimpleNamespace
from typing import Any

import pytest

from wanprobe.errors import ConfigError, UsageError
from wanprobe.ring import nccl, plan
from wanprobe.ring import sites as ring_sites
from wanprobe.ring.model import Edge, EdgeRun, RingResult

G = 1e9
NAIVE = ["a1", "b1", "a2", "b2"]  # two sites' hosts alternating: every edge crosses the WAN


def site(host: str) -> str:
    return host[0]


def rtt_matrix(hosts: list[str], between: dict[frozenset[str], float],
               inside_ms: float = 0.1) -> dict[tuple[str, str], float]:
    """Both directions of every pair: ``inside_ms`` within a site, ``between`` across."""
    return {(a, b): inside_ms if site(a) == site(b) else between[frozenset((site(a), site(b)))]
            for a, b in itertools.permutations(hosts, 2)}


RTT = rtt_matrix(NAIVE, {frozenset("ab"): 35.0})
SITES = [["a1", "a2"], ["b1", "b2"]]


def run(a: str, b: str, bps: float, streams: int = 4, error: str | None = None) -> EdgeRun:
    return EdgeRun(a, b, bps, (bps / streams,) * streams, error)


def together_runs(order: list[str], wan_bps: float, lan_bps: float = 9 * G) -> list[EdgeRun]:
    return [run(a, b, wan_bps if site(a) != site(b) else lan_bps)
            for a, b in ring_sites.ring_edges(order)]


def alone_runs(order: list[str], bps: float = 1 * G) -> dict[tuple[str, str], EdgeRun]:
    return {(a, b): run(a, b, bps) for a, b in ring_sites.ring_edges(order) if site(a) != site(b)}


def naive_result(best: bool = True, fail: bool = False) -> RingResult:
    """The naive 2 × 2 ring: the WAN edges at half their rate alone (two per direction share
    a link), then the best order measured (each crossing alone on its link) or not."""
    together = together_runs(NAIVE, 0.5 * G)
    if fail:
        together[1] = run("b1", "a2", 0.0, error="connection reset by peer")
    order = plan.best_order(NAIVE, SITES)
    measured = (order, together_runs(order, 1 * G)) if best else None
    return plan.assemble(NAIVE, together, alone_runs(NAIVE), SITES, RTT, measured)


def ring_docs() -> list[dict[str, Any]]:
    """``RingResult.to_json`` from ``plan.assemble`` over made-up runs of the naive 2 × 2 ring:
    with the best order measured, without it, and with an edge failed."""
    return [naive_result().to_json(), naive_result(best=False).to_json(),
            naive_result(fail=True).to_json()]


# -- the ring and its sites ---------------------------------------------------------------------
def test_ring_edges_close_the_ring_and_two_hosts_give_both_directions():
    assert ring_sites.ring_edges(["x", "y", "z"]) == [("x", "y"), ("y", "z"), ("z", "x")]
    assert ring_sites.ring_edges(["a", "b"]) == [("a", "b"), ("b", "a")]
    for bad in (["a"], [], ["a", "b", "a"]):
        with pytest.raises(UsageError):
            ring_sites.ring_edges(bad)


def test_sites_by_rtt_clusters_35_and_130_ms_matrices_with_intra_site_0_1_ms():
    hosts = ["b1", "a1", "c1", "b2", "a2"]
    rtt = rtt_matrix(hosts, {frozenset("ab"): 35.0, frozenset("ac"): 130.0,
                             frozenset("bc"): 130.0})
    assert ring_sites.sites_by_rtt(hosts, rtt) == [["b1", "b2"], ["a1", "a2"], ["c1"]]
    # one direction known is enough; both known: the smaller; unknown pairs never join
    one_way = {("a1", "a2"): 0.1, ("a2", "a1"): 40.0, ("b2", "b1"): 0.2, ("a1", "b1"): 35.0}
    assert ring_sites.sites_by_rtt(["a1", "b1", "a2", "b2"], one_way) == [["a1", "a2"], ["b1", "b2"]]
    # single linkage: x–y and y–z close make one site though x–z is far or unknown
    chain = {("x", "y"): 1.0, ("y", "z"): 1.0, ("x", "z"): 8.0}
    assert ring_sites.sites_by_rtt(["x", "y", "z"], chain) == [["x", "y", "z"]]
    assert ring_sites.sites_by_rtt(["x", "y"], {("x", "y"): 6.0}) == [["x"], ["y"]]
    assert ring_sites.sites_by_rtt(["x", "y"], {("x", "y"): 6.0}, site_rtt_ms=10.0) == [["x", "y"]]


def test_the_naive_ring_crosses_four_times_and_the_best_order_twice_sites_adjacent():
    assert ring_sites.crossings(NAIVE, SITES) == 4
    best = plan.best_order(NAIVE, SITES)
    assert best[0] == "a1" and sorted(best) == sorted(NAIVE)
    assert ring_sites.crossings(best, SITES) == 2
    for hosts in SITES:  # each site's hosts one block of the ring
        at = sorted(best.index(h) for h in hosts)
        assert at == list(range(at[0], at[0] + len(hosts)))
    assert ring_sites.crossings(["a1", "b1"], SITES) == 2  # both directions of a two-host ring


def three_sites(rates: dict[str, float]) -> list[str]:
    """Best order over sites a (2 hosts), b, c; ``rates`` like {"ab": …}: a → b at that rate."""
    hosts = ["a1", "b1", "c1", "a2"]
    rate = {(x, y): rates[site(x) + site(y)] for x, y in itertools.permutations(hosts, 2)
            if site(x) != site(y)}
    rate[("a1", "c1")] = 0.01 * G  # a poor host pair: the site pair keeps its best figure
    sites = ring_sites.sites_by_rtt(hosts, rtt_matrix(hosts, {frozenset(p): 30.0 for p in
                                                        ("ab", "ac", "bc")}))
    return plan.best_order(hosts, sites, rate_bps=rate)


def test_three_sites_pick_the_cycle_whose_slowest_edge_is_fastest_in_its_direction():
    # a→b→c→a is slowed by c→a (1G); the other direction a→c→b→a runs at 5G
    assert three_sites({"ab": 10 * G, "bc": 10 * G, "ca": 1 * G,
                        "ac": 5 * G, "cb": 5 * G, "ba": 5 * G}) == ["a1", "a2", "c1", "b1"]
    assert three_sites({"ab": 10 * G, "bc": 10 * G, "ca": 6 * G,
                        "ac": 5 * G, "cb": 5 * G, "ba": 5 * G}) == ["a1", "a2", "b1", "c1"]


def test_equal_rates_break_ties_by_the_smaller_sum_of_inter_site_rtt_then_given_order():
    # four sites on a line at 0, 30, 10, 20 ms: a→b→c→d→a sums 80 ms, a→b→d→c→a 60 (the
    # least, and the first of the 60 ms cycles in the given order)
    where = {"a": 0, "b": 30, "c": 10, "d": 20}
    hosts = ["a1", "b1", "c1", "d1"]
    rtt = {(x, y): float(abs(where[site(x)] - where[site(y)])) for x, y in
           itertools.permutations(hosts, 2)}
    sites = [[h] for h in hosts]
    assert plan.best_order(hosts, sites, rtt_ms=rtt) == ["a1", "b1", "d1", "c1"]
    assert plan.best_order(hosts, sites) == hosts
    with pytest.raises(UsageError):
        plan.best_order([f"h{i}" for i in range(9)], [[f"h{i}"] for i in range(9)])


# -- shared bottlenecks -----------------------------------------------------------------------
def test_wan_edges_at_half_their_rate_alone_name_both_directions_shared_groups():
    groups = plan.shared_bottlenecks(together_runs(NAIVE, 0.5 * G),
                                     {k: 1 * G for k in alone_runs(NAIVE)}, SITES)
    assert groups == [[("a1", "b1"), ("a2", "b2")], [("b1", "a2"), ("b2", "a1")]]
    # at 0.8 of alone nothing is degraded; not measured alone, nothing is judged
    assert plan.shared_bottlenecks(together_runs(NAIVE, 0.8 * G),
                                   {k: 1 * G for k in alone_runs(NAIVE)}, SITES) == []
    assert plan.shared_bottlenecks(together_runs(NAIVE, 0.5 * G), {}, SITES) == []


def test_a_single_degraded_edge_is_no_group_but_a_note_on_its_ends():
    together = together_runs(NAIVE, 0.9 * G)
    together[0] = run("a1", "b1", 0.3 * G)
    alone = {k: 1 * G for k in alone_runs(NAIVE)}
    assert plan.shared_bottlenecks(together, alone, SITES) == []
    res = plan.assemble(NAIVE, together, alone_runs(NAIVE), SITES, RTT, None)
    assert res.shared_bottlenecks == ()
    lone = [n for n in res.notes if n.startswith("a1 → b1 ran at")]
    assert len(lone) == 1 and "not a shared link" in lone[0] and "busy both ways" in lone[0]


# -- the result -------------------------------------------------------------------------------
def test_assemble_the_naive_ring_runs_at_its_slowest_edge_and_names_the_shared_groups():
    res = naive_result()
    assert res.order == tuple(NAIVE) and res.crossings == 4
    assert [(e.src, e.dst) for e in res.edges] == ring_sites.ring_edges(NAIVE)
    assert all(e.wan for e in res.edges)
    assert res.ring_bits_per_second == 0.5 * G
    assert res.ring_algbw_bits_per_second == pytest.approx(0.5 * G * 4 / 6)
    assert res.shared_bottlenecks == ((("a1", "b1"), ("a2", "b2")), (("b1", "a2"), ("b2", "a1")))
    assert res.best_order == ("a1", "a2", "b1", "b2") and res.best_crossings == 2
    assert res.best_ring_bits_per_second == 1 * G
    assert res.sites == (("a1", "a2"), ("b1", "b2"))
    assert res.rtt("a1", "b1") == 35.0 and res.rtt("a1", "a2") == 0.1 and res.rtt("a1", "a1") is None
    assert res.edges[0].alone_bits_per_second == 1 * G


def test_edges_sharing_a_link_unevenly_pace_the_ring_at_the_link_over_their_number():
    """TCP split one direction's link 0.22/0.73 in the lab; a ring moves the same bytes on
    every edge, so the ring gets the link's total over the two edges, not the slower one's."""
    together = together_runs(NAIVE, 0.5 * G)
    rates = {("a1", "b1"): 0.46, ("b1", "a2"): 0.22, ("a2", "b2"): 0.50, ("b2", "a1"): 0.73}
    together = [run(r.src, r.dst, rates[r.key] * G) for r in together]
    res = plan.assemble(NAIVE, together, alone_runs(NAIVE), SITES, RTT)
    assert len(res.shared_bottlenecks) == 2
    assert res.ring_bits_per_second == pytest.approx(0.475 * G)  # (0.22 + 0.73) / 2
    assert res.ring_nccl_bits_per_second == pytest.approx(0.475 * G)
    assert [e.bits_per_second for e in res.edges] == [rates[k] * G for k in ring_sites.ring_edges(NAIVE)]
    # an edge slowed alone (no partner on its link) still paces the ring at its own rate
    together[1] = run("b1", "a2", 0.22 * G)
    together[3] = run("b2", "a1", 0.98 * G)
    res = plan.assemble(NAIVE, together, alone_runs(NAIVE), SITES, RTT)
    assert res.ring_bits_per_second == pytest.approx(0.22 * G)


def test_a_failed_edge_leaves_the_ring_rate_unknown_with_the_error_in_notes():
    res = naive_result(fail=True)
    assert res.edges[1].bits_per_second is None and res.edges[1].nccl_bits_per_second is None
    assert res.ring_bits_per_second is None and res.ring_nccl_bits_per_second is None
    assert any("b1 → a2" in n and "connection reset by peer" in n for n in res.notes)


def test_without_a_run_of_the_best_order_it_is_planned_and_unmeasured():
    res = naive_result(best=False)
    assert res.best_order == ("a1", "a2", "b1", "b2") and res.best_edges == ()
    assert res.best_ring_bits_per_second is None
    assert any("not measured" in n for n in res.notes)
    ordered = plan.assemble(["a1", "a2", "b1", "b2"], together_runs(["a1", "a2", "b1", "b2"], G),
                            {}, SITES, RTT, None)  # already the best: it is its own best
    assert ordered.best_order == ordered.order and ordered.best_ring_bits_per_second == G


def test_an_edge_run_s_nccl_figure_is_its_slowest_stream_times_the_streams():
    r = EdgeRun("a", "b", 1.0 * G, (0.4 * G, 0.1 * G, 0.3 * G, 0.2 * G))
    assert (r.streams, r.min_stream_bits_per_second, r.max_stream_bits_per_second) == (4, 0.1 * G, 0.4 * G)
    assert r.nccl_bits_per_second == pytest.approx(0.4 * G)
    assert r.spread == pytest.approx(3.0)
    empty = EdgeRun("a", "b", None, ())
    assert empty.nccl_bits_per_second is None and empty.spread is None
    assert EdgeRun("a", "b", 1.0, (0.0, 1.0)).spread is None
    streams = [SimpleNamespace(bits_per_second=b, error=None) for b in (3e8, 1e8)]
    interval = SimpleNamespace(start_s=0.0, end_s=1.0, partial=False, streams=(
        {"id": 0, "bytes_received": 3e8 / 8}, {"id": 1, "bytes_received": 1e8 / 8}))
    got = EdgeRun.from_throughput("a", "b", SimpleNamespace(  # type: ignore[arg-type]
        streams=streams, bits_per_second=4e8, partial_reason=None, intervals=[interval],
        omit_s=0.0))
    assert got == EdgeRun("a", "b", 4e8, (3e8, 1e8))


# -- NCCL -------------------------------------------------------------------------------------
def wan_edge(stream_bps: float, alone_bps: float | None, bps: float = 1.0) -> Edge:
    return Edge("a1", "b1", bps, alone_bps, stream_bps, 4, stream_bps * 4, True, 0.0)


def test_nccl_socket_counts_reach_the_target_and_never_exceed_64():
    for per, target in itertools.product((1e6, 3e7, 1e8, 7.7e8), (2e8, 1e9, 9.9e9, 1e11)):
        env = nccl.nccl_settings(SITES, ["a1", "a2", "b1", "b2"], [wan_edge(per, target)])["env"]
        need = math.ceil(target / per * (1 - 1e-9))
        if need <= 1:
            assert "NCCL_SOCKET_NTHREADS" not in env
            continue
        threads, each = int(env["NCCL_SOCKET_NTHREADS"]), int(env["NCCL_NSOCKS_PERTHREAD"])
        assert threads <= 16 and each <= 8 and threads * each <= 64, (per, target)
        if need <= 64:
            assert threads * each * per >= target * (1 - 1e-9), (per, target)
        else:
            assert threads * each == 64
    # a given target wins over the edges' rate; without an alone rate, the rate together
    out = nccl.nccl_settings(SITES, ["a1", "a2", "b1", "b2"], [wan_edge(1e8, 4e8)], target_bps=1e9)
    assert int(out["env"]["NCCL_SOCKET_NTHREADS"]) * int(out["env"]["NCCL_NSOCKS_PERTHREAD"]) >= 10
    out = nccl.nccl_settings(SITES, ["a1", "a2", "b1", "b2"], [wan_edge(1e8, None, bps=8e8)])
    assert int(out["env"]["NCCL_SOCKET_NTHREADS"]) * int(out["env"]["NCCL_NSOCKS_PERTHREAD"]) >= 8


def test_nccl_cross_site_settings_fabric_ids_and_node_ranks_follow_the_best_order():
    out = nccl.nccl_settings(SITES, ["a1", "a2", "b1", "b2"], [wan_edge(1e8, 4e8)])
    env = out["env"]
    assert env["NCCL_ALLNET_ENABLE"] == "1" and env["NCCL_SCATTER_XDC"] == "1"
    assert env["NCCL_CROSS_NIC"] == "2"
    assert out["fabric_ids"] == {"a1": 0, "a2": 0, "b1": 1, "b2": 1}
    assert out["node_ranks"] == {"a1": 0, "a2": 1, "b1": 2, "b2": 3}
    assert set(env) | {"fabric_ids", "node_ranks"} == set(out["why"])
    assert all("\n" not in why for why in out["why"].values())
    one_each = nccl.nccl_settings([["a1"], ["b1"]], ["a1", "b1"], [wan_edge(1e8, 4e8)])["env"]
    assert "NCCL_SCATTER_XDC" not in one_each and one_each["NCCL_ALLNET_ENABLE"] == "1"
    one_site = nccl.nccl_settings([["a1", "a2"]], ["a1", "a2"], [wan_edge(1e8, 4e8)])
    assert "NCCL_ALLNET_ENABLE" not in one_site["env"] and one_site["fabric_ids"] == {}


# -- JSON -------------------------------------------------------------------------------------
def test_to_json_and_from_json_round_trip_exactly():
    for doc in ring_docs():
        text = json.dumps(doc, allow_nan=False)
        res = RingResult.from_json(json.loads(text))
        assert res.to_json() == doc
        assert RingResult.from_json(res.to_json()) == res
    r = run("a1", "b1", 1 * G, error="timeout")
    assert EdgeRun.from_json(r.to_json()) == r and EdgeRun.from_json(r.to_json()).to_json() == r.to_json()
    assert {"order", "edges", "ring_bits_per_second", "shared_bottlenecks", "best_order",
            "best_ring_bits_per_second"} <= set(ring_docs()[0])
    assert {"from", "to", "bits_per_second", "alone_bits_per_second",
            "min_stream_bits_per_second", "streams"} <= set(ring_docs()[0]["edges"][0])


BAD = [
    (("order",), "a1", "ring.order"),
    (("edges", 0, "bits_per_second"), "fast", "ring.edges[0].bits_per_second"),
    (("edges", 0, "streams"), 1.5, "ring.edges[0].streams"),
    (("edges", 0, "wan"), "yes", "ring.edges[0].wan"),
    (("edges", 0, "from"), 7, "ring.edges[0].from"),
    (("ring_bits_per_second",), -1.0, "ring.ring_bits_per_second"),
    (("shared_bottlenecks", 0, 0), {"from": "a1"}, "ring.shared_bottlenecks[0][0]"),
    (("rtt_ms", 0, 1), "35 ms", "ring.rtt_ms[0][1]"),
    (("nccl", "NCCL_ALLNET_ENABLE"), 1, "ring.nccl.NCCL_ALLNET_ENABLE"),
    (("node_ranks", "a1"), True, "ring.node_ranks.a1"),
    (("best_edges",), {}, "ring.best_edges"),
]


@pytest.mark.parametrize("where,value,named", BAD, ids=[b[2] for b in BAD])
def test_from_json_refuses_a_wrong_type_in_one_line_naming_the_key(where, value, named):
    doc = naive_result().to_json()
    node = doc
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    with pytest.raises(ConfigError) as err:
        RingResult.from_json(doc)
    assert "\n" not in str(err.value) and str(err.value).startswith(named), str(err.value)


def test_from_json_refuses_missing_keys_and_null_stream_rates_in_one_line():
    doc = naive_result().to_json()
    del doc["best_order"]
    with pytest.raises(ConfigError, match=r"^ring: missing key 'best_order'$"):
        RingResult.from_json(doc)
    with pytest.raises(ConfigError, match=r"^ring edge run: missing key 'to'$"):
        EdgeRun.from_json({"from": "a"})
    bad = {**run("a", "b", G).to_json(), "stream_bits_per_second": [1.0, None]}
    with pytest.raises(ConfigError, match=r"stream_bits_per_second\[1\]"):
        EdgeRun.from_json(bad)
    with pytest.raises(ConfigError, match="expected a JSON object"):
        RingResult.from_json([])


def test_a_best_order_given_without_its_run_is_proposed_unmeasured_and_rtts_may_be_none():
    rtt: dict[tuple[str, str], float | None] = {**RTT, ("a1", "b1"): None}
    res = plan.assemble(NAIVE, together_runs(NAIVE, 0.5 * G), alone_runs(NAIVE), SITES, rtt,
                        (["a1", "a2", "b2", "b1"], None))
    assert res.best_order == ("a1", "a2", "b2", "b1") and res.best_edges == ()
    assert res.best_ring_bits_per_second is None and res.rtt("a1", "b1") is None
    assert ring_sites.sites_by_rtt(NAIVE, rtt) == SITES
