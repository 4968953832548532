"""The typer application: the composition root for commands, and the one place errors become a
red line on stderr and an exit code.

Registration, one way: each module in ``wanprobe/commands/`` defines ``app = typer.Typer(...)``
with its commands; a command group names itself (``typer.Typer(name="lab", ...)``), a module of
top-level commands does not. This file adds each with ``app.add_typer(module.app)``.

Every parsed value passes one gate before a command runs (``_guard``): text must be valid UTF-8,
floats finite, integers within a signed 64-bit range (SQLite's, and the kernel's). Library code
raises ``WanprobeError``; ``WanprobeGroup.main`` prints it, and anything else that escapes, as one
line — never a traceback (``WANPROBE_DEBUG=1`` re-raises for a developer)."""

from __future__ import annotations

import functools
import importlib
import math
import os
import sys
from pathlib import PurePath
from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperGroup

from wanprobe import __version__
from wanprobe.errors import UsageError, WanprobeError, one_line, shown
from wanprobe.safe_text import SafeConsole as Console  # external text is data (issue 19)

try:  # typer >= 0.20 vendors its own click fork (and no longer installs click)
    from typer import _click as click
    from typer._click import exceptions as _click_exc
except ImportError:  # pragma: no cover - older typer on plain click
    import click
    from click import exceptions as _click_exc

_NO_ARGS = getattr(_click_exc, "NoArgsIsHelpError", ())
INT64_MAX = 2**63 - 1
EX_SOFTWARE = 70  # sysexits.h: an internal error, not the user's input

# each top-level command word -> the module that registers it, in the order help lists them
# (tests/test_cli_registry.py keeps this equal to what the modules register)
COMMANDS = {
    "lab": "lab", "demo": "demo", "probe": "probe", "mtu": "probe", "reflect": "probe",
    "throughput": "throughput", "counters": "counters", "diagnose": "diagnose", "tune": "tune",
    "nccl-env": "nccl", "report": "report", "impact": "impact", "daemon": "daemon",
    "history": "daemon", "fleet": "fleet", "paths": "paths", "preflight": "preflight",
    "ring": "ring", "job": "job",
}
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))

err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 1) -> None:
    """Print one error line to stderr and exit with ``code``."""
    err_console.print("[bold red]wanprobe: error:[/] " + escape(one_line(message)), markup=True)
    sys.exit(code)


def _label(param: Any) -> str:
    opts = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
    return opts[0] if opts else str(param.name or "value").upper()


def check_value(label: str, value: Any) -> None:
    """Refuse a parsed CLI value no command can use: undecodable text, NaN/inf, an integer
    beyond int64. Raises UsageError naming the option and the value (cut to a readable length)."""
    if isinstance(value, list | tuple):
        for v in value:
            check_value(label, v)
    elif isinstance(value, str | PurePath):
        try:
            str(value).encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"{label}: {shown(value)} is not valid UTF-8 text") from None
    elif isinstance(value, bool):
        return
    elif isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{label}: {value} is not a finite number")
    elif isinstance(value, int) and abs(value) > INT64_MAX:
        raise UsageError(f"{label}: {shown(value)} is out of range (|n| ≤ 2^63-1)")


def _guard(command: Any) -> None:
    """Wrap every command's callback so its values pass ``check_value`` first (idempotent)."""
    for sub in getattr(command, "commands", {}).values():
        _guard(sub)
    callback = getattr(command, "callback", None)
    if callback is None or getattr(callback, "_wanprobe_guarded", False):
        return
    labels = {p.name: _label(p) for p in command.params}

    @functools.wraps(callback)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for name, value in kwargs.items():
            check_value(labels.get(name, name), value)
        return callback(*args, **kwargs)

    checked._wanprobe_guarded = True  # type: ignore[attr-defined]
    command.callback = checked


def _internal(exc: BaseException) -> None:
    """An exception no code path expected: one line, exit 70; WANPROBE_DEBUG=1 re-raises."""
    if os.environ.get("WANPROBE_DEBUG"):
        raise exc
    fail(f"internal error ({type(exc).__name__}: {exc}); please report it "
         "(WANPROBE_DEBUG=1 shows where)", EX_SOFTWARE)


class WanprobeGroup(TyperGroup):
    """The root group: validates parsed values, then turns every exception into one line."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:  # noqa: ARG002
        try:
            _guard(self)
            rv = super().main(args, prog_name or "wanprobe", complete_var,
                              standalone_mode=False, **extra)
        except WanprobeError as exc:
            fail(str(exc), exc.exit_code)
        except _NO_ARGS as exc:
            typer.echo(exc.ctx.get_help() if getattr(exc, "ctx", None) else exc.format_message())
            sys.exit(0)
        except _click_exc.ClickException as exc:
            fail(exc.format_message(), exc.exit_code)
        except (typer.Abort, KeyboardInterrupt):
            fail("interrupted", 130)
        except BrokenPipeError:
            sys.exit(0)
        except OSError as exc:  # a path or device from the command line: say which
            where = f": {shown(str(exc.filename))}" if exc.filename else ""
            fail(f"{exc.strerror or exc}{where}", 1)
        except Exception as exc:  # noqa: BLE001 - the last line of "never a traceback"
            _internal(exc)
        sys.exit(rv if isinstance(rv, int) else 0)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"wanprobe {__version__}")
        raise typer.Exit()


def _new_app() -> typer.Typer:
    return typer.Typer(
        name="wanprobe",
        cls=WanprobeGroup,
        help=(
            "Measure, diagnose and tune datacenter-to-datacenter links for distributed AI "
            "training.\n\n"
            "Probe RTT, loss and throughput (STAMP, ICMP, TCP), read NIC/RoCE/PFC/ECN counters, "
            "explain what limits the path with evidence, and plan, apply and roll back TCP, DSCP "
            "and NCCL settings. `wanprobe demo` shows the whole story on a built-in emulated WAN "
            "lab."
        ),
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """wanprobe: WAN path measurement and tuning for distributed training."""


def build(modules: tuple[str, ...] = COMMAND_MODULES) -> typer.Typer:
    """The application with the commands of ``modules`` (default: all of them)."""
    new = _new_app()
    new.callback()(_root)
    for name in modules:
        new.add_typer(importlib.import_module(f"wanprobe.commands.{name}").app)
    return new


@functools.cache
def _full() -> typer.Typer:
    return build()


def __getattr__(name: str) -> Any:
    """``cli.app``: the whole application, built on first use (what tests invoke)."""
    if name == "app":
        return _full()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def command(argv: list[str] | None = None) -> click.Command:
    """The click command tree: the whole of it, or given a command line, only the command it
    names, whose module alone is imported (a start costs ~0.25 s, not ~0.35 s: the other 13
    modules' imports are not paid). Anything else (no command, ``--help``, an unknown word) gets
    the whole tree, so help and "no such command" list every command."""
    words = [a for a in argv or () if not a.startswith("-")]
    module = COMMANDS.get(words[0]) if words else None
    return typer.main.get_command(build((module,)) if module else _full())


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    command(sys.argv[1:] if argv is None else argv).main(args=argv, prog_name="wanprobe")
