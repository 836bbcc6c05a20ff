"""The HTTP conformance tables, sent through nginx as the reference reverse proxy.

    .venv/bin/python bench/conformance_nginx.py

Every case of ``tests/test_http_conformance.py`` (oms side and client side) is played again with
nginx (one process, streaming both ways, HTTP/1.1 and keep-alive to the scripted oms: the
configuration ``bench/passthrough.py`` measures) in the proxy's place. Printed: each case where
nginx's answer differs from the proxy's expected one, and the count of the same. Needs nginx;
the tests do not.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import _common as c  # the sibling module (this script's directory is on sys.path)

sys.path.insert(0, str(c.REPO))

from tests import test_http_conformance as t

R = TypeVar("R")


async def _through_nginx(
    answers: list[t.Answer], work: Path, play: Callable[[t.ScriptedOms, int], Awaitable[R]]
) -> R:
    oms = await t.ScriptedOms(answers).start()
    nginx = c.start_nginx(oms.url, work, probe=False)
    assert nginx is not None
    try:
        port = int(nginx.url.rsplit(":", 1)[1])
        await _wait_port(port)
        return await play(oms, port)
    finally:
        nginx.stop()
        await oms.close()


async def _wait_port(port: int) -> None:
    for _ in range(200):
        try:
            _, writer = await asyncio.open_connection(c.LOOPBACK, port)
        except OSError:
            await asyncio.sleep(0.02)
            continue
        writer.close()
        return
    raise RuntimeError(f"nginx did not listen on port {port}")


def _finals(got: t.Exchange) -> list[int]:
    return [a.status for a in got.answers if a.status >= 200]


async def _oms_side(case: t.OmsCase, _oms: t.ScriptedOms, port: int) -> t.Exchange:
    method = case.request.split(b" ", 1)[0].decode()
    return await t.exchange(
        port, case.request, [method], answers=1, wait_close=bool(case.closed), seconds=3
    )


async def _client_side(case: t.ClientCase, oms: t.ScriptedOms, port: int) -> tuple[list[int], int]:
    got = await t.exchange(
        port,
        case.sent,
        case.methods or ["GET"] * len(case.statuses),
        answers=len(case.statuses),
        wait_close=bool(case.closed),
        seconds=3,
    )
    return _finals(got), len(oms.requests)


async def main() -> int:
    if c.nginx_path() is None:
        print("nginx is not installed")
        return 1
    same, rows = 0, []
    with c.workdir("oms-conformance-") as work:
        for case in t.OMS_CASES:
            got = await _through_nginx([case.answer], work, functools.partial(_oms_side, case))
            nginx: Any = _finals(got)
            if not nginx:  # no final answer: what nginx sent instead
                relayed = [a.status_line.decode("latin-1") for a in got.answers]
                nginx = f"relayed {relayed}" if relayed else f"sent {got.rest[:24]!r}"
                if got.closed and got.rest.startswith(b"HTTP/1.1 200"):
                    nginx = "cut"
            ours: Any = "cut" if case.cut else [case.status]
            if nginx == ours:
                same += 1
            else:
                rows.append(f"oms    {case.name:40} proxy {ours!s:12} nginx {nginx}")
        for ccase in t.CLIENT_CASES:
            play = functools.partial(_client_side, ccase)
            statuses, sent = await _through_nginx([t.OK_ANSWER], work, play)
            if statuses == ccase.statuses and sent == ccase.oms:
                same += 1
            else:
                rows.append(
                    f"client {ccase.name:40} proxy {ccase.statuses!s:12} nginx {statuses} "
                    f"(to oms: proxy {ccase.oms}, nginx {sent})"
                )
    total = len(t.OMS_CASES) + len(t.CLIENT_CASES)
    print(f"{same} of {total} cases: nginx answers as the proxy does. The others:")
    for row in rows:
        print("  " + row)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
