"""Command-line options that several commands declare alike: one ``Annotated`` type each, so the
name and help text of, say, ``--json`` or ``--hmac-key-file`` are written once and a command's
signature reads one line per option. Defaults stay in the signatures that use them."""

from __future__ import annotations

from typing import Annotated

import typer

# --json: the machine-readable output of a command (conventions §9)
JsonDocument = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]
JsonObject = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]

# --hmac-key-file: the shared key of authenticated STAMP (RFC 8762 §4.4), read by
# userfiles.read_hmac_key_file
StampKeyFile = Annotated[str | None, typer.Option(
    "--hmac-key-file", help="Authenticated STAMP (RFC 8762 §4.4): read the shared key from "
    "this file (>= 16 characters).")]
ReflectorKeyFile = Annotated[str | None, typer.Option(
    "--hmac-key-file", help="The reflector's shared key (file, >= 16 characters): "
    "authenticated STAMP and throughput tests.")]

# --timeout of a prober waiting for each reply
ReplyTimeout = Annotated[str, typer.Option("--timeout", help="A reply later than this is lost.")]
