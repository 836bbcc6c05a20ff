"""The background tasks of one follow component (the run cache, the run history).

Each is spawned guarded — a failure is logged with what it was doing, never lost silently — and
all are cancelled together when the component closes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any


class TaskSet:
    """A set of running tasks: :meth:`spawn` guarded ones, :meth:`cancel_all` at close."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._tasks: set[asyncio.Task[Any]] = set()

    def add(self, task: asyncio.Task[Any]) -> None:
        """Keep ``task`` (cancelled by :meth:`cancel_all`) until it is discarded."""
        self._tasks.add(task)

    def discard(self, task: asyncio.Task[Any]) -> None:
        """Forget ``task`` (it has ended)."""
        self._tasks.discard(task)

    def spawn(self, coro: Awaitable[Any], what: str) -> asyncio.Task[Any]:
        """Run ``coro`` in the background; an exception is logged as ``<what> failed``."""

        async def guarded() -> Any:
            try:
                return await coro
            except asyncio.CancelledError:
                raise
            except Exception:
                self._logger.exception("%s failed", what)
                return None

        task = asyncio.get_running_loop().create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def cancel_all(self) -> None:
        """Cancel every task still running and wait for them to end."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
