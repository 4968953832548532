"""When to sync (issue 23): hour-of-week profiles of a path and the transfer windows they give.

A profile holds, for each of the 168 hours of the week (hour 0 = Monday 00:00 UTC), the goodput
the daemons' scheduled throughput tests achieved (p10, p50), the loss per direction and the RTT
median of the probe sessions, with the number of samples behind each figure. It is read from a
fleet's Prometheus (``fleet windows``) or from one host's store (``history PEER --windows``);
an hour without samples has no figures. Scheduling bulk transfers into the hours a WAN has
capacity left is what NetStitcher (SIGCOMM 2011) and Pretium (SIGCOMM 2016) build on.
"""
