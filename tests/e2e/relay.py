"""A TCP relay on loopback between one proxy and the API server, to cut or hold its connections.

The bytes are TLS end to end (the relay never sees a request); it only forwards them. ``cut()``
closes every open connection, as a network blip or an API server restart does, so that the
proxy's watches reconnect from the resourceVersion they last saw. ``hold()`` stops forwarding
what the API server sends on the connections open at that moment (the proxy's watches then see
nothing new) until ``release()``; new connections go through.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Future
from typing import Any

_CHUNK = 64 * 1024


class _Pipe:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer


class Relay:
    """Forward ``127.0.0.1:<port>`` to ``target_host:target_port`` in a thread of its own."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._open: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._held: dict[asyncio.StreamWriter, asyncio.Event] = {}
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.port = self._run(self._start())

    def _run(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(30)

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        self.connections += 1
        pair = (client_w, server_w)
        self._open.add(pair)
        gate = asyncio.Event()
        gate.set()
        self._held[client_w] = gate
        try:
            await asyncio.gather(
                self._pump(client_r, server_w, None), self._pump(server_r, client_w, gate)
            )
        finally:
            self._open.discard(pair)
            self._held.pop(client_w, None)
            for w in pair:
                w.close()

    @staticmethod
    async def _pump(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gate: asyncio.Event | None
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(_CHUNK):
                if gate is not None:
                    await gate.wait()
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            writer.close()

    async def _cut(self) -> int:
        pairs = list(self._open)
        for pair in pairs:
            for w in pair:
                w.transport.abort()
        return len(pairs)

    def cut(self) -> int:
        """Close every open connection now; returns how many there were."""
        count: int = self._run(self._cut())
        return count

    async def _hold(self) -> int:
        for gate in self._held.values():
            gate.clear()
        return len(self._held)

    def hold(self) -> int:
        """Stop forwarding the server's bytes on the connections open now; how many."""
        count: int = self._run(self._hold())
        return count

    async def _release(self) -> None:
        for gate in self._held.values():
            gate.set()

    def release(self) -> None:
        """Forward everything held, and go on as usual."""
        self._run(self._release())

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._cut()

    def close(self) -> None:
        """Stop the relay and its thread."""
        with contextlib.suppress(Exception):
            self._run(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
