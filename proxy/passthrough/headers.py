"""Header rules for the pass-through, as pure functions (RFC 9110 §7.6.1, RFC 9112 §6.3)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from multidict import CIMultiDict, CIMultiDictProxy, istr

# Hop-by-hop headers: meaningful for one connection only, never forwarded.
HOP_BY_HOP: frozenset[str] = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Proxy-Connection",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Authentication-Info",
    )
)

# Request headers the proxy sets itself or must not pass on: Host is oms's own, and
# `Expect: 100-continue` is answered by this proxy's server, not forwarded.
_REQUEST_DROP: frozenset[str] = frozenset({"host", "expect", "content-length"})

REQUEST_ID = istr("X-Request-ID")


def connection_tokens(headers: Mapping[str, str] | CIMultiDictProxy[str]) -> set[str]:
    """Header names listed in ``Connection`` (they are hop-by-hop for this message)."""
    if "Connection" not in headers:
        return set()
    getall = getattr(headers, "getall", None)
    values: Iterable[str] = getall("Connection", ()) if getall else [headers.get("Connection", "")]
    return {t.strip().lower() for v in values for t in v.split(",") if t.strip()}


# What is dropped from every request (plus the names the request's Connection header lists).
_REQUEST_DROP_ALL: frozenset[str] = HOP_BY_HOP | _REQUEST_DROP


def _kept(
    headers: CIMultiDict[str] | CIMultiDictProxy[str], drop: frozenset[str] | set[str]
) -> list[tuple[str, str]]:
    """``headers`` in order, less those named in ``drop`` (lower-case) and ``Proxy-*``."""
    return [
        (name, value)
        for name, value in headers.items()
        if (low := name.lower()) not in drop and not low.startswith("proxy-")
    ]


def upstream_request_headers(
    incoming: CIMultiDictProxy[str],
    *,
    peer: str | None,
    scheme: str,
    host: str | None,
    request_id: str,
    content_length: int | None,
) -> CIMultiDict[str]:
    """Headers sent to oms: the client's, minus hop-by-hop ones, plus X-Forwarded-*."""
    tokens = connection_tokens(incoming)
    out: CIMultiDict[str] = CIMultiDict(
        _kept(incoming, _REQUEST_DROP_ALL | tokens if tokens else _REQUEST_DROP_ALL)
    )
    if peer:
        prior = ", ".join(incoming.getall("X-Forwarded-For", ()))
        out["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer
    prior_proto = ", ".join(incoming.getall("X-Forwarded-Proto", ()))
    out["X-Forwarded-Proto"] = f"{prior_proto}, {scheme}" if prior_proto else scheme
    if host:
        prior_host = ", ".join(incoming.getall("X-Forwarded-Host", ()))
        out["X-Forwarded-Host"] = f"{prior_host}, {host}" if prior_host else host
    out[REQUEST_ID] = request_id
    if content_length is not None:
        out["Content-Length"] = str(content_length)
    return out


def downstream_response_headers(
    upstream: CIMultiDict[str] | CIMultiDictProxy[str],
) -> CIMultiDict[str]:
    """Headers sent back to the client: oms's, minus hop-by-hop ones."""
    tokens = connection_tokens(upstream)
    return CIMultiDict(_kept(upstream, HOP_BY_HOP | tokens if tokens else HOP_BY_HOP))


def status_has_no_body(status: int) -> bool:
    """1xx, 204 and 304 answers never carry a body (RFC 9112 §6.3)."""
    return 100 <= status < 200 or status in (204, 304)


def has_no_body(method: str, status: int) -> bool:
    """A HEAD answer, or a status that never has a body."""
    return method == "HEAD" or status_has_no_body(status)


def encode_head(status_line: str, headers: Iterable[tuple[str, str]]) -> bytes:
    """An answer's head as bytes, header values exactly as oms sent them.

    Values that were not UTF-8 are held with surrogate escapes (proxy.passthrough.client) and come
    out as their original bytes; aiohttp's own serialiser writes UTF-8 only and drops them.
    """
    lines = [status_line, *(f"{name}: {value}" for name, value in headers), "", ""]
    text = "\r\n".join(lines)
    breaks = len(lines) - 1  # every line ends in CRLF; any other CR or LF would split one
    if text.count("\n") != breaks or text.count("\r") != breaks:
        raise ValueError("line break in an answer head")
    return text.encode("utf-8", "surrogateescape")
