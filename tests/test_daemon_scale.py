"""Issue 19, breaks 4 and 5 at scale: the daemon at the largest mesh it accepts stays under its
unit's MemoryMax with five /metrics clients that never read, /metrics answers within the
Prometheus scrape timeout, and a mesh over the series budget is sampled with one line.

On the unbounded daemon a 10,000-peer mesh was taken whole (294 MiB against MemoryMax=256M,
26.6 MB and 5 s per scrape) and five clients that never read grew it by 228 MiB and were held
forever. Runs bench/daemon_scale.py (one namespace, a real reflector answering every peer)."""

from __future__ import annotations

import pytest
from conftest import load_bench, netns_unavailable_reason, require

from wanprobe.daemon import budget
from wanprobe.mesh.peer import Peer


@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_largest_accepted_mesh_holds_memory_max_with_five_scrapers_not_reading():
    require(netns_unavailable_reason())
    largest = (budget.MAX_SERIES - budget.SERIES_PER_HOST) // budget.peer_series(Peer("p", "::1"))
    bench = load_bench("daemon_scale")
    r = bench.run(largest + 129, scrapers=5, seconds=10.0)  # a mesh over the budget: sampled
    print(f"\n{r}")
    assert r["peers"] == largest, r["peers"]
    assert len(r["budget_lines"]) == 1 and f"probing {largest} of them" in r["budget_lines"][0]
    assert r["hwm_mib"] < r["memory_max_mib"], (r["hwm_mib"], r["memory_max_mib"])
    assert not r["scrape_errors"] and max(r["scrape_s"]) < bench.SCRAPE_TIMEOUT_S, r["scrape_s"]
    assert r["series"] <= budget.MAX_SERIES
    assert not r["held_connections"], r["held_connections"]
    assert r["tracebacks"] == 0
