"""List the reports saved in a directory (newest first), skipping files that are not reports."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wanprobe.errors import ConfigError
from wanprobe.report.document import load
from wanprobe.userfiles import read_json


@dataclass(frozen=True)
class ReportEntry:
    """One line of ``report ls``: the file and the report's headline."""

    path: str
    id: str
    created_at: str
    peer: str
    top_finding: str | None
    findings: int
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "id": self.id, "created_at": self.created_at,
                "peer": self.peer, "top_finding": self.top_finding, "findings": self.findings,
                "error": self.error}


def list_reports(directory: str | Path) -> list[ReportEntry]:
    """Every ``*.json`` report in ``directory``; other JSON files are listed with their error."""
    d = Path(directory)
    if not d.is_dir():
        raise ConfigError(f"report directory {d}: not a directory")
    out = []
    for p in sorted(d.glob("*.json")):
        try:
            r = load(p)
        except ConfigError as exc:
            try:  # JSON that is plainly not a report (a plan, a journal) is left out
                data = read_json(p, "report")
                if not (isinstance(data, dict) and "schema_version" in data):
                    continue
            except ConfigError:
                pass
            out.append(ReportEntry(str(p), "", "", "", None, 0, error=str(exc)))
            continue
        top = r.top
        out.append(ReportEntry(str(p), r.id, r.created_at, str(r.peer.get("address", "")),
                               f"{top.severity}: {top.id}" if top else None, len(r.findings)))
    return sorted(out, key=lambda e: e.created_at, reverse=True)
