"""Acceptance: the collective model against real gloo all_reduce over the emulated WAN lab
(2 sites × 2 ranks, 2 lab profiles, 3 tensor sizes), and the effect of tuning the lab hosts.
Needs root, namespaces and torch (CPU wheel: pip install torch==2.13.0)."""

import contextlib

import pytest
from conftest import load_bench, require

pytestmark = [pytest.mark.alone, pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(420)]




def test_model_matches_gloo_and_predicts_tuning(lab_factory):
    try:
        import torch  # noqa: F401
    except ImportError:
        require("needs torch (pip install torch==2.13.0)")
    bench = load_bench("validate_impact")

    def make_lab(**kwargs):
        return contextlib.nullcontext(lab_factory(**kwargs))

    # Medians of 5 repetitions: with 3, one CI run had a 64 KiB row at 1.26× (0.159 s against
    # 0.125 s; the same row reads 1.00 in other runs), i.e. two slow repetitions out of three.
    result = bench.run_validation(make_lab, reps=5, warmup=2, tuning_sizes=(8388608,),
                                  log=lambda *_: None)
    bench.print_tables(result)
    rows = result["rows"]
    assert len(rows) == len(bench.PROFILES) * len(bench.SIZES)
    for r in rows:
        assert abs(r.ratio - 1) <= bench.TOLERANCE, (
            f"{r.profile} {r.size_bytes} B: model {r.model_s:.3f} s, measured {r.measured_s:.3f} s")
    # Tuning (tcp_rmem max 384 KiB → BDP-sized, inside the lab namespaces only): the model
    # predicts a large speed-up for the window-limited 8 MiB all_reduce; the measured one must
    # go the same way and be of roughly the same size.
    (before,), after = result["before"], {r.size_bytes: r for r in result["after"]}
    predicted = before.model_s / after[before.size_bytes].model_s
    measured = before.measured_s / after[before.size_bytes].measured_s
    assert predicted > 2.0
    assert measured > 1.5
    assert 0.6 <= measured / predicted <= 1.5, f"predicted {predicted:.2f}×, measured {measured:.2f}×"
