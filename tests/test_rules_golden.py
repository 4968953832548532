"""Golden of the rule engine (issue 21): ``run_rules`` gives the same findings — ids, severities,
titles, evidence, knobs, impact, host and direction, in the same order — on 600 random but valid
measurement sets (tests/golden_rules.py) as it gave when the golden was recorded.

The golden (tests/fixtures/golden/rules.json.gz) was recorded before the rule inputs were typed
by one codec and the judgements moved into one engine; record it again only for a deliberate
change of a rule's output (``python tests/test_rules_golden.py --record``), and say so in the
commit. Each set also stores a digest of its inputs, so a changed generator is told apart from
changed findings.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import golden_rules as gen
import pytest

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "golden" / "rules.json.gz"


def findings_of(i: int) -> tuple[str, list[dict]]:
    from wanprobe.diagnose.engine import run_rules
    from wanprobe.report.codec import host_of, measured_of

    m, h, cfg = gen.measurement_set(i)
    inputs = gen.digest([m, h, gen.config_json(cfg)])
    return inputs, [f.to_json() for f in run_rules(measured_of(m), host_of(h), cfg)]


def record() -> None:
    sets = [dict(zip(("inputs", "findings"), findings_of(i), strict=True))
            for i in range(gen.SETS)]
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps({"seed": gen.SEED, "sets": sets}, sort_keys=True, separators=(",", ":"))
    GOLDEN.write_bytes(gzip.compress(data.encode(), mtime=0))


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(gzip.decompress(GOLDEN.read_bytes()))


def test_golden_covers_every_rule(golden):
    """The sets reach every rule that can fire on them: a golden that never fires proves nothing."""
    from wanprobe.diagnose.engine import ALL_RULES

    fired = {f["id"] for s in golden["sets"] for f in s["findings"]}
    # the fabric's findings carry the counter rules' own ids
    ids = {getattr(fn, "rule_id", None) for fn in ALL_RULES} - {None, "fabric"}
    assert len(golden["sets"]) == gen.SETS and golden["seed"] == gen.SEED
    assert ids <= fired, sorted(ids - fired)
    assert {fid for fid, _ in gen.FABRIC_IDS} <= fired
    assert "engine.rule_error" not in fired


def test_run_rules_gives_the_recorded_findings(golden):
    changed = []
    for i, want in enumerate(golden["sets"]):
        inputs, got = findings_of(i)
        assert inputs == want["inputs"], f"set {i}: the generator changed, not the rules"
        if got != want["findings"]:
            changed.append(i)
    if changed:
        i = changed[0]
        got, want = findings_of(i)[1], golden["sets"][i]["findings"]
        pairs = enumerate(zip(got, want, strict=False))
        first = next((k for k, (a, b) in pairs if a != b), min(len(got), len(want)))
        pytest.fail(f"{len(changed)} of {gen.SETS} sets give other findings, first set {i}: "
                    f"ids {[f['id'] for f in got]} vs recorded {[f['id'] for f in want]}; "
                    f"finding {first}: {got[first:first + 1]} vs {want[first:first + 1]}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python tests/test_rules_golden.py --record")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    record()
    print(f"recorded {GOLDEN}")
