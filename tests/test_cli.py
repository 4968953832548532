import subprocess
import sys

from wanprobe import __version__


def run(*args):
    return subprocess.run([sys.executable, "-m", "wanprobe", *args], capture_output=True, text=True)


def test_version():
    r = run("--version")
    assert r.returncode == 0
    assert r.stdout.strip() == f"wanprobe {__version__}"


def test_help_lists_purpose():
    r = run("--help")
    assert r.returncode == 0
    assert "datacenter" in r.stdout


def test_unknown_command_is_one_line_error():
    r = run("no-such-command")
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "error" in lines[0]
    assert "Traceback" not in r.stderr
