"""One informer: list, then watch from the list's resourceVersion, for ever.

A watch that fails is retried with exponential backoff (capped by ``follow.backoff_max_seconds``); a
410 Gone re-lists at once; a watch that the server ends at once is not retried in a busy loop. While
the watch is down, ``set_synced(False)`` tells the cache to read directly instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from proxy.errors import KubeError
from proxy.follow.runinfo import resource_version

_LOGGER = logging.getLogger(__name__)

Obj = dict[str, Any]


async def inform(
    what: str,
    list_fn: Callable[[str], Awaitable[tuple[list[Obj], str]]],
    watch_fn: Callable[[str, str, int], AsyncIterator[tuple[str, Obj]]],
    replace: Callable[[list[Obj]], None],
    apply: Callable[[str, Obj], None],
    set_synced: Callable[[bool], None],
    *,
    selector: str,
    watch_timeout: int,
    backoff: tuple[float, float],
    closed: Callable[[], bool],
) -> None:
    """List, then watch from the list's resourceVersion, until ``closed()`` (see the module doc)."""
    first, most = backoff
    wait = first
    while not closed():
        try:
            items, rv = await list_fn(selector)
            replace(items)
            set_synced(True)
            while True:
                began, events = time.monotonic(), 0
                async for change, obj in watch_fn(selector, rv, watch_timeout):
                    events += 1
                    rv = resource_version(obj) or rv
                    if change != "BOOKMARK":
                        apply(change, obj)
                wait = first
                if events == 0 and time.monotonic() - began < 1.0:
                    await asyncio.sleep(first)  # a server ending at once
        except KubeError as e:
            set_synced(False)
            if e.k8s_status == 410:
                _LOGGER.info("watch of %s expired (410): listing again", what)
                continue
            _LOGGER.warning("watch of %s failed, again in %.1f s: %s", what, wait, e)
            await asyncio.sleep(wait)
            wait = min(wait * 2, most)
