"""The demo story on the built-in lab: an untuned transpacific path (taipei-uswest: 130 ms,
0.1 % loss, 100 Mbit/s) whose ends run reno with small buffers; diagnose → plan → apply in both
namespaces → re-measure → before/after, then roll back (checked) and tear down.

Everything runs through the real CLI inside the lab namespaces (``ip netns exec``), so the demo
exercises exactly what an operator would type. The root namespace is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from wanprobe.errors import WanprobeError
from wanprobe.lab import netns
from wanprobe.lab.scenario import (
    UNTUNED,
    run_wanprobe_json,
    set_untuned,
    start_reflector,
    tune_both_ends,
)
from wanprobe.safe_text import SafeConsole as Console
from wanprobe.units import format_rate

PROFILE = "taipei-uswest"
WATCHED = (*UNTUNED, "net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_no_metrics_save",
           "net.ipv4.tcp_notsent_lowat", "net.ipv4.tcp_mtu_probing")


def _sysctls(end) -> dict[str, str]:
    r = end.run(["sysctl", "-n", *WATCHED], capture_output=True, text=True, timeout=10)
    return dict(zip(WATCHED, (" ".join(v.split()) for v in r.stdout.splitlines()), strict=False))


def _throughput(lab, duration_s: float) -> dict:
    doc = run_wanprobe_json(lab.a, "throughput", lab.b.addr, "--duration", f"{duration_s:g}s")
    return {"bits_per_second": doc["bits_per_second"],
            "limited_by": (doc.get("limited_by") or {}).get("verdict"),
            "retransmits": doc.get("retransmits"), "cc": doc.get("cc")}


def after_of(checked: dict | None) -> dict:
    """The demo's "after" row from `tune apply --verify`'s answer (diagnose/verify.py): the
    rate with the ramp-up left out, and the loop's verdict against the measured capacity."""
    if not checked:
        raise WanprobeError("demo: the re-measure after tuning (`tune apply --verify`) failed")
    after = checked["bits_per_second_after_omit"]
    return {"bits_per_second": after if after is not None else checked["bits_per_second"],
            "ramp_up_left_out": after is not None,
            "bits_per_second_with_ramp_up": checked["bits_per_second"],
            "omit_s": checked["omit_s"], "limited_by": checked["verdict"],
            "limit": checked["limit"], "path_full": checked["path_full"],
            "share_of_capacity": checked["share_of_capacity"],
            "capacity_bits_per_second": checked["capacity_bits_per_second"],
            "capacity_source": checked["capacity_source"], "summary": checked["summary"],
            "evidence": checked["evidence"], "attempts": checked["attempts"],
            "next_step": checked["next_step"], "cc": checked["cc"]}


def run_demo_story(json_output: bool, *, lab_name: str = "wpdemo",
                   duration_s: float = 5.0) -> dict[str, Any]:
    """Run the whole story and return its JSON document (``before``, ``after``, ``ratio``,
    ``findings``, ``plan``, ``rollback``). Prints progress and a before/after table unless
    ``json_output``."""
    from wanprobe.lab import Lab

    console = Console(stderr=json_output, highlight=False, quiet=json_output)
    state = Path(tempfile.mkdtemp(prefix="wanprobe-demo-"))
    env_state = ["--state-dir", str(state)]
    doc: dict[str, Any] = {"lab": {"name": lab_name, "profile": PROFILE}}
    try:
        with Lab(name=lab_name, profile=PROFILE) as lab:
            console.print(f"lab [bold]{lab_name}[/] up ({PROFILE}); untuning both ends: "
                          + ", ".join(f"{k.split('.')[-1]}={v}" for k, v in UNTUNED.items()))
            for end in (lab.a, lab.b):
                set_untuned(end)
            reflector = start_reflector(lab)
            try:
                console.print("measuring before …")
                doc["before"] = _throughput(lab, duration_s)
                console.print("diagnosing …")
                report = run_wanprobe_json(lab.a, "diagnose", lab.b.addr, "--quick")
                report_path = state / "report.json"
                report_path.write_text(json.dumps(report))
                doc["findings"] = [{k: f[k] for k in ("id", "severity", "title",
                                                      "expected_effect")} | {"knobs": f["knobs"]}
                                   for f in report["findings"]]
                originals = {end.name: _sysctls(end) for end in (lab.a, lab.b)}
                doc["plan"], journals = _tune_both_ends(lab, state, report_path)
                console.print(f"applied {doc['plan']['applied']} change(s); measured again by "
                              "`tune apply --verify`")
                doc["after"] = after_of(journals[lab.a.name]["verify"])
                for end in (lab.a, lab.b):
                    run_wanprobe_json(end, "tune", "rollback", *env_state)
                restored = {end.name: _sysctls(end) for end in (lab.a, lab.b)}
                doc["rollback"] = {"restored": restored == originals,
                                   "differences": {n: {k: (originals[n].get(k), v)
                                                       for k, v in restored[n].items()
                                                       if originals[n].get(k) != v}
                                                   for n in restored}}
            finally:
                netns.stop(reflector)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    before, after = doc["before"]["bits_per_second"], doc["after"]["bits_per_second"]
    doc["ratio"] = round(after / before, 2) if before else None
    if not json_output:
        _print_table(console, doc)
    return doc


def _tune_both_ends(lab, state: Path, report_path: Path) -> tuple[dict[str, Any], dict[str, dict]]:
    """scenario.tune_both_ends with the local apply's --verify. Returns (the demo's plan
    section, each end's apply JSON)."""
    plans, journals = tune_both_ends(lab, state, report_path, verify=True)
    plan: dict[str, Any] = {k: [{**x, "host": p["for_host"]} for p in plans.values()
                                for x in p[k]] for k in ("changes", "skipped", "manual")}
    plan["unknown"] = [u for p in plans.values() for u in p["unknown"]]
    plan["applied"] = {n: len((j["journal"] or {}).get("entries") or [])
                       for n, j in journals.items()}
    return plan, journals


def _print_table(console: Console, doc: dict) -> None:
    t = Table(title=f"{PROFILE}: before and after tuning (same lab, same run)")
    for col in ("", "throughput", "limited by", "cc"):
        t.add_column(col)
    after = doc["after"]
    for name, limit in (("before", doc["before"]["limited_by"]), ("after", after["limit"])):
        row = doc[name]
        t.add_row(name, format_rate(row["bits_per_second"]), str(limit), str(row["cc"]))
    console.print(t)
    tests = " then ".join(f"{a['duration_s']:g} s" for a in after["attempts"])
    console.print(f"ratio after/before: [bold]{doc['ratio']}×[/] (after: {tests} test, the first "
                  f"{after['omit_s']:g} s of ramp-up left out, as iperf3 --omit)")
    cap = after["capacity_bits_per_second"]
    console.print(escape(f"capacity {format_rate(cap) if cap else '-'} ({after['capacity_source']}): "
                         f"{after['summary']}"))
    console.print(escape(f"next step: {after['next_step']}"))
    for f in doc["findings"][:3]:
        console.print(escape(f"  [{f['severity']}] {f['title']}: {f['expected_effect']}"))
    console.print("rollback restored every value" if doc["rollback"]["restored"]
                  else f"rollback differences: {doc['rollback']['differences']}")


if __name__ == "__main__":  # pragma: no cover - manual run: python -m wanprobe.demo_story
    print(json.dumps(run_demo_story(True, lab_name=os.environ.get("WANPROBE_DEMO_LAB", "wpdemo")),
                     indent=2))
