"""Issue 38: one list of tuner names (``wanprobe/diagnose/finding.TUNERS``). What cannot import
it by its layer (the report schema, a JSON file) or keeps its own per-tuner dispatch (the rules'
knobs, the journal checks) is held to it here, so the lists cannot drift."""

import ast
from pathlib import Path

import pytest

from tuners import plan, registry
from tuners.journal_check import check
from tuners.registry import APPLIABLE, AUTO_APPLY_TUNERS, MANUAL_ONLY_TUNERS, build_tuners
from wanprobe.diagnose.finding import TUNERS
from wanprobe.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def test_the_registry_derives_its_names_from_the_one_list():
    assert AUTO_APPLY_TUNERS == TUNERS
    assert set(APPLIABLE) | set(MANUAL_ONLY_TUNERS) == set(TUNERS)
    assert not set(APPLIABLE) & set(MANUAL_ONLY_TUNERS)
    assert plan.APPLIABLE is registry.APPLIABLE


def test_build_tuners_builds_every_appliable_tuner_under_its_own_name(tmp_path):
    tuners = build_tuners(tmp_path, tmp_path, nft=None)
    assert tuple(tuners) == APPLIABLE
    assert all(t.name == name for name, t in tuners.items())


def test_the_report_schema_and_document_name_the_same_tuners():
    from wanprobe.report.document import TUNERS as DOCUMENT_TUNERS
    from wanprobe.report.document import schema

    assert tuple(schema()["$defs"]["knob"]["properties"]["tuner"]["enum"]) == TUNERS
    assert DOCUMENT_TUNERS == TUNERS


def _knob_tuners_in(path: Path) -> set[str]:
    """The first argument of every ``Knob("<tuner>", ...)`` written as a literal."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Knob" \
                and node.args and isinstance(node.args[0], ast.Constant):
            out.add(node.args[0].value)
    return out


def test_every_knob_a_rule_writes_names_a_known_tuner():
    named = set().union(*(_knob_tuners_in(p) for p in (REPO / "wanprobe").rglob("*.py")))
    assert named and named <= set(TUNERS)


@pytest.mark.parametrize("tuner", APPLIABLE)
def test_the_journal_check_knows_every_appliable_tuner(tuner):
    doc = {"id": "j1", "state": "applied",
           "entries": [{"tuner": tuner, "key": "k", "new": "v", "status": "written"}]}
    try:
        check(doc, jid="j1", sysctl_dirs=(), permitted=registry.dscp_policy())
    except ConfigError as exc:   # the key is refused (it is not one), never the tuner
        assert "unknown tuner" not in str(exc)
    with pytest.raises(ConfigError, match="unknown tuner"):
        check({**doc, "entries": [{**doc["entries"][0], "tuner": "nope"}]}, jid="j1",
              sysctl_dirs=(), permitted=registry.dscp_policy())
