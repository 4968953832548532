"""Multi-stream TCP/UDP throughput tests that explain what limits the transfer.

``run_throughput`` (client.py) runs a test against a ``ThroughputServer`` (server.py, served by
``wanprobe reflect``) or an iperf3 server, and returns a ``ThroughputResult`` (result.py).
Exported lazily so ``python -m wanprobe.throughput.server`` does not import itself twice.
"""

from __future__ import annotations

import importlib

_MODULE_OF = {"run_throughput": "wanprobe.throughput.client",
              "ThroughputResult": "wanprobe.throughput.result",
              "ThroughputServer": "wanprobe.throughput.server"}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(name)
    return getattr(importlib.import_module(_MODULE_OF[name]), name)
