"""A schema-valid report built to be hostile to its renderers (issue 19): many findings, and
text with escape sequences in every string a renderer shows."""

from __future__ import annotations


def hostile_report(n_findings: int, text: str = "") -> dict:
    """A schema-valid report of ``n_findings`` findings, ``text`` in every string a renderer
    shows (a title, a recommendation, evidence, a knob's reason, the peer's address)."""
    from wanprobe.report.document import Finding, Knob, Report

    knob = Knob("sysctl", "net.ipv4.tcp_rmem", "4096 131072 67108864", f"window {text}")
    findings = tuple(Finding(f"path.hostile_{i}", "warning", f"finding {i} {text}",
                             {"rtt_ms": 130.0, "note": text, "sources": {"rtt_ms": "probe"}},
                             f"raise the window {text}", "", (knob,)) for i in range(n_findings))
    host = {"hostname": f"h {text}", "kernel": "6.18", "sysctls": {}, "available_cc": ["reno"],
            "allowed_cc": ["reno"], "ifaces": {}}
    return Report(id="r19", created_at="2026-12-03T00:00:00Z",
                  tool={"name": "wanprobe", "version": "0.1"}, host=host,
                  peer={"address": f"198.18.0.2 {text}"}, measurements={}, findings=findings,
                  timestamps={"started": "x", "finished": "x"}).to_json()
