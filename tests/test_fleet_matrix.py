"""`wanprobe fleet matrix` without a Prometheus: the pure assembly of site pairs from query
results, and one clear error for a server that is down or answers something else."""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from wanprobe.cli import main
from wanprobe.fleet.matrix import PrometheusError, assemble, parse_vector


def _vec(*samples) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": m, "value": [0, v]} for m, v in samples]}}).encode()


def test_assemble_pairs_values_and_alerts():
    fig = {"rtt_p50_seconds": parse_vector(_vec(({"src_site": "a", "dst_site": "b"}, "0.02"),
                                                ({"src_site": "b", "dst_site": "a"}, "0.021"))),
           "loss_forward_ratio": parse_vector(_vec(({"src_site": "a", "dst_site": "b"}, "NaN")))}
    alerts = [{"alertname": "WanprobeLossForwardAboveSLO", "src_site": "a", "dst_site": "b"},
              {"alertname": "WanprobeDaemonDown", "src_site": "b", "dst_site": "any"},
              {"alertname": "WanprobeReflectorNotAnswering", "src_site": "a", "dst_site": "c"}]
    pairs = {(p.src_site, p.dst_site): p.to_json() for p in assemble(fig, alerts)}
    assert pairs[("a", "b")]["rtt_p50_seconds"] == 0.02
    assert pairs[("a", "b")]["loss_forward_ratio"] is None  # 0/0 in PromQL is NaN: unknown
    assert pairs[("a", "b")]["alerts"] == ["WanprobeLossForwardAboveSLO"]
    assert pairs[("b", "a")]["alerts"] == ["WanprobeDaemonDown"]
    assert pairs[("a", "c")]["alerts"] == ["WanprobeReflectorNotAnswering"]  # no data, alert only
    assert set(pairs[("a", "b")]) == {"src_site", "dst_site", "rtt_p50_seconds", "rtt_p99_seconds",
                                      "loss_forward_ratio", "loss_reverse_ratio",
                                      "throughput_bits_per_second", "alerts"}


@pytest.mark.parametrize("body", [b"not json", b'{"status": "success"}', b"[1, 2]",
                                  b'{"status": "error", "error": "bad query"}',
                                  json.dumps({"status": "success", "data": {
                                      "resultType": "vector", "result": [{"metric": {},
                                                                          "value": [0, "x"]}]}}).encode()])
def test_parse_vector_refuses_what_is_not_a_result(body):
    with pytest.raises(PrometheusError):
        parse_vector(body)


@contextlib.contextmanager
def serving(body: bytes):
    """A local HTTP server answering every GET with ``body`` (yields its base URL)."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _run(capsys, *argv):
    with pytest.raises(SystemExit) as ex:
        main(list(argv))
    out = capsys.readouterr()
    return ex.value.code, out.out, out.err


def test_matrix_errors_are_one_line(capsys):
    with serving(b"<html>not prometheus</html>") as url:
        rc, out, err = _run(capsys, "fleet", "matrix", "--prometheus", url, "--json")
    assert rc == 5 and out == "" and "not a Prometheus query result" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    rc, _, err = _run(capsys, "fleet", "matrix", "--prometheus", "ftp://x")
    assert rc == 2 and "not an http(s) URL" in err


def test_matrix_table_for_people(capsys):
    with serving(_vec(({"src_site": "tpe", "dst_site": "tyo"}, "0.0201"))) as url:
        rc, out, err = _run(capsys, "fleet", "matrix", "--prometheus", url)
    assert rc == 0, err
    assert "tpe" in out and "tyo" in out and "20.1 / 20.1 ms" in out
