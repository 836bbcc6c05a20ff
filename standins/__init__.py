"""Stand-ins for oms and the Kubernetes API that speak the real wire protocols."""

from __future__ import annotations

import asyncio
import signal

from aiohttp import web


async def run_until_stopped(runner: web.AppRunner, max_seconds: float) -> None:
    """Keep ``runner`` serving until SIGTERM/SIGINT or ``max_seconds``, then clean it up.

    The ``serve_*`` runners use this, so a benchmark's stand-in process always ends by itself.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await asyncio.wait_for(stop.wait(), max_seconds)
    except TimeoutError:
        pass
    finally:
        await runner.cleanup()
