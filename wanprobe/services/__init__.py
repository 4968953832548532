"""One composition per capability, used alike by the commands, the daemon and the demo.

``reflect`` (the STAMP reflector and the throughput server on one port, under one policy),
``counters`` (sample → rates → the fabric rules) and ``measure`` (one probe session or one
capped throughput test against a configured peer). A command parses its options, calls one
service and renders; the daemon owns the loops and calls the same services.
"""
