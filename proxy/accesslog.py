"""Structured logs: every record is one JSON line; the access log adds one per request."""

from __future__ import annotations

import json
import logging
import time

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from proxy.passthrough import REQUEST_ID_KEY

QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class JsonFormatter(logging.Formatter):
    """Format records as JSON objects, keeping extra fields passed as ``extra={"fields": ...}``."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            doc.update(fields)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


def setup_logging(level: str) -> None:
    """Send JSON lines to stderr at ``level``."""
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
        if not self.log_health and request.path in QUIET_PATHS:
            return
        self.logger.info(
            "%s %s %d",
            request.method,
            request.path,
            response.status,
            extra={
                "fields": {
                    "method": request.method,
                    "path": request.path,
                    "status": response.status,
                    "bytes": response.body_length,
                    "duration_ms": round(time * 1000, 3),
                    "request_id": request.get(REQUEST_ID_KEY, ""),
                    "remote": request.remote,
                }
            },
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


class JsonAccessLoggerWithHealth(JsonAccessLogger):
    """The access logger that also logs health probes (``server.access_log_health``)."""

    log_health = True
