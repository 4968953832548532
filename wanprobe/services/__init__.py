"""One composition per capability, used alike by the commands, the daemon and the demo.

``reflect`` (the STAMP reflector and the throughput server on one port, under one policy),
``counters`` (sample → rates → the fabric rules), ``measure`` (one probe session or one
capped throughput test against a configured peer), ``diagnose`` (peer, route and host resolved
once) and ``tune`` (plan → apply → verify → roll back in one namespace's journal store).
A command parses its options, calls one service and renders; the daemon owns the loops and
calls the same services; the demo and the tune check drive them through the commands.
"""
