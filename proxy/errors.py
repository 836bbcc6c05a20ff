"""The project's error classes and the one place that turns them into HTTP answers.

Every error a handler can meet is a :class:`ProxyError` with an HTTP ``status``; the
:func:`error_middleware` is the only code that maps them to responses. Kubernetes failures are
classified here too (by HTTP status and the ``Status.reason`` of the body, see
:mod:`proxy.clients.kube`), so the status table in the README is this module's class list.

Answers are plain text ending in a newline, like oms's ``http.Error``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

from aiohttp import web

_LOGGER = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 1000


def truncate(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Shorten text that may come from another server before it reaches a client or a log."""
    text = text.replace("\r", " ")
    return text if len(text) <= limit else text[: limit - 15] + "... (truncated)"


class ProxyError(Exception):
    """An error with a defined HTTP answer."""

    status: int = 500
    retry_after: float | None = None

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        self.message = truncate(message)
        super().__init__(self.message)
        if retry_after is not None:
            self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        """Extra response headers."""
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}


# --- request errors (the client can fix them) -------------------------------------------------


class BadRequest(ProxyError):
    """Malformed or refused request."""

    status = 400


class PayloadTooLarge(ProxyError):
    """Body over the configured limit."""

    status = 413


class RequestTimeout(ProxyError):
    """The client paused too long while sending its request body."""

    status = 408


class UnsupportedMediaType(ProxyError):
    """Wrong Content-Type."""

    status = 415


class Conflict(ProxyError):
    """The same run was already submitted by another request."""

    status = 409


class TooManyRequests(ProxyError):
    """Too many submissions at once; try again later."""

    status = 429
    retry_after = 1.0


# --- oms (upstream) errors ------------------------------------------------------------------------


class UpstreamUnavailable(ProxyError):
    """oms could not be reached or broke the exchange."""

    status = 502


class UpstreamTimeout(ProxyError):
    """oms did not answer in time."""

    status = 504


# --- Kubernetes errors, classified by status and Status.reason ---


class KubeError(ProxyError):
    """A failure of the Kubernetes API, with the decoded ``Status`` fields.

    ``message`` is the client's answer and may quote the API server's ``Status`` message, which
    can echo the submitted object (the client's own Opts, notes...). ``str()`` is the form for
    logs: ``log_message`` when the classifier gave one (the message without what the API
    server quoted), else the message.
    """

    status = 502

    def __init__(
        self,
        message: str,
        *,
        k8s_status: int | None = None,
        reason: str = "",
        causes: tuple[str, ...] = (),
        retry_after: float | None = None,
        log_message: str | None = None,
    ) -> None:
        super().__init__(message, retry_after=retry_after)
        self.k8s_status = k8s_status
        self.reason = reason
        self.causes = causes
        self.log_message = truncate(log_message) if log_message is not None else None

    def __str__(self) -> str:
        return self.log_message if self.log_message is not None else self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


class KubeAlreadyExists(KubeError):
    """409 AlreadyExists: an MPIJob for this run stamp exists (from another request)."""

    status = 409


class KubeConflict(KubeError):
    """409 Conflict: the object changed since it was read (a stale ``resourceVersion``)."""

    status = 409


class KubeInvalid(KubeError):
    """422 Invalid / 400 BadRequest: the API server rejected the object; causes say why."""

    status = 422


class KubeQuotaExceeded(KubeError):
    """403 "exceeded quota": the namespace's ResourceQuota is full; retry later."""

    status = 429
    retry_after = 60.0


class KubeForbidden(KubeError):
    """403 other / 401: the proxy's own credentials or RBAC are wrong (an operator must fix it)."""

    status = 502


class KubeResourceMissing(KubeError):
    """404 for a collection: the MPIJob CRD is not installed or the namespace does not exist."""

    status = 502


class KubeObjectNotFound(KubeError):
    """404 for one named object (a run's MPIJob that is gone)."""

    status = 404


class KubeUnavailable(KubeError):
    """429 / 503 after retries, or connection refused / DNS failure: try again later."""

    status = 503
    retry_after = 5.0


class KubeServerError(KubeError):
    """Other 5xx after retries."""

    status = 502


class KubeTimeout(KubeError):
    """No answer within the configured time."""

    status = 504


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(err: ProxyError) -> web.Response:
    """The one mapping from a project error to an HTTP answer."""
    return web.Response(
        status=err.status,
        text=err.message + "\n",
        content_type="text/plain",
        charset="utf-8",
        headers=err.headers(),
    )


ERROR_KEY: web.RequestKey[ProxyError] = web.RequestKey("error", ProxyError)
"""The error a request was answered with (for the metrics and the request-id middleware)."""


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn :class:`ProxyError` into its answer; log anything else as a bug (500)."""
    try:
        return await handler(request)
    except ProxyError as err:
        if err.status >= 500:  # str(err) is the log form (KubeError adds the API's answer)
            _LOGGER.warning("%s %s -> %d: %s", request.method, request.path, err.status, err)
        request[ERROR_KEY] = err
        response = error_response(err)
        if not request.content.is_eof():
            response.force_close()  # the rest of the body will not be read
        return response
    except web.HTTPException:
        raise
    except Exception:
        _LOGGER.exception("unexpected error in %s %s", request.method, request.path)
        return web.Response(
            status=500, text="Internal proxy error\n", content_type="text/plain", charset="utf-8"
        )
