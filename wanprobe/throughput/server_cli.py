"""``python -m wanprobe.throughput.server_cli``: a throughput server alone (tests, benches)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from wanprobe.throughput.server import DEFAULT_MAX_BYTES, DEFAULT_MAX_DURATION_S, ThroughputServer


def main(argv: list[str] | None = None) -> None:
    """``python -m wanprobe.throughput.server_cli --bind A --port N`` (tests and ad-hoc use)."""
    parser = argparse.ArgumentParser(description="wanprobe throughput server (no STAMP reflector)")
    parser.add_argument("--bind", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=862)
    parser.add_argument("--max-duration", type=float, default=DEFAULT_MAX_DURATION_S)
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    args = parser.parse_args(argv)

    async def serve() -> None:
        server = ThroughputServer(max_duration_s=args.max_duration, max_bytes=args.max_bytes)
        await server.start(args.bind, args.port, udp=True)
        print(f"listening on {args.bind} port {server.port}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
