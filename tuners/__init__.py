"""Tuners: read current, plan, apply, verify and roll back host network settings.

Knob keys each tuner accepts (report ``findings[].knobs[]`` → ``wanprobe tune plan``):

* ``sysctl``: dotted names, e.g. ``net.ipv4.tcp_rmem`` = ``"4096 131072 67108864"``,
  ``net.ipv4.tcp_congestion_control`` = ``"bbr"`` (allow-list in ``tuners.sysctl.SPECS``);
  several knobs for one key are alternatives in order of preference.
* ``link``: ``<ifname>/mtu``, ``<ifname>/txqueuelen``, ``<ifname>/rx_ring``, ``<ifname>/tx_ring``.
* ``dscp``: any key; the value is a classifier object or list (or its JSON text):
  ``{"dscp": "AF41", "daddr": ["198.18.0.0/15"], "proto": "tcp", "dport": "29500-29510",
  "uid": 1000, "cgroup": "training.slice"}``; planned as ``nft:inet wanprobe`` (or
  ``iptables:mangle WANPROBE`` without nft).
* ``roce``: ``<if>/trust`` (dscp|pcp), ``<if>/ecn_np/<prio>``, ``<if>/ecn_rp/<prio>`` (0|1),
  ``<if>/pfc`` (a priority, a list, or ``0,0,0,1,0,0,0,0``); without a kernel interface the
  plan carries the exact ``dcb``/``mlnx_qos`` commands as a manual step.
* ``nccl``: ``NCCL_*`` names; never applied to the host: ``wanprobe nccl-env`` renders them.

A knob's optional ``side`` (local | peer | both) picks the end it is planned on
(``tune plan --side``). Library entry points: ``tuners.from_report.build_plan``,
``tuners.transaction.apply_plan / rollback / status / recover``, ``tuners.registry.build_tuners``.
"""
