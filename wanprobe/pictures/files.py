"""The HTML files of the CLI (``report show --format html``, ``history --format html``): drawn,
checked against the size limit, written atomically (or to stdout without ``-o``)."""

from __future__ import annotations

import sys
from pathlib import Path

from wanprobe.atomic_file import write_error, write_output
from wanprobe.errors import WanprobeError
from wanprobe.pictures import assets
from wanprobe.report.document import Report

MAX_FILE_BYTES = 5 * 2**20   # an attachment a ticket system takes; a file opens offline


def write(text: str, output: Path | None) -> None:
    """``text`` to ``output`` under the output policy (atomic_file: a regular file replaced
    atomically, mode 0644 as a file meant to be shared; a FIFO or /dev/null written in place; ``-``
    stdout), or stdout."""
    if output is None:
        sys.stdout.write(text)
        return
    try:
        write_output(output, text, mode=0o644)
    except OSError as exc:
        raise write_error(exc, f"--output {output}") from None


def checked_html(text: str) -> str:
    size = len(text.encode())
    if size > MAX_FILE_BYTES:  # bounded by construction; a bug must not ship a 50 MB page
        raise WanprobeError(f"the page would be {size / 2**20:.1f} MiB, over the 5 MiB limit")
    return text


def emit_report(report: Report, fmt: str, output: Path | None,
                total_findings: int | None = None) -> None:
    """``report show`` with ``--format html`` or ``-o`` (markdown or html; ``total_findings``:
    how many the report holds when ``report`` carries only the first ones)."""
    if fmt == "html":
        from wanprobe.pictures.report_html import report_page

        page = report_page(report, total_findings)
        write(checked_html(page.render(assets.load())), output)
    else:
        from wanprobe.report.render_md import render_markdown

        write(render_markdown(report, total_findings) + "\n", output)


def emit_history(db_path: Path, peer: str, *, window_s: float, state_dir: Path,
                 output: Path | None) -> None:
    """``history PEER --format html``."""
    from wanprobe.pictures.peer_html import history_page

    page = history_page(db_path, peer, window_s=window_s, state_dir=state_dir)
    write(checked_html(page.render(assets.load())), output)
