"""Types: ``mypy --strict`` is clean on the packages declared clean (issue 38).

The list is pyproject.toml's ``[tool.mypy] files``, the one place (``.venv/bin/mypy`` alone
checks the same packages); a package joins it once it is clean. Modules the listed packages
import are read for their types only (``follow_imports = "silent"``). Without mypy installed
(a laptop without the test extra) the check skips; under CI=true that is a failure
(``conftest.require``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import REPO, require


def clean_packages() -> list[str]:
    """The packages ``mypy --strict`` must pass, as pyproject.toml declares them."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    return [str(p) for p in config["files"]]


def test_the_declared_packages_exist_and_start_with_tuners() -> None:
    packages = clean_packages()
    assert packages[0] == "tuners"
    assert [p for p in packages if not (REPO / p).is_dir()] == []


def test_mypy_strict_is_clean_on_the_declared_packages(tmp_path: Path) -> None:
    require(None if importlib.util.find_spec("mypy") else "needs mypy (pip install -e '.[test]')")
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", str(REPO / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "mypy_cache"), *clean_packages()],
        cwd=REPO, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, f"mypy --strict found errors:\n{r.stdout}{r.stderr}"
