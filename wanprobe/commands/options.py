"""Command-line options that several commands declare alike: one ``Annotated`` type each, so the
name and help text of, say, ``--json`` or ``--hmac-key-file`` are written once and a command's
signature reads one line per option. Defaults stay in the signatures that use them."""

from __future__ import annotations

from typing import Annotated

import typer

# --json: the machine-readable output of a command (conventions §9)
JsonDocument = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]
JsonObject = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]

# --hmac-key-file: the one key a reflector holds for both of its services, authenticated STAMP
# (RFC 8762 §4.4) and the throughput server's challenge-response; read by
# userfiles.read_hmac_key_file. probe, paths, mtu, throughput and tune apply --verify take it.
ReflectorKeyFile = Annotated[str | None, typer.Option(
    "--hmac-key-file", help="The reflector's shared key (file, >= 16 characters): "
    "authenticated STAMP (RFC 8762 §4.4) and throughput tests. Without it a keyed reflector "
    "drops every probe unanswered.")]

# --netns: run the command's sockets in a named network namespace (``ip netns`` layout). Entered
# with setns(2) by tuners.netns.enter, as ``tune --netns`` always did; see enter_netns.
Netns = Annotated[str | None, typer.Option(
    "--netns", help="Run inside this named network namespace (`ip netns list`; needs root).")]

# --timeout of a prober waiting for each reply
ReplyTimeout = Annotated[str, typer.Option("--timeout", help="A reply later than this is lost.")]


def enter_netns(name: str | None) -> None:
    """Move this process into network namespace ``name`` (None: stay). Called first thing in a
    command, before any socket, thread or worker process exists: setns(2) moves the calling
    thread only, and what it creates afterwards (asyncio's resolver threads, the throughput
    workers, an iperf3 child) is born inside (namespaces(7)). A bad or missing name is one line,
    exit 2 (``--netns ""`` too: it never silently means "here"); no permission is exit 4."""
    if name is None:
        return
    from tuners.netns import enter

    enter(name)


def http_url(option: str, url: str) -> str:
    """``url`` when it is an http(s) URL (Prometheus, a daemon's listener), else one line."""
    if not url.startswith(("http://", "https://")):
        from wanprobe.errors import UsageError, shown

        raise UsageError(f"{option}: {shown(url)} is not an http(s) URL")
    return url
