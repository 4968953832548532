import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_ruff_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.fail("ruff is part of the test extra and must be installed")
    r = subprocess.run([ruff, "check", "--no-cache", str(REPO)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
