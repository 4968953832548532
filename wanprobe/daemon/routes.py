"""Every route of the daemon's listener beyond ``/metrics`` and ``/healthz``: the read-only page
(pictures/routes.py) and ``/api/sessions``, the probe sessions ``wanprobe job explain
--daemon URL`` joins a job's steps with.

``GET /api/sessions?since=UNIX_S&until=UNIX_S[&peer=NAME]`` answers ``{"sessions": [{"ts",
"peer", "sent", "lost_forward", "lost_reverse", "rtt_min_ms", "rtt_p50_ms"}, ...]}`` from the
history store, oldest first: at most ``MAX_SPAN_S`` of history and ``MAX_ROWS`` rows (a longer
answer says ``"truncated": true``). A request is parsed strictly (anything else is one 400 line),
read in a worker thread, and served behind the listener's own TLS and basic auth.
"""

from __future__ import annotations

import json
import math
import urllib.parse
from typing import Any

from wanprobe.blocking import run_blocking
from wanprobe.httpd.server import BoundedHttpServer, Request, Response
from wanprobe.job.path_events import sessions_of
from wanprobe.pictures.routes import DaemonPages

MAX_SPAN_S = 7 * 86400.0
MAX_ROWS = 100_000
MAX_QUERY_CHARS = 1024
JSON = "application/json"


def install(daemon: Any, http: BoundedHttpServer) -> None:
    DaemonPages(daemon).install(http)
    http.route("/api/sessions", lambda request: sessions(daemon, request))


def _bad(status: int, message: str) -> Response:
    return Response(status, (json.dumps({"error": message}) + "\n").encode(), JSON,
                    (("X-Content-Type-Options", "nosniff"),))


def parse(query: str) -> tuple[float, float, str | None]:
    """(since, until, peer) of a query string; ValueError with the reason."""
    if len(query) > MAX_QUERY_CHARS:
        raise ValueError("query too long")
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query),
                                   errors="strict", max_num_fields=3)
    seen: dict[str, str] = {}
    for k, v in pairs:
        if k not in ("since", "until", "peer") or k in seen:
            raise ValueError(f"unknown or repeated parameter {k[:40]!r} (since, until, peer)")
        seen[k] = v
    try:
        since, until = float(seen["since"]), float(seen["until"])
    except (KeyError, ValueError):
        raise ValueError("since and until are needed, as unix seconds") from None
    if not (math.isfinite(since) and math.isfinite(until)) or not 0 <= since <= until \
            or until - since > MAX_SPAN_S:
        raise ValueError(f"since <= until, at most {MAX_SPAN_S / 86400:g} days apart")
    return since, until, seen.get("peer") or None


def _rows(store: Any, since: float, until: float, peer: str | None) -> dict[str, Any]:
    got = sessions_of(store.probes(peer, since=since), until)
    return {"sessions": [s.to_json() for s in got[:MAX_ROWS]], "truncated": len(got) > MAX_ROWS}


async def sessions(daemon: Any, request: Request) -> Response:
    try:
        since, until, peer = parse(request.query)
    except (ValueError, UnicodeDecodeError) as exc:
        return _bad(400, str(exc))
    if daemon.store is None:
        return _bad(503, "the history store is not open yet")
    doc = await run_blocking(_rows, daemon.store, since, until, peer)
    return Response(200, json.dumps(doc).encode(), JSON, (("X-Content-Type-Options", "nosniff"),))
