"""Log lines for journald and for humans: one event per line on stdout.

``journal`` format prefixes each line with the syslog priority in angle brackets (``<3>`` error,
``<4>`` warning, ``<6>`` info, ``<7>`` debug), which journald strips and stores as PRIORITY
(sd-daemon(3), SyslogLevelPrefix=yes is systemd's default). ``logfmt`` writes
``ts=... level=... msg=...``. Both append the event's fields as ``key=value``.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

from wanprobe.safe_text import clean

LOGGER_NAME = "wanprobe.daemon"
_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6,
             logging.DEBUG: 7}


def _value(v: Any) -> str:
    s = clean(" ".join(str(v).split()))  # a peer's or a file's text never carries escapes
    if s == "" or any(c in s for c in ' ="'):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return s


def format_fields(fields: dict[str, Any]) -> str:
    """``{"peer": "tokyo-1", "rtt_ms": 35.2}`` → ``peer=tokyo-1 rtt_ms=35.2``."""
    return " ".join(f"{k}={_value(v)}" for k, v in fields.items() if v is not None)


class LineFormatter(logging.Formatter):
    """One line per record in ``journal`` or ``logfmt`` style (see module docstring)."""

    def __init__(self, style: str = "journal") -> None:
        super().__init__()
        self.style_name = style

    def format(self, record: logging.LogRecord) -> str:
        msg = clean(" ".join(record.getMessage().split()))
        fields = getattr(record, "fields", None) or {}
        if record.exc_info and record.exc_info[1] is not None:
            fields = {**fields, "exc": f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"}
        tail = format_fields(fields)
        if self.style_name == "journal":
            prio = _PRIORITY.get(record.levelno, 6)
            return f"<{prio}>{msg}" + (f" {tail}" if tail else "")
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        head = f"ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} msg={_value(msg)}"
        return head + (f" {tail}" if tail else "")


def setup(style: str = "journal", *, stream: TextIO | None = None,
          level: int = logging.INFO) -> logging.Logger:
    """Route the daemon logger to ``stream`` (stdout) with one handler, line-buffered."""
    logger = logging.getLogger(LOGGER_NAME)
    for h in list(logger.handlers):
        logger.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(LineFormatter(style))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return logger


def set_style(style: str) -> None:
    for h in logging.getLogger(LOGGER_NAME).handlers:
        if isinstance(h.formatter, LineFormatter):
            h.formatter.style_name = style


def log(level: int, msg: str, **fields: Any) -> None:
    """Log ``msg`` with structured ``fields`` on the daemon logger."""
    logging.getLogger(LOGGER_NAME).log(level, msg, extra={"fields": fields})
