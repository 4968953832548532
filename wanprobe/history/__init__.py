"""The history: the daemon's SQLite store of probe sessions, throughput tests, counter rates,
findings and reports (``store.py``), written by the daemon, read by pictures, preflight and
windows."""
