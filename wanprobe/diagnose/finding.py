"""The one Finding type (what is wrong, the numbers that show it, what to do) and its Knob (a
setting a tuner can plan). Every judgement returns it: the diagnose rules, the counter rules,
the daemon's path findings; ``report/document.py`` re-exports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SEVERITIES = ("critical", "warning", "info")
# The one list of tuner names a Knob may carry (issue 38): ``tuners/registry.py`` derives the
# tuners it builds and the auto-apply allow-list from it, and the report schema's knob enum
# matches it (tests/test_tuner_names.py). ``nccl`` knobs are a job's environment: a manual step.
TUNERS = ("sysctl", "link", "dscp", "roce", "nccl")


@dataclass(frozen=True)
class Knob:
    """One setting a tuner can plan: ``tuner`` names the tuners/ module (one of ``TUNERS``),
    ``key`` its knob."""

    tuner: str
    key: str
    value: str
    reason: str
    side: str | None = None   # "local" | "peer" | "both": which end of the path to set it on
    iface: str | None = None  # link / roce knobs: the interface
    host: str | None = None   # "local" | "peer": the host to set it on (schema 1.1)

    @property
    def for_host(self) -> str:
        """The host this knob is for: explicit ``host``, else ``peer`` for a peer-side knob and
        ``local`` for the rest (host-config and fabric rules judge the host that ran them)."""
        return self.host or ("peer" if self.side == "peer" else "local")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tuner": self.tuner, "key": self.key, "value": self.value,
                               "reason": self.reason}
        if self.host is not None:
            out["host"] = self.host
        if self.side is not None:
            out["side"] = self.side
        if self.iface is not None:
            out["iface"] = self.iface
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Knob:
        return cls(tuner=d["tuner"], key=d["key"], value=d["value"], reason=d["reason"],
                   side=d.get("side"), iface=d.get("iface"), host=d.get("host"))


@dataclass(frozen=True)
class Finding:
    """What is wrong, the numbers that show it, what to do and what it should buy."""

    id: str
    severity: str
    title: str
    evidence: Mapping[str, Any]
    recommendation: str
    expected_effect: str
    knobs: tuple[Knob, ...] = ()
    impact: float | None = None  # modelled share of the achievable rate lost (0..1)
    host: str | None = None       # "local" | "peer": the host the finding is about (1.1)
    direction: str | None = None  # "forward" (local sends) | "reverse" (peer sends) (1.1)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} not in {SEVERITIES}")
        if self.impact is not None:
            object.__setattr__(self, "impact", round(min(1.0, max(0.0, float(self.impact))), 4))

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "severity": self.severity, "title": self.title,
                "evidence": dict(self.evidence), "recommendation": self.recommendation,
                "expected_effect": self.expected_effect,
                "knobs": [k.to_json() for k in self.knobs], "impact": self.impact,
                **{k: v for k, v in (("host", self.host), ("direction", self.direction)) if v}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Finding:
        return cls(id=d["id"], severity=d["severity"], title=d["title"],
                   evidence=dict(d["evidence"]), recommendation=d["recommendation"],
                   expected_effect=d["expected_effect"],
                   knobs=tuple(Knob.from_json(k) for k in d["knobs"]), impact=d.get("impact"),
                   host=d.get("host"), direction=d.get("direction"))
