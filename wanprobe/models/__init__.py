"""Pure models: bandwidth-delay product, TCP rate bounds, collective cost, training impact.

Every function takes SI base units (bits per second, seconds, bytes, loss as a fraction) and
is pure: no I/O, no globals. Each docstring cites the formula it implements.
"""
