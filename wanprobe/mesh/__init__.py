"""The fleet's mesh: one file naming every host and its site (``topology.py``: who this host is
and whom it probes) and the ``Peer`` the daemon probes (``peer.py``)."""
