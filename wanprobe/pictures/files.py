"""The HTML files of the CLI (``report show --format html``, ``history --format html``): drawn,
checked against the size limit, written atomically (or to stdout without ``-o``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from wanprobe.atomic_file import atomic_write
from wanprobe.errors import ConfigError, WanprobeError
from wanprobe.pictures import assets
from wanprobe.report.document import Report

MAX_FILE_BYTES = 5 * 2**20   # an attachment a ticket system takes; a file opens offline


def write(text: str, output: Path | None) -> None:
    """``text`` to ``output`` atomically (mode 0644: a file meant to be shared), or stdout."""
    if output is None:
        sys.stdout.write(text)
        return
    try:
        atomic_write(output, text, mode=0o644)
    except OSError as exc:
        raise ConfigError(f"cannot write {output}: {exc.strerror or exc}") from None


def checked_html(text: str) -> str:
    size = len(text.encode())
    if size > MAX_FILE_BYTES:  # bounded by construction; a bug must not ship a 50 MB page
        raise WanprobeError(f"the page would be {size / 2**20:.1f} MiB, over the 5 MiB limit")
    return text


def emit_report(report: Report, fmt: str, output: Path | None) -> None:
    """``report show`` with ``--format html`` or ``-o``."""
    if fmt == "html":
        from wanprobe.pictures.report_html import report_page

        write(checked_html(report_page(report).render(assets.load())), output)
    elif fmt == "json":
        write(json.dumps(report.to_json(), indent=2) + "\n", output)
    else:
        from wanprobe.report.render_md import render_markdown

        write(render_markdown(report) + "\n", output)


def emit_history(db_path: Path, peer: str, *, window_s: float, state_dir: Path,
                 output: Path | None) -> None:
    """``history PEER --format html``."""
    from wanprobe.pictures.peer_html import history_page

    page = history_page(db_path, peer, window_s=window_s, state_dir=state_dir)
    write(checked_html(page.render(assets.load())), output)
