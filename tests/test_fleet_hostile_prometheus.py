"""Issue 37: `fleet matrix` and `fleet windows` do not trust Prometheus too far. Against a
hostile fake Prometheus on loopback (tests/hostile_prometheus.py): a figure no measurement
makes (+Inf, 1e308, a negative rate, a loss ratio of 3) is one line naming the series, exit 5;
a server dripping a byte at a time is cut at --timeout for the whole query; a Content-Length or
a body over the byte cap, 150,000 series and one series over 1 MiB are refused in one line,
and reading those 150,000 series costs no more than their bytes again, not 342 or 529 MB."""

from __future__ import annotations

import math

import pytest
from clirun import run_forked
from hostile_prometheus import (
    claims,
    drip,
    endless,
    figures,
    filling,
    many_series,
    run_measured,
    series,
    serving,
)

from wanprobe.fleet.prom_http import MAX_REPLY_BYTES, MAX_SERIES, PrometheusError, parse_matrix
from wanprobe.fleet.prom_reply import MAX_SERIES_BYTES

WINDOWS = ["fleet", "windows", "--from-site", "tpe", "--to-site", "usw", "--bytes", "1GB",
           "--series", "raw"]
MATRIX = ["fleet", "matrix", "--json"]
COMMANDS = {"windows": WINDOWS, "matrix": MATRIX}


def _argv(cmd: str, url: str, *extra: str) -> list[str]:
    return [*COMMANDS[cmd], "--prometheus", url, *extra]


def _one_line(doc: dict) -> str:
    """The single stderr line of a run that exited 5 (asserting that, and no traceback)."""
    assert "timeout" not in doc, f"did not finish within {doc['timeout']} s"
    lines = [ln for ln in doc["stderr"].splitlines() if ln.strip()]
    assert doc["code"] == 5 and len(lines) == 1, doc
    assert doc["exception"] is None and "Traceback" not in doc["stderr"] + doc["stdout"], doc
    return lines[0]


@pytest.mark.parametrize("cmd", ["windows", "matrix"])
@pytest.mark.parametrize("value", ["+Inf", "-Inf", "1e308", "-1"])
def test_a_figure_no_measurement_makes_is_refused_naming_the_series(cmd, value, tmp_path):
    """+Inf and 1e308 made `fleet windows` exit 70 (OverflowError) and `fleet matrix` print
    "inf"; now every such sample refuses the answer in one line that names the series."""
    with serving(figures(value)) as url:
        line = _one_line(run_forked(_argv(cmd, url), tmp_path))
    assert "src_site='tpe'" in line and "dst_site='usw'" in line and "refused" in line, line
    assert "internal error" not in line


def test_matrix_refuses_a_loss_ratio_above_one_and_reads_nan_as_no_data(tmp_path):
    with serving(figures("3")) as url:
        line = _one_line(run_forked(_argv("matrix", url), tmp_path))
    assert "site_pair:wanprobe_loss_forward:ratio" in line and "not a loss ratio" in line, line
    with serving(figures("NaN")) as url:  # PromQL's 0/0: a window without probes
        doc = run_forked(_argv("matrix", url), tmp_path)
    assert doc["code"] == 0, doc
    assert '"loss_forward_ratio": null' in doc["stdout"], doc["stdout"]


def test_a_matrix_cell_never_prints_inf_or_a_300_digit_rate():
    from wanprobe.commands.fleet import _cell
    from wanprobe.fleet.matrix import SitePair

    cell = _cell(SitePair("tpe", "usw", rtt_p50_seconds=math.inf, rtt_p99_seconds=-1.0,
                          loss_forward_ratio=math.inf, loss_reverse_ratio=3.0,
                          throughput_bits_per_second=1e308))
    assert "inf" not in cell and max(len(ln) for ln in cell.splitlines()) < 40, cell
    ok = _cell(SitePair("tpe", "usw", rtt_p50_seconds=0.0201, loss_forward_ratio=0.5,
                        throughput_bits_per_second=1e9))
    assert "20.1 / - ms" in ok and "50.00%" in ok and "1.0 Gbit/s" in ok, ok


def test_a_profile_loss_ratio_stays_within_one():
    """Hourly increase() sums are extrapolated per series: lost can come out above sent. The
    profile's ratio of sums is clamped to [0, 1] as it was already clamped at 0."""
    from wanprobe.windows.profile import PathObservation, build_profile, hour_of_week

    ts = 1_700_000_000.0
    obs = PathObservation(ts, sessions=2, sent=100.0, lost_forward=150.0, lost_reverse=0.0)
    bucket = build_profile([], [obs], start_ts=ts - 3600, end_ts=ts + 3600).hours[hour_of_week(ts)]
    assert bucket.loss_forward_ratio == 1.0 and bucket.probe_sessions == 2


def test_a_point_at_an_infinite_time_is_not_a_result():
    body = b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},' \
           b'"values":[[1e400,"1"]]}]}}'
    with pytest.raises(PrometheusError, match="not a Prometheus query result"):
        parse_matrix(body, "http://p:9090")


@pytest.mark.parametrize("cmd", ["windows", "matrix"])
@pytest.mark.parametrize("in_headers", [True, False], ids=["headers", "body"])
def test_a_dripping_server_is_cut_at_the_timeout_of_the_whole_query(cmd, in_headers, tmp_path):
    """A byte every 0.3 s never trips a per-read timeout of 1 s; the query's own deadline
    does. (run_forked's 30 s is the generous bound: without the deadline it never ends.)"""
    with serving(drip(0.3, in_headers=in_headers)) as url:
        line = _one_line(run_forked(_argv(cmd, url, "--timeout", "1s"), tmp_path, timeout_s=30))
    assert "no complete answer within 1 s" in line, line


def test_a_content_length_over_the_cap_is_refused_before_the_body(tmp_path):
    """The server announces one byte over the cap and sends nothing: refused at once, not
    after waiting for a body (which would end as a timeout)."""
    with serving(claims(MAX_REPLY_BYTES + 1)) as url:
        line = _one_line(run_forked(_argv("matrix", url, "--timeout", "20s"), tmp_path,
                                    timeout_s=30))
    assert f"an answer of {MAX_REPLY_BYTES + 1} bytes" in line, line
    assert f"{MAX_REPLY_BYTES // 2**20} MiB limit" in line, line


def test_an_endless_body_is_cut_at_the_cap(tmp_path):
    with serving(endless()) as url:
        line = _one_line(run_forked(_argv("windows", url, "--timeout", "20s"), tmp_path,
                                    timeout_s=30))
    assert f"{MAX_REPLY_BYTES // 2**20} MiB limit" in line, line


def test_one_series_over_its_cap_is_refused_before_it_is_decoded():
    """One series of 32 MiB of points built 365 MB of lists at once; any stretch of the answer
    over MAX_SERIES_BYTES without a series start is refused before decoding."""
    with pytest.raises(PrometheusError, match=f"over {MAX_SERIES_BYTES // 2**10} KiB"):
        parse_matrix(filling(1, MAX_SERIES_BYTES + 4096), "http://p:9090")
    series, _ = parse_matrix(filling(4, 2 * MAX_SERIES_BYTES), "http://p:9090")
    assert len(series) == 4 and len(series[0][1]) > 1000


@pytest.mark.parametrize("cmd", ["windows", "matrix"])
def test_150k_series_are_refused_within_their_bytes_again(cmd, tmp_path):
    """150,000 series took 342 MB (`windows`) and 529 MB (`matrix`), 15-30 times the 20 MB
    answer. They are now counted in the bytes and refused before any is decoded: the peak RSS
    over the same command against one series stays under twice the answer's bytes."""
    n = 150_000
    body = len(many_series("vector" if cmd == "matrix" else "matrix", n, 0.0))
    with serving(series(1)) as url:  # the same command and imports; its one series of 1e6 s
        _, _, base, _ = run_measured(_argv(cmd, url), tmp_path)
    with serving(series(n)) as url:
        code, err, peak, _ = run_measured(_argv(cmd, url), tmp_path)
    assert peak - base < 2 * body, (f"peak {peak / 2**20:.0f} MiB, {base / 2**20:.0f} MiB for "
                                    f"one series, answer {body / 2**20:.0f} MiB")
    lines = err.strip().splitlines()
    assert code == 5 and len(lines) == 1 and f"more than {MAX_SERIES} series" in lines[0], err
