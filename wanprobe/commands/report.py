"""CLI commands: ``wanprobe report schema|show|ls`` — the versioned diagnose report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from wanprobe.errors import UsageError
from wanprobe.safe_text import SafeConsole, clean

FORMATS = ("rich", "markdown", "json", "html")


app = typer.Typer(name="report", help="The diagnose report: its JSON Schema, rendering, listing.",
                  no_args_is_help=True)

@app.command("schema")
def schema() -> None:
    """Print the report's JSON Schema (draft 2020-12)."""
    from wanprobe.report.document import schema as load_schema

    typer.echo(json.dumps(load_schema(), indent=2))

@app.command("show")
def show(
    file: Annotated[Path, typer.Argument(help="A report written by `wanprobe diagnose -o`.")],
    fmt: Annotated[str, typer.Option("--format", help="rich, markdown, json or html (one "
                                     "self-contained file with charts).")] = "rich",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file "
                                                "instead of stdout (markdown, json, html).")] = None,
    limit: Annotated[int, typer.Option("--limit", min=0, help="Show the first N findings and "
                                       "count the rest (0: all; json has all).")] = 50,
) -> None:
    """Render a saved report (markdown for pasting into a ticket, html to attach to one)."""
    from wanprobe.report.document import load, load_first
    from wanprobe.report.render_md import render_markdown
    from wanprobe.report.render_rich import render_rich

    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r} (use {', '.join(FORMATS)})")
    if output is not None and fmt == "rich":
        raise UsageError("-o needs --format markdown, json or html (rich is for the terminal)")
    if fmt == "json":
        text = json.dumps(load(file).to_json(), indent=2)
        if output is None:
            typer.echo(text)
        else:
            from wanprobe.pictures.files import write

            write(text + "\n", output)
        return
    report, total = load_first(file, limit or None)
    if fmt == "html" or output is not None:
        from wanprobe.pictures.files import emit_report

        emit_report(report, fmt, output, total)
    elif fmt == "markdown":
        typer.echo(render_markdown(report, total))
    else:
        render_rich(report, SafeConsole(highlight=False), total)

@app.command("ls")
def ls(
    directory: Annotated[Path, typer.Argument(help="Directory holding report files.")] = Path("."),
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """List the reports in a directory, newest first, with their top finding."""
    from wanprobe.report.store import list_reports

    entries = list_reports(directory)
    if as_json:
        typer.echo(json.dumps([e.to_json() for e in entries], indent=2))
        return
    table = Table("created", "peer", "findings", "top finding", "file")
    for e in entries:  # file contents are data: Text, never markup
        table.add_row(*(Text(clean(v)) for v in (e.created_at, e.peer, e.findings)),
                      Text(clean(e.top_finding)) if e.top_finding else
                      Text(clean(e.error), style="red") if e.error else "-", Text(clean(e.path)))
    SafeConsole(highlight=False).print(table)
