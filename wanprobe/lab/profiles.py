"""Named link profiles modelled on real inter-datacenter routes.

RTTs are round numbers inside the ranges that public measurement tables report for each route.
Two kinds of rate: the behaviour profiles are scaled down to what the userspace delay line
carries comfortably (≤ 200 Mbit/s: BDP, loss sensitivity, DSCP, quick demos); the ``-dci``
profiles run the same routes at the rates a datacenter interconnect's host sees, as far as this
lab carries them (issue 35: TCP and UDP GSO super-packets through the delay line, ~6 Gbit/s at
130 ms on 2 cores; real links are 10-400 Gbit/s), so that the measurement and tuning figures
are proved where the buffers and slow start of a high-BDP path matter.

Sources (consulted for ranges, not copied verbatim):
- WonderNetwork global ping statistics, https://wondernetwork.com/pings (city-to-city RTT
  medians, e.g. Taipei↔Tokyo, Taipei↔Singapore, Taipei↔San Francisco/Los Angeles).
- Google Cloud inter-region latency (Network Intelligence Center "Performance Dashboard", and
  https://cloud.google.com/network-intelligence-center/docs/performance-dashboard/concepts/metrics)
  for asia-east1 (Changhua County, Taiwan) ↔ asia-northeast1 (Tokyo), asia-southeast1
  (Singapore), us-west1 (Oregon).
- Azure "network round-trip latency statistics",
  https://learn.microsoft.com/azure/networking/azure-network-latency (East Asia/Japan East/
  Southeast Asia/West US pairs as cross-checks).
- TeleGeography Submarine Cable Map, https://www.submarinecablemap.com (cable routes: e.g.
  FASTER and NCP Taiwan↔US West, APG/SJC2 Taiwan↔Japan/Singapore).
- The December 2006 Hengchun earthquake cut most cables around Taiwan; traffic rerouted over
  longer paths with markedly higher RTT and loss for weeks (RIPE NCC / Renesys analyses), the
  model for ``subsea-degraded``.
"""

from __future__ import annotations

from dataclasses import dataclass

from wanprobe.errors import UsageError


@dataclass(frozen=True)
class Profile:
    name: str
    rtt_ms: float
    jitter_ms: float
    loss: float
    rate_bps: float | None
    description: str

    def to_json(self) -> dict:
        return {"name": self.name, "rtt_ms": self.rtt_ms, "jitter_ms": self.jitter_ms,
                "loss": self.loss, "rate_bps": self.rate_bps, "description": self.description}


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("metro", 2.0, 0.05, 0.0, 200e6,
            "two datacenters in one metro area over dark fibre (~1-2 ms RTT)"),
    Profile("taipei-tokyo", 35.0, 0.3, 0.0, 200e6,
            "Taiwan <-> Tokyo over APG/NCP-class subsea cables (~30-40 ms RTT)"),
    Profile("taipei-singapore", 50.0, 0.5, 0.0, 200e6,
            "Taiwan <-> Singapore over SJC2/APG-class subsea cables (~45-55 ms RTT)"),
    Profile("taipei-uswest", 130.0, 1.0, 0.001, 100e6,
            "Taiwan <-> US West coast over transpacific cables (FASTER/NCP, ~120-140 ms RTT), "
            "0.1% loss as on a busy long-haul path"),
    Profile("subsea-degraded", 220.0, 3.0, 0.01, 50e6,
            "transpacific path rerouted around a cable cut (cf. 2006 Hengchun earthquake): "
            "long detour, 1% loss"),
    Profile("taipei-tokyo-dci", 35.0, 0.0, 0.0, 5e9,
            "Taiwan <-> Tokyo at datacenter-interconnect rate, as fast as the lab carries "
            "(5 Gbit/s; BDP 22 MB)"),
    Profile("taipei-uswest-dci", 130.0, 0.0, 0.0001, 2e9,
            "Taiwan <-> US West at datacenter-interconnect rate with 0.01% loss (2 Gbit/s; "
            "BDP 32.5 MB: one default-tuned stream gets a fraction of it)"),
)}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UsageError(f"unknown lab profile {name!r} (known: {', '.join(PROFILES)})") from None
