"""Multi-stream TCP/UDP throughput tests that explain what limits the transfer.

``run_throughput`` (client.py) runs a test against a ``ThroughputServer`` (server.py, served by
``wanprobe reflect``) or an iperf3 server, and returns a ``ThroughputResult`` (result.py).
Exported lazily so ``python -m wanprobe.throughput.server`` does not import itself twice.
"""

from __future__ import annotations

__all__ = ["ThroughputResult", "ThroughputServer", "run_throughput"]


def __getattr__(name: str):
    if name == "run_throughput":
        from wanprobe.throughput.client import run_throughput
        return run_throughput
    if name == "ThroughputResult":
        from wanprobe.throughput.result import ThroughputResult
        return ThroughputResult
    if name == "ThroughputServer":
        from wanprobe.throughput.server import ThroughputServer
        return ThroughputServer
    raise AttributeError(name)
