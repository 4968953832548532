"""Path probes: STAMP/TWAMP-light reflector and sender, ICMP and TCP-connect probes, path MTU."""
