"""Serve the stand-in oms in a process of its own: ``python -m standins.serve_oms``.

For benchmarks and tests that want oms outside the proxy's process. Once bound it prints one line,
``listening on http://HOST:PORT``, to stdout (``--port 0`` picks a free port), then serves until
SIGTERM/SIGINT or ``--max-seconds`` (a safety net so a forgotten server never lingers).

The stand-in's per-request log (``FakeOms.requests``) is not kept here: a benchmark sends
millions of requests. One extra route plays an oms that reads uploads slowly:
``/bench/upload-slow/<bytes per second>`` takes a body like ``/test/upload`` but reads it no
faster than that rate, so a proxy in front of it has to hold the client back.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import socket
import sys
import time
from collections.abc import Sequence

from aiohttp import web

from standins import run_until_stopped
from standins.oms import FakeOms

_READ = 64 * 1024


class _Unrecorded(list[tuple[str, str, dict[str, str]]]):
    """A request log that keeps nothing."""

    def append(self, item: tuple[str, str, dict[str, str]], /) -> None:
        return None


async def _upload_slow(request: web.Request) -> web.Response:
    rate = int(request.match_info["rate"])
    h = hashlib.sha256()
    n = 0
    start = time.monotonic()
    while True:
        data = await request.content.read(_READ)
        if not data:
            break
        h.update(data)
        n += len(data)
        ahead = n / rate - (time.monotonic() - start)
        if ahead > 0:
            await asyncio.sleep(ahead)
    return web.json_response({"body_len": n, "body_sha256": h.hexdigest()})


def make_app() -> web.Application:
    """The stand-in oms app, without request recording, plus the slow-upload route."""
    fake = FakeOms()
    fake.requests = _Unrecorded()
    fake.app.router.add_route("*", "/bench/upload-slow/{rate:[0-9]+}", _upload_slow)
    return fake.app


async def _serve(host: str, port: int, max_seconds: float) -> None:
    runner = web.AppRunner(make_app(), access_log=None, handle_signals=False)
    await runner.setup()
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    site = web.SockSite(runner, sock)
    await site.start()
    sys.stdout.write(f"listening on http://{host}:{bound}\n")
    sys.stdout.flush()
    await run_until_stopped(runner, max_seconds)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the flags and serve."""
    p = argparse.ArgumentParser(prog="python -m standins.serve_oms", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="listen port (0: any free port)")
    p.add_argument(
        "--max-seconds", type=float, default=3600.0, help="exit after this long (default 3600)"
    )
    args = p.parse_args(argv)
    asyncio.run(_serve(args.host, args.port, args.max_seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
