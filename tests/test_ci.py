import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Paths that would make a test or a source comment depend on something beside the checkout.
OUTSIDE = ("../shared", "WANPROBE_SHARED", "STYLE.md", "DESIGN.md", "shared/reference",
           "shared/fixtures")


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    command = ci[ci.index("# README test command:") + 1].strip()
    assert command in (REPO / "README.md").read_text()
    assert "pytest" in command


def test_ci_runs_the_tests_in_a_fresh_clone_with_nothing_beside_it():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    clone = next(i for i, line in enumerate(ci) if line.startswith("git clone"))
    cd = next(i for i, line in enumerate(ci) if line.startswith('cd "$work/'))
    assert "mktemp -d" in "\n".join(ci[:clone])
    assert clone < cd < ci.index("# README test command:")


def test_nothing_in_the_tree_reaches_outside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    hits = []
    for name in files:
        if name == "tests/test_ci.py" or name.startswith("tests/fixtures/trees/"):
            continue
        try:
            text = (REPO / name).read_text()
        except (UnicodeDecodeError, OSError):
            continue
        hits += [f"{name}: {word}" for word in OUTSIDE if word in text]
    assert not hits, hits
