"""A TCP server in a child process left with one free file descriptor, then flooded: what it
writes to stderr while accept(2) fails with EMFILE (issue 19: a traceback per failure)."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

CHILD = """
import asyncio, os, resource
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
async def main():
{start}
    spent = []  # the rest of the process holds all but one descriptor
    while True:
        try:
            spent.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            break
    os.close(spent.pop())
    print(port, flush=True)
    await asyncio.sleep(2)
asyncio.run(main())
"""


def flooded_stderr(start: str, connections: int = 100) -> str:
    """Run the server ``start`` makes (async code binding ``port``) starved of descriptors,
    open ``connections`` to it, and return what the child wrote to stderr."""
    code = CHILD.format(start=textwrap.indent(textwrap.dedent(start).strip(), "    "))
    p = subprocess.Popen([sys.executable, "-c", code], text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    flood = []
    try:
        port = int(p.stdout.readline())
        for _ in range(connections):
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        return p.communicate(timeout=30)[1]
    finally:
        p.kill()
        p.wait(10)
        for s in flood:
            s.close()
