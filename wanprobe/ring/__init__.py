"""``wanprobe ring``: every edge of a training ring measured at once, then each WAN edge alone
(the pure part: ``model.py`` the result types, ``plan.py`` the ring, its sites, its shared
bottlenecks, the best order and the NCCL settings; the command runs the transfers)."""
