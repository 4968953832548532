"""Path probes: STAMP/TWAMP-light reflector and sender, ICMP and TCP-connect probes, path MTU.

Library entry points (imported lazily so ``import wanprobe.probe`` stays cheap):
``probe_stamp``, ``probe_icmp``, ``probe_tcp`` (async, many may share one loop), ``run_probe``
(sync wrapper), ``probe_path_mtu``, ``Reflector``, ``StampSender``, ``ProbeResult``, ``MtuResult``.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "probe_stamp": "sender", "StampSender": "sender", "probe_icmp": "icmp",
    "IcmpSender": "icmp", "probe_tcp": "tcp_connect", "run_probe": "api", "probe": "api",
    "probe_path_mtu": "mtu", "Reflector": "reflector", "ProbeResult": "result",
    "MtuResult": "result",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'wanprobe.probe' has no attribute {name!r}")
    return getattr(importlib.import_module(f"wanprobe.probe.{module}"), name)
