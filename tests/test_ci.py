from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    command = ci[ci.index("# README test command:") + 1].strip()
    assert command in (REPO / "README.md").read_text()
    assert "pytest" in command
