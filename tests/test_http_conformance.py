"""HTTP/1.1 conformance of the pass-through, byte for byte, as a table of cases (RFC 9110/9112).

Every case runs the real proxy (``create_app`` served by :func:`proxy.app.start_site`, the
serving stack of ``serve``) between two raw sockets: a scripted oms that records the bytes it
receives and answers bytes of the case, and a raw client that sends bytes of the case and parses
what comes back. Reference behaviour: the RFCs, and nginx 1.22 as a reverse proxy where they leave
a choice (the README's "HTTP conformance" section lists the few differences on purpose).

- ``OMS_CASES``: a plain request from the client; oms answers something unusual or hostile.
- ``CLIENT_CASES``: the client sends something unusual or hostile; oms answers plainly.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from proxy.app import create_app, start_site
from tests.conftest import make_config

# --- the two raw sockets ------------------------------------------------------------------


@dataclasses.dataclass
class Answer:
    """What the scripted oms does with one request: send ``data``, then maybe close."""

    data: bytes
    close: bool = False  # close the connection after sending (else keep it for the next request)
    then_wait: float = 0.0  # stay silent this long after sending, then close


OK_ANSWER = Answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok")


class ScriptedOms:
    """A loopback oms on raw sockets: records each request's bytes, answers them in order.

    Requests are read as RFC 9112 frames them (Content-Length or chunked); ``answers`` are used
    one per request, the last one again when they run out.
    """

    def __init__(self, answers: list[Answer]) -> None:
        self.answers = answers
        self.requests: list[bytes] = []  # head and body of each request, as received
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.url = ""

    async def start(self) -> ScriptedOms:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                self.requests.append(request)
                index = min(len(self.requests), len(self.answers)) - 1
                answer = self.answers[index]
                writer.write(answer.data)
                await writer.drain()
                if answer.then_wait:
                    await asyncio.sleep(answer.then_wait)
                if answer.close or answer.then_wait:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()
            self._tasks.discard(task)


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request as framed by RFC 9112 §6.3 (head, then Content-Length or chunked body)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")[1:]
    fields = [line.partition(":") for line in lines if line]
    names = {name.strip().lower(): value.strip() for name, _, value in fields}
    if "chunked" in names.get("transfer-encoding", "").lower():
        body = b""
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            body += size_line + await reader.readexactly(size + 2)
            if size == 0:
                return head + body
    length = int(names.get("content-length", "0"))
    return head + await reader.readexactly(length)


@dataclasses.dataclass
class Received:
    """One answer as the raw client parsed it."""

    status_line: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes

    @property
    def status(self) -> int:
        return int(self.status_line.split(b" ")[1])

    def header(self, name: str) -> list[bytes]:
        return [v for k, v in self.headers if k.lower() == name.lower().encode()]


@dataclasses.dataclass
class Exchange:
    """Everything the raw client got: the answers in order, and whether the proxy closed."""

    answers: list[Received]
    closed: bool
    rest: bytes  # bytes after the last whole answer (a cut body, for one)

    @property
    def statuses(self) -> list[int]:
        return [a.status for a in self.answers]


def parse_answers(data: bytes, methods: list[str], *, at_eof: bool) -> tuple[list[Received], bytes]:
    """Split ``data`` into answers (RFC 9112 §6.3); ``methods``: the requests', in order."""
    out: list[Received] = []
    methods = list(methods)
    while True:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return out, data
        head, rest = data[:end], data[end + 4 :]
        status_line, *lines = head.split(b"\r\n")
        headers = [(k.strip(), v.strip()) for k, _, v in (ln.partition(b":") for ln in lines)]
        status = int(status_line.split(b" ")[1])
        got = Received(status_line, headers, b"")
        if 100 <= status < 200:
            out.append(got)
            data = rest
            continue
        method = methods.pop(0) if methods else "GET"
        lengths = got.header("Content-Length")
        chunked = any(b"chunked" in v.lower() for v in got.header("Transfer-Encoding"))
        if method == "HEAD" or status in (204, 304):
            body = b""
        elif chunked:
            body, pos = b"", 0
            while True:
                line_end = rest.find(b"\r\n", pos)
                if line_end < 0:
                    return out, data
                size = int(rest[pos:line_end].split(b";")[0], 16)
                if size == 0:
                    trailer_end = rest.find(b"\r\n\r\n", line_end)
                    if trailer_end < 0 and not rest[line_end:].startswith(b"\r\n\r\n"):
                        return out, data
                    rest = rest[rest.find(b"\r\n\r\n", line_end) + 4 :]
                    break
                if len(rest) < line_end + 2 + size + 2:
                    return out, data
                body += rest[line_end + 2 : line_end + 2 + size]
                pos = line_end + 2 + size + 2
        elif lengths:
            size = int(lengths[0])
            if len(rest) < size:
                return out, data
            body, rest = rest[:size], rest[size:]
        else:  # delimited by the end of the connection
            if not at_eof:
                return out, data
            body, rest = rest, b""
        got.body = body
        out.append(got)
        data = rest


async def exchange(
    port: int,
    sent: bytes | list[bytes],
    methods: list[str],
    *,
    answers: int,
    wait_close: bool = False,
    seconds: float = 5.0,
) -> Exchange:
    """Send ``sent`` (pieces written one by one) on a new connection, read ``answers`` answers.

    With ``wait_close`` it also waits (up to ``seconds``) for the proxy to close the connection;
    else it reads until the answers are whole, then looks briefly for a close.
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data, closed = b"", False
    try:
        for piece in [sent] if isinstance(sent, bytes) else sent:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.02)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            got, _ = parse_answers(data, methods, at_eof=False)
            finals = [a for a in got if a.status >= 200]
            if len(finals) >= answers and not wait_close:
                break
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                async with asyncio.timeout(left):
                    chunk = await reader.read(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                closed = True
                break
            data += chunk
        if not closed:  # a close that comes right after the answers
            with contextlib.suppress(TimeoutError, ConnectionResetError):
                async with asyncio.timeout(0.05):
                    while chunk := await reader.read(65536):
                        data += chunk
                    closed = True
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    got, rest = parse_answers(data, methods, at_eof=closed)
    return Exchange(got, closed, rest)


Serve = Callable[..., Any]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """``await serve(answers, **config sections)``: (scripted oms, proxy port), both on loopback."""
    cleanups: list[Any] = []

    async def start(answers: list[Answer], **sections: dict[str, Any]) -> tuple[ScriptedOms, int]:
        oms = await ScriptedOms(answers).start()
        cleanups.append(oms.close)
        config = make_config(oms.url, **sections)
        runner, port = await start_site(create_app(config), config, "127.0.0.1", 0)
        cleanups.append(runner.cleanup)
        return oms, port

    yield start
    for cleanup in reversed(cleanups):
        await cleanup()


# --- oms side: a plain request, an unusual answer -----------------------------------------

GET = b"GET /api/x HTTP/1.1\r\nHost: proxy\r\n\r\n"
GET_10 = b"GET /api/x HTTP/1.0\r\n\r\n"
GET_10_KEEP = b"GET /api/x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
HEAD = b"HEAD /api/x HTTP/1.1\r\nHost: proxy\r\n\r\n"

BIG = b"x" * 300_000  # past the proxy's small-body path (read whole) and its direct-body path


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


@dataclasses.dataclass
class OmsCase:
    """A plain request; oms answers ``answer``; the client must get ``status`` and ``body``.

    ``body`` None: not checked; ``closed``: whether the proxy must close the client's connection
    after the answer (None: not checked); ``cut``: the answer must be cut (headers sent, then the
    connection closed before the body is complete: the only signal left once a head is out).
    """

    name: str
    answer: Answer
    status: int
    body: bytes | None = None
    request: bytes = GET
    closed: bool | None = None
    cut: bool = False
    headers: dict[str, list[bytes]] = dataclasses.field(default_factory=dict)
    interim: list[int] = dataclasses.field(default_factory=list)  # 1xx the client must get
    config: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


def _ok(body: bytes, *head: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + b"".join(h + b"\r\n" for h in head) + b"\r\n" + body


OMS_CASES = [
    # HTTP/1.0 clients: no chunked coding for them; a body without a length ends at the close.
    OmsCase(
        "http10-chunked-answer",
        Answer(_ok(chunked(b"hello ", b"world"), b"Transfer-Encoding: chunked")),
        200,
        b"hello world",
        request=GET_10,
        closed=True,
    ),
    OmsCase(
        "http10-large-chunked-answer",
        Answer(_ok(chunked(BIG, BIG), b"Transfer-Encoding: chunked")),
        200,
        BIG + BIG,
        request=GET_10,
        closed=True,
    ),
    OmsCase(
        "http10-keepalive-close-delimited-answer",
        Answer(_ok(b"until the end", b"Connection: close"), close=True),
        200,
        b"until the end",
        request=GET_10_KEEP,
        closed=True,
    ),
    OmsCase(
        "http10-keepalive-with-length-stays-open",
        OK_ANSWER,
        200,
        b"ok",
        request=GET_10_KEEP,
        closed=False,
        headers={"Connection": [b"keep-alive"]},
    ),
    OmsCase("http10-with-length-closes", OK_ANSWER, 200, b"ok", request=GET_10, closed=True),
    # Transfer-Encoding: one list over all its field lines (RFC 9110 §5.3), any case; only
    # chunked can be decoded (nginx: the same); a body shorter than its framing is cut, never
    # complete.
    OmsCase(
        "te-two-lines-identity-chunked-cut",
        Answer(
            _ok(b"5\r\nhello\r\n", b"Transfer-Encoding: identity", b"Transfer-Encoding: chunked"),
            close=True,
        ),
        200,
        cut=True,
    ),
    OmsCase(
        "te-two-lines-identity-chunked-whole",
        Answer(
            _ok(chunked(b"hello"), b"Transfer-Encoding: identity", b"Transfer-Encoding: chunked")
        ),
        200,
        b"hello",
    ),
    OmsCase(
        "te-list-identity-chunked",
        Answer(_ok(chunked(b"hello"), b"Transfer-Encoding: identity, chunked")),
        200,
        b"hello",
    ),
    OmsCase(
        "te-upper-case",
        Answer(_ok(chunked(b"hello"), b"Transfer-Encoding: CHUNKED")),
        200,
        b"hello",
    ),
    OmsCase(
        "te-chunked-cut-mid-chunk",
        Answer(_ok(b"a\r\nhello", b"Transfer-Encoding: chunked"), close=True),
        200,
        cut=True,
    ),
    OmsCase(
        "te-chunked-cut-before-last-chunk",
        Answer(_ok(b"5\r\nhello\r\n", b"Transfer-Encoding: chunked"), close=True),
        200,
        cut=True,
    ),
    OmsCase(
        "te-gzip-chunked-not-decodable",
        Answer(_ok(chunked(b"hello"), b"Transfer-Encoding: gzip, chunked")),
        502,
    ),
    OmsCase(
        "te-gzip-only-not-decodable",
        Answer(_ok(b"hello", b"Transfer-Encoding: gzip"), close=True),
        502,
    ),
    OmsCase(
        "te-chunked-then-gzip-not-decodable",
        Answer(_ok(b"hello", b"Transfer-Encoding: chunked, gzip"), close=True),
        502,
    ),
    OmsCase(
        "te-and-content-length",
        Answer(_ok(chunked(b"hello"), b"Content-Length: 10", b"Transfer-Encoding: chunked")),
        502,
    ),
    OmsCase(
        "te-chunk-size-not-hex",
        Answer(_ok(b"zz\r\nhello\r\n0\r\n\r\n", b"Transfer-Encoding: chunked")),
        200,
        cut=True,
    ),
    # Content-Length: one decimal value; duplicates, lists and conflicts are refused (nginx too).
    OmsCase(
        "cl-duplicate-same",
        Answer(_ok(b"hello", b"Content-Length: 5", b"Content-Length: 5")),
        502,
    ),
    OmsCase(
        "cl-conflicting",
        Answer(_ok(b"hello", b"Content-Length: 5", b"Content-Length: 3")),
        502,
    ),
    OmsCase("cl-list", Answer(_ok(b"hello", b"Content-Length: 5, 5")), 502),
    OmsCase("cl-negative", Answer(_ok(b"hello", b"Content-Length: -5")), 502),
    OmsCase("cl-plus-sign", Answer(_ok(b"hello", b"Content-Length: +5")), 502),
    OmsCase("cl-short-small-body", Answer(_ok(b"hel", b"Content-Length: 5"), close=True), 502),
    OmsCase(
        "cl-short-large-body",
        Answer(_ok(BIG[:1000], b"Content-Length: %d" % len(BIG)), close=True),
        200,
        cut=True,
    ),
    OmsCase(
        "cl-longer-than-announced",
        Answer(_ok(b"hello, and more", b"Content-Length: 5")),
        200,
        b"hello",
    ),
    OmsCase("cl-zero", Answer(_ok(b"", b"Content-Length: 0")), 200, b""),
    OmsCase(
        "close-delimited-body-to-http11-client",
        Answer(b"HTTP/1.0 200 OK\r\n\r\nuntil the end", close=True),
        200,
        b"until the end",
        headers={"Transfer-Encoding": [b"chunked"]},
    ),
    # Framing of the head (RFC 9112 §2.2, §5.2): strict, as llhttp is; a proxy must not pass
    # obs-fold on (502 or unfold; nginx: 502 too).
    OmsCase("head-bare-lf", Answer(b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok"), 502),
    OmsCase("head-obs-fold", Answer(_ok(b"ok", b"Content-Length: 2", b"X-A: one", b" two")), 502),
    OmsCase("head-nul-in-value", Answer(_ok(b"ok", b"Content-Length: 2", b"X-A: a\x00b")), 502),
    OmsCase("head-ctl-in-value", Answer(_ok(b"ok", b"Content-Length: 2", b"X-A: a\x01b")), 502),
    OmsCase("head-cr-in-value", Answer(_ok(b"ok", b"Content-Length: 2", b"X-A: a\rb")), 502),
    OmsCase("head-space-before-colon", Answer(_ok(b"ok", b"Content-Length : 2")), 502),
    OmsCase("head-no-reason", Answer(b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok"), 200, b"ok"),
    OmsCase("head-not-http", Answer(b"SSH-2.0-OpenSSH_9.2\r\n", close=True), 502),
    OmsCase("head-cut", Answer(b"HTTP/1.1 200 OK\r\nContent-Le", close=True), 502),
    OmsCase("no-answer-closed", Answer(b"", close=True), 502),
    # Header bytes pass unchanged, whatever their encoding (RFC 9110 §5.5: opaque octets).
    OmsCase(
        "head-latin1-value-unchanged",
        Answer(
            _ok(
                b"ok",
                b"Content-Length: 2",
                b'Content-Disposition: attachment; filename="caf\xe9.csv"',
            )
        ),
        200,
        b"ok",
        headers={"Content-Disposition": [b'attachment; filename="caf\xe9.csv"']},
    ),
    OmsCase(
        "head-utf8-value-unchanged",
        Answer(_ok(b"ok", b"Content-Length: 2", "X-Name: café ☕".encode())),
        200,
        b"ok",
        headers={"X-Name": ["café ☕".encode()]},
    ),
    OmsCase(
        "head-latin1-value-streamed-unchanged",
        Answer(_ok(chunked(b"ok"), b"Transfer-Encoding: chunked", b"X-Name: caf\xe9")),
        200,
        b"ok",
        headers={"X-Name": [b"caf\xe9"]},
    ),
    # Status codes: three digits, 100-599 (RFC 9110 §15); anything else is no HTTP answer.
    OmsCase("status-099", Answer(b"HTTP/1.1 099 Odd\r\nContent-Length: 2\r\n\r\nok"), 502),
    OmsCase("status-000", Answer(b"HTTP/1.1 000 Odd\r\nContent-Length: 2\r\n\r\nok"), 502),
    OmsCase("status-600", Answer(b"HTTP/1.1 600 Odd\r\nContent-Length: 2\r\n\r\nok"), 502),
    OmsCase("status-2-digits", Answer(b"HTTP/1.1 20 OK\r\nContent-Length: 2\r\n\r\nok"), 502),
    OmsCase(
        "status-599-passes", Answer(b"HTTP/1.1 599 Odd\r\nContent-Length: 2\r\n\r\nok"), 599, b"ok"
    ),
    # Interim answers (RFC 9110 §15.2): 1xx have no body; 100 answers the proxy's own server's
    # Expect handling and is not relayed; 102/103 are relayed to HTTP/1.1 clients (never to
    # HTTP/1.0 ones); 101 is refused (no protocol switch through the pass-through).
    OmsCase(
        "interim-100-then-final",
        Answer(b"HTTP/1.1 100 Continue\r\n\r\n" + OK_ANSWER.data),
        200,
        b"ok",
    ),
    OmsCase(
        "interim-103-relayed",
        Answer(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n" + OK_ANSWER.data),
        200,
        b"ok",
        interim=[103],
    ),
    OmsCase(
        "interim-102-103-relayed",
        Answer(
            b"HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
            + OK_ANSWER.data
        ),
        200,
        b"ok",
        interim=[102, 103],
    ),
    OmsCase(
        "interim-103-not-to-http10",
        Answer(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK_ANSWER.data),
        200,
        b"ok",
        request=GET_10,
    ),
    OmsCase(
        "interim-with-body",
        Answer(
            b"HTTP/1.1 100 Continue\r\nContent-Length: 5\r\n\r\nHELLO"
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal"
        ),
        502,
    ),
    OmsCase(
        "interim-with-chunked-body",
        Answer(
            b"HTTP/1.1 103 Early Hints\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nHELLO\r\n0\r\n\r\n"
            + OK_ANSWER.data
        ),
        502,
    ),
    OmsCase(
        "interim-199-with-body",
        Answer(
            b"HTTP/1.1 199 Odd\r\nContent-Length: 5\r\n\r\nHELLO"
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal"
        ),
        502,
    ),
    OmsCase("interim-101", Answer(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n"), 502),
    # HEAD, 204, 304: no body whatever the head announces.
    OmsCase(
        "head-request-keeps-length",
        Answer(b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n"),
        200,
        b"",
        request=HEAD,
        headers={"Content-Length": [b"1234"]},
    ),
    OmsCase("status-204", Answer(b"HTTP/1.1 204 No Content\r\n\r\n"), 204, b""),
    OmsCase("status-304", Answer(b'HTTP/1.1 304 Not Modified\r\nETag: "a"\r\n\r\n'), 304, b""),
    # Limits of oms's answer head (oms.max_answer_head_bytes, oms.max_answer_headers): past them,
    # 502 at once (nginx: "upstream sent too big header", 502), never buffered whole.
    OmsCase(
        "head-over-size-limit",
        Answer(_ok(b"ok", b"Content-Length: 2", b"X-Big: " + b"a" * 70_000)),
        502,
    ),
    OmsCase(
        "head-over-size-limit-configured",
        Answer(_ok(b"ok", b"Content-Length: 2", b"X-Big: " + b"a" * 2000)),
        502,
        config={"oms": {"max_answer_head_bytes": 1024}},
    ),
    OmsCase(
        "head-32-mib-header-line",  # refused as it comes, not buffered whole first
        Answer(_ok(b"ok", b"Content-Length: 2", b"X-Big: " + b"a" * (32 << 20))),
        502,
    ),
    OmsCase(
        "head-under-size-limit",
        Answer(_ok(b"ok", b"Content-Length: 2", b"X-Big: " + b"a" * 60_000)),
        200,
        b"ok",
    ),
    OmsCase(
        "head-over-header-count",
        Answer(_ok(b"ok", b"Content-Length: 2", *(b"X-H%d: v" % i for i in range(200)))),
        502,
    ),
    OmsCase(
        "head-under-header-count",
        Answer(_ok(b"ok", b"Content-Length: 2", *(b"X-H%d: v" % i for i in range(90)))),
        200,
        b"ok",
    ),
]


@pytest.mark.parametrize("case", OMS_CASES, ids=lambda c: c.name)
async def test_oms_answer(serve: Serve, case: OmsCase) -> None:
    oms, port = await serve([case.answer], **case.config)
    method = case.request.split(b" ", 1)[0].decode()
    got = await exchange(port, case.request, [method], answers=1, wait_close=bool(case.closed))
    assert len(oms.requests) == 1, "sent to oms once, never retried"
    if case.cut:
        assert got.closed, "a cut answer must end in a closed connection"
        assert [a.status for a in got.answers if a.status >= 200] == [], (
            f"the answer must not look complete: {got.answers}"
        )
        assert got.rest.split(b"\r\n", 1)[0].split(b" ")[1] == str(case.status).encode()
        return
    finals = [a for a in got.answers if a.status >= 200]
    assert [a.status for a in finals] == [case.status], got
    assert [a.status for a in got.answers if a.status < 200] == case.interim
    answer = finals[0]
    assert answer.status_line.startswith(b"HTTP/1.")
    if case.body is not None:
        assert answer.body == case.body
    for name, values in case.headers.items():
        assert answer.header(name) == values, (name, answer.headers)
    if case.closed is not None:
        assert got.closed == case.closed


# Pool hygiene: a connection to oms is used again only after a whole, clean exchange that both
# sides keep alive (RFC 9112 §9.3); (name, oms's answer, the client's status, reused).
REUSE_CASES = [
    ("clean", OK_ANSWER, 200, True),
    (
        "connection-close",
        Answer(_ok(b"ok", b"Content-Length: 2", b"Connection: close")),
        200,
        False,
    ),
    ("http10-answer", Answer(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"), 200, False),
    (
        "http10-answer-keep-alive",
        Answer(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok"),
        200,
        True,
    ),
    ("chunked", Answer(_ok(chunked(b"ok"), b"Transfer-Encoding: chunked")), 200, True),
    ("bytes-after-the-answer", Answer(OK_ANSWER.data + b"HTTP/1.1 200 OK\r\n\r\n"), 200, False),
    ("longer-than-announced", Answer(_ok(b"okay", b"Content-Length: 2")), 200, False),
    ("interim-then-final", Answer(b"HTTP/1.1 103 Early Hints\r\n\r\n" + OK_ANSWER.data), 200, True),
    ("malformed", Answer(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\nok"), 502, False),
]


@pytest.mark.parametrize(
    ("answer", "status", "reused"),
    [pytest.param(a, s, r, id=n) for n, a, s, r in REUSE_CASES],
)
async def test_oms_connection_reuse(
    serve: Serve, answer: Answer, status: int, reused: bool
) -> None:
    oms, port = await serve([answer])
    for path in ("/api/x", "/api/y"):  # one after the other, each from a new client connection
        got = await exchange(port, _get(path), ["GET"], answers=1)
        assert [a.status for a in got.answers if a.status >= 200] == [status], got
        await asyncio.sleep(0.05)  # a close by oms reaches the pool before the next request
    assert len(oms.requests) == 2
    assert oms.connections == (1 if reused else 2)


# --- client side: an unusual request, a plain oms ----------------------------------------


@dataclasses.dataclass
class ClientCase:
    """The client sends ``sent``; it must get ``statuses`` in order (1xx left out).

    ``methods``: of the requests answered, for the framing of their answers; ``oms``: how many
    requests oms must receive, and ``oms_has``/``oms_lacks``: bytes each of them must (not)
    contain; ``closed``: whether the proxy must close the connection after the last answer
    (None: not checked); ``version``: the status line of every answer starts with it.
    """

    name: str
    sent: bytes | list[bytes]
    statuses: list[int]
    oms: int
    closed: bool | None = None
    methods: list[str] = dataclasses.field(default_factory=list)
    oms_has: list[bytes] = dataclasses.field(default_factory=list)
    oms_lacks: list[bytes] = dataclasses.field(default_factory=list)
    version: bytes = b"HTTP/1.1 "
    interim: list[int] = dataclasses.field(default_factory=list)
    config: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


def _get(path: str = "/api/x", *head: bytes, version: bytes = b"HTTP/1.1") -> bytes:
    host = b"Host: proxy\r\n" if version == b"HTTP/1.1" else b""
    lines = b"".join(h + b"\r\n" for h in head)
    return b"GET " + path.encode() + b" " + version + b"\r\n" + host + lines + b"\r\n"


def _post(body: bytes, *head: bytes) -> bytes:
    lines = b"".join(h + b"\r\n" for h in head)
    return b"POST /api/up HTTP/1.1\r\nHost: proxy\r\n" + lines + b"\r\n" + body


CLIENT_CASES = [
    # Pipelining (RFC 9112 §9.3.2): answers in order; what follows a last request is not read.
    ClientCase("pipelined-two", _get() + _get("/api/y"), [200, 200], 2),
    ClientCase(
        "pipelined-head-then-get",
        b"HEAD /api/x HTTP/1.1\r\nHost: proxy\r\n\r\n" + _get(),
        [200, 200],
        2,
        methods=["HEAD", "GET"],
    ),
    ClientCase(
        "pipelined-valid-then-garbage", _get() + b"\x16\x03\x01garbage\r\n\r\n", [200, 400], 1
    ),
    ClientCase(
        "pipelined-after-connection-close",
        _get("/api/x", b"Connection: close") + _get("/api/y"),
        [200],
        1,
        closed=True,
    ),
    ClientCase(
        "pipelined-after-http10",
        _get(version=b"HTTP/1.0") + _get("/api/y"),
        [200],
        1,
        closed=True,
        version=b"HTTP/1.",
    ),
    ClientCase(
        "pipelined-after-http10-keepalive",
        _get("/api/x", b"Connection: keep-alive", version=b"HTTP/1.0") + _get("/api/y"),
        [200, 200],
        2,
        version=b"HTTP/1.",
    ),
    ClientCase(
        "pipelined-post-then-get",
        _post(b"hello", b"Content-Length: 5") + _get(),
        [200, 200],
        2,
        oms_has=[b""],
    ),
    ClientCase(
        "connection-close-answered-and-closed",
        _get("/api/x", b"Connection: close"),
        [200],
        1,
        closed=True,
    ),
    # Versions (RFC 9110 §2.5, §6.2): 1.x only; the answer's status line is always HTTP/1.1.
    ClientCase("version-2.0", _get(version=b"HTTP/2.0"), [505], 0, closed=True),
    ClientCase("version-3.0", _get(version=b"HTTP/3.0"), [505], 0, closed=True),
    ClientCase("version-0.9", b"GET /api/x\r\n\r\n", [400], 0, closed=True),
    ClientCase("version-garbage", b"GET /api/x HTTP/x.y\r\nHost: p\r\n\r\n", [400], 0, closed=True),
    ClientCase(
        "version-lower-case", b"GET /api/x http/1.1\r\nHost: p\r\n\r\n", [400], 0, closed=True
    ),
    # Request line and head limits (server.max_request_target_bytes, server.max_header_bytes,
    # server.max_headers): 414 for a long target, 431 for long or too many header lines.
    ClientCase("target-over-limit", _get("/" + "a" * 9000), [414], 0, closed=True),
    ClientCase("target-under-limit", _get("/" + "a" * 8000), [200], 1),
    ClientCase(
        "target-over-configured-limit",
        _get("/" + "a" * 3000),
        [414],
        0,
        closed=True,
        config={"server": {"max_request_target_bytes": 2048}},
    ),
    ClientCase(
        "header-over-limit", _get("/api/x", b"X-Big: " + b"a" * 9000), [431], 0, closed=True
    ),
    ClientCase("header-under-limit", _get("/api/x", b"X-Big: " + b"a" * 8000), [200], 1),
    ClientCase(
        "header-count-over-limit",
        _get("/api/x", *(b"X-H%d: v" % i for i in range(130))),
        [431],
        0,
        closed=True,
    ),
    ClientCase(
        "header-count-under-limit", _get("/api/x", *(b"X-H%d: v" % i for i in range(90))), [200], 1
    ),
    # Framing of the request (RFC 9112 §6.3): ambiguity is 400 and the connection closed.
    ClientCase(
        "te-and-content-length",
        _post(chunked(b"hello"), b"Content-Length: 5", b"Transfer-Encoding: chunked"),
        [400],
        0,
        closed=True,
    ),
    ClientCase(
        "te-final-not-chunked",
        _post(b"hello", b"Transfer-Encoding: chunked, identity"),
        [400],
        0,
        closed=True,
    ),
    ClientCase(
        "te-unknown-coding",
        _post(chunked(b"hello"), b"Transfer-Encoding: gzip, chunked"),
        [501],
        0,
        closed=True,
    ),
    ClientCase(
        "te-two-lines-chunked",
        _post(chunked(b"hello"), b"Transfer-Encoding: chunked", b"Transfer-Encoding: chunked"),
        [400],
        0,
        closed=True,
    ),
    ClientCase(
        "te-upper-case-chunked",
        _post(chunked(b"hello"), b"Transfer-Encoding: CHUNKED"),
        [200],
        1,
        oms_has=[b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n"],
    ),
    ClientCase(
        "te-bad-chunk-size",
        _post(b"zz\r\nhello\r\n0\r\n\r\n", b"Transfer-Encoding: chunked"),
        [400],
        0,
    ),
    ClientCase(
        "cl-duplicate-same",
        _post(b"hello", b"Content-Length: 5", b"Content-Length: 5"),
        [400],
        0,
        closed=True,
    ),
    ClientCase(
        "cl-conflicting",
        _post(b"hello", b"Content-Length: 5", b"Content-Length: 3"),
        [400],
        0,
        closed=True,
    ),
    ClientCase("cl-list", _post(b"hello", b"Content-Length: 5, 5"), [400], 0, closed=True),
    ClientCase("cl-negative", _post(b"hello", b"Content-Length: -5"), [400], 0, closed=True),
    ClientCase(
        "cl-body-forwarded",
        _post(b"hello", b"Content-Length: 5"),
        [200],
        1,
        oms_has=[b"Content-Length: 5\r\n", b"\r\n\r\nhello"],
    ),
    # The head (RFC 9112 §2.2, §5): strict; obs-fold, bare CR, NUL and CTL are 400.
    ClientCase("head-obs-fold", _get("/api/x", b"X-A: one", b" two"), [400], 0, closed=True),
    ClientCase("head-nul-in-value", _get("/api/x", b"X-A: a\x00b"), [400], 0, closed=True),
    ClientCase("head-ctl-in-value", _get("/api/x", b"X-A: a\x01b"), [400], 0, closed=True),
    ClientCase("head-bare-cr", _get("/api/x", b"X-A: a\rb"), [400], 0, closed=True),
    ClientCase("head-space-before-colon", _get("/api/x", b"X-A : b"), [400], 0, closed=True),
    ClientCase("head-no-host", b"GET /api/x HTTP/1.1\r\n\r\n", [400], 0, closed=True),
    ClientCase(
        "head-bare-lf",
        b"GET /api/x HTTP/1.1\nHost: proxy\n\n",
        [400],
        0,
        closed=True,
    ),
    ClientCase(
        "head-latin1-value-forwarded-unchanged",
        _get("/api/x", b"X-Name: caf\xe9"),
        [200],
        1,
        oms_has=[b"X-Name: caf\xe9\r\n"],
    ),
    ClientCase(
        "absolute-form-target",
        b"GET http://elsewhere.example/api/x?q=1 HTTP/1.1\r\nHost: elsewhere.example\r\n\r\n",
        [200],
        1,
        oms_has=[b"GET /api/x?q=1 HTTP/1.1\r\n"],
    ),
    # Upgrade (RFC 9110 §7.8): the pass-through never switches protocols; the request is
    # answered as a plain one (Upgrade is hop-by-hop: not sent to oms) and the connection
    # goes on with the requests that follow.
    ClientCase(
        "upgrade-with-body-then-pipelined",
        _post(b"hello", b"Connection: Upgrade", b"Upgrade: foo/1", b"Content-Length: 5")
        + _get("/api/y"),
        [200, 200],
        2,
        oms_lacks=[b"Upgrade"],
    ),
    ClientCase(
        "upgrade-websocket-then-pipelined",
        _get(
            "/api/x",
            b"Connection: Upgrade",
            b"Upgrade: websocket",
            b"Sec-WebSocket-Version: 13",
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        )
        + _get("/api/y"),
        [200, 200],
        2,
        oms_lacks=[b"Upgrade", b"upgrade"],
    ),
    ClientCase(
        "upgrade-h2c-then-pipelined",
        _get(
            "/api/x",
            b"Connection: Upgrade, HTTP2-Settings",
            b"Upgrade: h2c",
            b"HTTP2-Settings: AAMAAABkAAQAAP__",
        )
        + _get("/api/y"),
        [200, 200],
        2,
        oms_lacks=[b"Upgrade", b"HTTP2-Settings"],
    ),
    # Methods (RFC 9110 §9.1): unknown to the parser, or CONNECT (no forward proxy): 501.
    ClientCase("method-unknown", b"FOO /api/x HTTP/1.1\r\nHost: p\r\n\r\n", [501], 0, closed=True),
    ClientCase(
        "method-lower-case", b"get /api/x HTTP/1.1\r\nHost: p\r\n\r\n", [501], 0, closed=True
    ),
    ClientCase(
        "method-connect",
        b"CONNECT oms:443 HTTP/1.1\r\nHost: oms:443\r\n\r\n",
        [501],
        0,
        closed=True,
    ),
    ClientCase(
        "method-not-a-token", b"G(T /api/x HTTP/1.1\r\nHost: p\r\n\r\n", [400], 0, closed=True
    ),
    # More of the request line and head.
    ClientCase("target-with-space", b"GET /a b HTTP/1.1\r\nHost: p\r\n\r\n", [400], 0, closed=True),
    ClientCase(
        "target-fragment-not-sent",
        _get("/api/x?q=1#frag"),
        [200],
        1,
        oms_has=[b"GET /api/x?q=1 HTTP/1.1\r\n"],
    ),
    ClientCase(
        "head-space-before-first-line",
        b"GET /api/x HTTP/1.1\r\n Host: p\r\n\r\n",
        [400],
        0,
        closed=True,
    ),
    ClientCase("head-two-hosts", _get("/api/x", b"Host: other"), [400], 0, closed=True),
    ClientCase("head-bad-name-char", _get("/api/x", b"X(A): b"), [400], 0, closed=True),
    ClientCase("head-leading-empty-line", b"\r\n" + _get(), [200], 1),
    ClientCase(
        "http10-transfer-encoding",
        b"POST /api/up HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(b"hello"),
        [400],
        0,
        closed=True,
    ),
    ClientCase(
        "chunked-extension-and-trailer",
        _post(b"5;ext=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\n", b"Transfer-Encoding: chunked"),
        [200],
        1,
        oms_has=[b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n"],
        oms_lacks=[b"ext=1", b"X-T"],
    ),
    ClientCase(
        "chunked-bare-lf",
        _post(b"5\nhello\n0\n\n", b"Transfer-Encoding: chunked"),
        [400],
        0,
        closed=True,
    ),
    ClientCase(
        "chunked-size-trailing-space",
        _post(b"5 \r\nhello\r\n0\r\n\r\n", b"Transfer-Encoding: chunked"),
        [400],
        0,
        closed=True,
    ),
    ClientCase(
        "cl-leading-zeros",
        _post(b"hello", b"Content-Length: 005"),
        [200],
        1,
        oms_has=[b"Content-Length: 5\r\n", b"\r\n\r\nhello"],
    ),
    # Pipelining and the read boundaries: what was split over reads is never re-parsed from a
    # guess (a header line must not become a request: no smuggling).
    ClientCase(
        "split-read-no-smuggled-request",
        [b"GET /api/x HTTP/1.1\r\nHost: p\r\nX-A: a", b"\r\nGET /evil HTTP/1.1\r\nHost: p\r\n\r\n"],
        [400],
        0,
        closed=True,
    ),
    ClientCase(
        "pipelined-post-get-then-garbage",
        _post(b"hello", b"Content-Length: 5") + _get("/api/y") + b"BAD\x00\r\n\r\n",
        [200, 200, 400],
        2,
        closed=True,
    ),
    ClientCase(
        "pipelined-valid-then-bad-chunked",
        _get() + _post(b"5\r\nhello\r\nzz\r\n", b"Transfer-Encoding: chunked"),
        [200, 400],
        1,
        closed=True,
    ),
    ClientCase("pipelined-twenty", _get() * 20, [200] * 20, 20),
    ClientCase("pipelined-forty", _get() * 40, [200] * 40, 40),  # past aiohttp's queue of 32
    ClientCase(
        "pipelined-forty-then-garbage",  # the read is parsed in two goes: no recovery in the 2nd
        _get() * 40 + b"BAD\x00\r\n\r\n",
        [200] * 32 + [400],
        32,
        closed=True,
    ),
    ClientCase(
        "pipelined-valid-then-too-long-target",
        _get() + _get("/" + "a" * 9000),
        [200, 414],
        1,
        closed=True,
    ),
    ClientCase("expect-unknown", _get("/api/x", b"Expect: foo"), [417], 0),
    # Expect: 100-continue (RFC 9110 §10.1.1): answered by the proxy, not sent to oms.
    ClientCase(
        "expect-100-continue",
        [_post(b"", b"Content-Length: 5", b"Expect: 100-continue"), b"hello"],
        [200],
        1,
        interim=[100],
        oms_has=[b"\r\n\r\nhello"],
        oms_lacks=[b"Expect", b"expect"],
    ),
    ClientCase(
        "expect-100-continue-any-case",
        [_post(b"", b"Content-Length: 5", b"Expect: 100-Continue"), b"hello"],
        [200],
        1,
        interim=[100],
        oms_has=[b"\r\n\r\nhello"],
    ),
    ClientCase(  # RFC 9110 §10.1.1: an HTTP/1.0 client never gets a 1xx
        "expect-100-continue-http10-ignored",
        b"POST /api/up HTTP/1.0\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello",
        [200],
        1,
        version=b"HTTP/1.",
        oms_has=[b"\r\n\r\nhello"],
        closed=True,
    ),
]


@pytest.mark.parametrize("case", CLIENT_CASES, ids=lambda c: c.name)
async def test_client_request(serve: Serve, case: ClientCase) -> None:
    oms, port = await serve([OK_ANSWER], **case.config)
    methods = case.methods or ["GET"] * len(case.statuses)
    got = await exchange(
        port, case.sent, methods, answers=len(case.statuses), wait_close=bool(case.closed)
    )
    assert [a.status for a in got.answers if a.status >= 200] == case.statuses, got
    assert [a.status for a in got.answers if a.status < 200] == case.interim
    for answer in got.answers:
        assert answer.status_line.startswith(case.version), answer.status_line
    assert len(oms.requests) == case.oms, oms.requests
    for request in oms.requests:
        for part in case.oms_has:
            assert part in request, (part, request)
        for part in case.oms_lacks:
            assert part not in request, (part, request)
    if case.closed is not None:
        assert got.closed == case.closed
