"""The command line imports only the module of the command it runs (wanprobe/cli.py): its
word -> module table must be exactly what the command modules register."""

from __future__ import annotations

import subprocess
import sys

import typer

from wanprobe import cli


def _registered() -> dict[str, str]:
    words = {}
    for module in cli.COMMAND_MODULES:
        one = typer.main.get_command(cli.build((module,)))
        words.update({word: module for word in one.commands})
    return words


def test_the_word_table_is_what_the_modules_register():
    assert cli.COMMANDS == _registered()
    assert set(typer.main.get_command(cli.app).commands) == set(cli.COMMANDS)


def test_a_table_missing_a_word_would_be_caught(monkeypatch):
    monkeypatch.setitem(cli.COMMANDS, "mtu", "throughput")  # planted: a word sent to the wrong module
    assert cli.COMMANDS != _registered()


def test_a_command_run_imports_its_module_only():
    code = ("import sys; from wanprobe import cli; cli.command(['report', 'show', 'x']); "
            "print(' '.join(m for m in cli.COMMAND_MODULES if 'wanprobe.commands.' + m "
            "in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["report"]


def test_an_unknown_word_or_no_word_gets_every_command():
    for argv in (["nosuch"], [], ["--help"], ["--version"]):
        assert set(cli.command(argv).commands) == set(cli.COMMANDS), argv
