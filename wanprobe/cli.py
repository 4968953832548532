"""The typer application: the composition root for commands. Each command group lives in
``wanprobe/commands/<name>.py`` and exposes ``register(app)``; this file only wires them and turns
errors into one red line on stderr and a non-zero exit code."""

from __future__ import annotations

import importlib
import sys

import typer
from rich.console import Console

from wanprobe import __version__
from wanprobe.errors import WanprobeError

try:  # typer >= 0.20 vendors its own click fork (and no longer installs click)
    from typer._click import exceptions as _click_exc
except ImportError:  # pragma: no cover - older typer on plain click
    from click import exceptions as _click_exc

_NO_ARGS = getattr(_click_exc, "NoArgsIsHelpError", ())

COMMAND_MODULES = (
    "lab", "demo", "probe", "throughput", "counters", "diagnose", "tune", "nccl",
    "report", "impact", "daemon", "fleet", "paths",
)

app = typer.Typer(
    name="wanprobe",
    help=(
        "Measure, diagnose and tune datacenter-to-datacenter links for distributed AI training.\n\n"
        "Probe RTT, loss and throughput (STAMP, ICMP, TCP), read NIC/RoCE/PFC/ECN counters, "
        "explain what limits the path with evidence, and plan, apply and roll back TCP, DSCP and "
        "NCCL settings. `wanprobe demo` shows the whole story on a built-in emulated WAN lab."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"wanprobe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """wanprobe: WAN path measurement and tuning for distributed training."""


for _name in COMMAND_MODULES:
    importlib.import_module(f"wanprobe.commands.{_name}").register(app)


def fail(message: str, code: int = 1) -> None:
    """Print one error line to stderr and exit with ``code``."""
    err_console.print(f"[bold red]wanprobe: error:[/] {' '.join(str(message).split())}", markup=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=argv, prog_name="wanprobe", standalone_mode=False)
    except WanprobeError as exc:
        fail(str(exc), exc.exit_code)
    except typer.Abort:
        fail("aborted", 130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except _NO_ARGS as exc:
        typer.echo(exc.ctx.get_help() if getattr(exc, "ctx", None) else exc.format_message())
        sys.exit(0)
    except _click_exc.ClickException as exc:
        fail(exc.format_message(), exc.exit_code)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except BrokenPipeError:
        sys.exit(0)
    sys.exit(rv if isinstance(rv, int) else 0)
