"""Structured logs: every record is one JSON line; the access log adds one per request."""

from __future__ import annotations

import json
import logging
import time

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError

from proxy.keys import REQUEST_ID_KEY

QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

_ENCODER = json.JSONEncoder(ensure_ascii=False, default=str)  # json.dumps makes one per call


class JsonFormatter(logging.Formatter):
    """Format records as JSON objects, keeping extra fields passed as ``extra={"fields": ...}``."""

    _second: tuple[int, str] = (-1, "")  # the last second formatted, and its text

    def _time(self, record: logging.LogRecord) -> str:
        second, text = self._second
        if int(record.created) != second:  # formatted once a second, not once a line
            second = int(record.created)
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = (second, text)
        return f"{text}.{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": self._time(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            doc.update(fields)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return _ENCODER.encode(doc)


class BadRequestLogFilter(logging.Filter):
    """Shortens aiohttp's record of a malformed request to one line without the request's bytes.

    aiohttp logs it as an error with a traceback whose message quotes the offending line, which
    may be an ``Authorization`` or ``Cookie`` header. The client gets that text in its 400 (its
    own bytes); the log gets the error's class and the peer, at INFO: it is the client's fault.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg = "malformed request from %s: %s (%s)"
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.args = (peer, type(exc).__name__, exc.code)
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


_BAD_REQUEST_FILTER = BadRequestLogFilter()

# Loggers whose DEBUG output carries request or response bodies (kubernetes_asyncio logs every
# response body, which echoes the submitted MPIJob): kept at INFO whatever logging.level says.
_BODY_LOGGERS = ("kubernetes_asyncio.client.rest",)


def install_log_filters() -> None:
    """Keep secrets and request bytes out of third-party log records (idempotent)."""
    server = logging.getLogger("aiohttp.server")
    if _BAD_REQUEST_FILTER not in server.filters:
        server.addFilter(_BAD_REQUEST_FILTER)
    for name in _BODY_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)


def setup_logging(level: str) -> None:
    """Send JSON lines to stderr at ``level``.

    The records skip what no line shows (thread, process and multiprocessing names): each
    lookup costs on every record, one per request with the access log.
    """
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(level)


class JsonAccessLogger(AbstractAccessLogger):
    """One JSON line per request: method, path (no query), status, bytes, duration, request id.

    Header values and bodies are never logged, so Authorization, Cookie and X-Api-Key values
    cannot leak through here. Health and metrics probes are left out unless ``log_health``.
    """

    log_health = False

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        path = request.path
        if not self.log_health and path in QUIET_PATHS:
            return
        logger = self.logger
        if not logger.isEnabledFor(logging.INFO):
            return
        method, status = request.method, response.status
        # logger.info() would also walk the stack for the caller's file and line, which no
        # line shows: the record is made and handled directly (same filters and handlers).
        record = logger.makeRecord(
            logger.name,
            logging.INFO,
            "",
            0,
            "%s %s %d",
            (method, path, status),
            None,
            extra={
                "fields": {
                    "method": method,
                    "path": path,
                    "status": status,
                    "bytes": response.body_length,
                    "duration_ms": round(time * 1000, 3),
                    "request_id": request.get(REQUEST_ID_KEY, ""),
                    "remote": request.remote,
                }
            },
        )
        logger.handle(record)

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


class JsonAccessLoggerWithHealth(JsonAccessLogger):
    """The access logger that also logs health probes (``server.access_log_health``)."""

    log_health = True
