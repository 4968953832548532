"""Issue 36, must show (1): on a 130 ms lab losing 2 % forward, both hosts on bbr, diagnose
reports the forward loss as a finding whatever the cc — its 95 % interval holding the 2 % the
lab drops — and the Markdown ticket carries both addresses, the UTC times and the loss of each
direction with its sample and interval."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_diagnose_netns import reflected  # noqa: F401 - the fixture

pytestmark = pytest.mark.netns

LOSS_AB = 0.02


# the interval is a 95 % one: it misses the true rate in about one run in twenty, by design
@pytest.mark.flaky(reruns=2)
def test_forward_loss_on_a_bbr_path_is_a_finding_with_its_interval(reflected, tmp_path):  # noqa: F811
    lab = reflected(rtt_ms=130, rate_bps=100e6, loss_ab=LOSS_AB)
    for end in (lab.a, lab.b):
        end.run(["sysctl", "-q", "-w", "net.ipv4.tcp_congestion_control=bbr"], check=True)
    out = tmp_path / "r.json"
    r = lab.a.run([sys.executable, "-m", "wanprobe", "diagnose", lab.b.addr, "--quick",
                   "--no-throughput", "-o", str(out), "--json"], capture_output=True, text=True,
                  timeout=180)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    found = [f for f in doc["findings"] if f["id"] == "path.loss_above_slo"]
    forward = [f for f in found if f.get("direction") == "forward"]
    assert forward, [(f["id"], f["title"]) for f in doc["findings"]]
    ev = forward[0]["evidence"]
    lo, hi = ev["ci95"]
    print(f"\nforward {ev['lost']}/{ev['sent']} = {ev['loss_ratio']:.4f}, 95 % interval "
          f"{lo:.4f}-{hi:.4f} (lab {LOSS_AB}); {forward[0]['title']}")
    assert lo <= LOSS_AB <= hi, ev
    assert ev["sent"] >= 2000 and ev["lost"] == round(ev["loss_ratio"] * ev["sent"])
    assert ev["cc"] == "bbr" and ev["stream_rate_bound_bps"] <= ev["link_rate_bps"]
    # the reverse direction loses nothing: no finding there
    assert not [f for f in found if f.get("direction") == "reverse"], found
    ticket = subprocess.run([sys.executable, "-m", "wanprobe", "report", "show", str(out),
                             "--format", "markdown"], capture_output=True, text=True, timeout=60)
    assert ticket.returncode == 0, ticket.stderr
    md = ticket.stdout
    assert lab.a.addr in md and lab.b.addr in md and " UTC" in md
    loss_rows = [ln for ln in md.splitlines() if ln.startswith("| loss, ")]
    assert len(loss_rows) >= 2 and all("95 % interval" in ln for ln in loss_rows), loss_rows
    assert "path.loss_above_slo" not in md and "R-" not in md.split("## Findings")[1][:4000]
