"""Prometheus metrics, one registry per app (so several apps in one process never collide).

Exposed at ``GET /metrics`` in the Prometheus text format. Names and labels:

- ``omsproxy_requests_total{route_class, status}``: requests answered, by route class
  (``passthrough``, ``run_submit``, ``run_log``, ``run_stop``, ``run_status``, ``service_state``,
  ``health``) and HTTP status;
- ``omsproxy_request_duration_seconds{route_class}``: time in the proxy, first byte in to last
  byte out (a streamed download counts whole);
- ``omsproxy_oms_request_duration_seconds``: time until oms's response headers;
- ``omsproxy_kubernetes_request_duration_seconds{operation}``: each Kubernetes API call, retries
  included;
- ``omsproxy_mpijob_submissions_total{outcome}``: ``created``, ``conflict``, ``quota``,
  ``busy`` (``runs.max_concurrent_submissions`` reached), ``invalid``, ``rejected`` (request
  refused before Kubernetes), ``error`` (anything else);
- ``omsproxy_launched_runs{phase}``: launched runs the proxy currently knows, by phase;
- ``omsproxy_run_records`` and ``omsproxy_run_record_bytes``: run records kept (the run history,
  ``history.*``) and their compressed size, as this replica's informer sees them;
- ``omsproxy_run_records_total{outcome}``: what this replica did with run records since it
  started: ``archived``, ``already`` (another replica was first), ``failed``, ``expired``
  (deleted by retention), ``truncated`` (archived with lines left out by the size cap).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.errors import (
    Conflict,
    KubeAlreadyExists,
    KubeInvalid,
    KubeQuotaExceeded,
    ProxyError,
    TooManyRequests,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _PhaseCollector(Collector):
    """Reads the run phases from a callback at scrape time (no work on the request path)."""

    def __init__(self) -> None:
        self.source: Callable[[], Mapping[str, int]] | None = None

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "omsproxy_launched_runs",
            "Launched MPIJob runs known to the proxy, by phase",
            labels=["phase"],
        )
        if self.source is not None:
            for phase, count in sorted(self.source().items()):
                family.add_metric([phase], count)
        yield family


@dataclasses.dataclass(frozen=True)
class HistoryFigures:
    """What ``/metrics`` shows of the run history (read at scrape time)."""

    records: int
    bytes: int
    outcomes: Mapping[str, int]


class _HistoryCollector(Collector):
    """Reads the run history's figures from a callback at scrape time."""

    def __init__(self) -> None:
        self.source: Callable[[], HistoryFigures | None] | None = None

    def collect(self) -> Iterable[Metric]:
        figures = self.source() if self.source is not None else None
        records = GaugeMetricFamily("omsproxy_run_records", "Run records kept (run history)")
        size = GaugeMetricFamily(
            "omsproxy_run_record_bytes", "Compressed bytes of the run records kept"
        )
        outcomes = CounterMetricFamily(
            "omsproxy_run_records", "Run records by what this replica did", labels=["outcome"]
        )
        if figures is not None:
            records.add_metric([], figures.records)
            size.add_metric([], figures.bytes)
            for outcome, count in sorted(figures.outcomes.items()):
                outcomes.add_metric([outcome], count)
        yield records
        yield size
        yield outcomes


class Metrics:
    """The proxy's metrics in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "omsproxy_requests", "Requests answered", ["route_class", "status"], registry=r
        )
        self.request_duration = Histogram(
            "omsproxy_request_duration_seconds",
            "Time in the proxy per request",
            ["route_class"],
            buckets=_FAST,
            registry=r,
        )
        self.oms_duration = Histogram(
            "omsproxy_oms_request_duration_seconds",
            "Time until oms's response headers",
            buckets=_FAST,
            registry=r,
        )
        self.kube_duration = Histogram(
            "omsproxy_kubernetes_request_duration_seconds",
            "Kubernetes API calls, retries included",
            ["operation"],
            buckets=_FAST,
            registry=r,
        )
        self.submissions = Counter(
            "omsproxy_mpijob_submissions", "MPIJob submissions by outcome", ["outcome"], registry=r
        )
        self.phases = _PhaseCollector()
        r.register(self.phases)
        self.history = _HistoryCollector()
        r.register(self.history)
        # Labelled children, looked up once (``labels()`` takes a lock and checks its arguments).
        self._counted: dict[tuple[str, int], Counter] = {}
        self._timed: dict[str, Histogram] = {}

    def count_request(self, route_class: str, status: int, seconds: float) -> None:
        """One answered request: ``omsproxy_requests_total`` and its duration."""
        counter = self._counted.get((route_class, status))
        if counter is None:
            counter = self._counted[(route_class, status)] = self.requests.labels(
                route_class, str(status)
            )
        counter.inc()
        histogram = self._timed.get(route_class)
        if histogram is None:
            histogram = self._timed[route_class] = self.request_duration.labels(route_class)
        histogram.observe(seconds)

    def render(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.registry)


def submission_outcome(status: int, error: ProxyError | None) -> str:
    """The outcome label of an intercepted submission, from its answer."""
    if status == 200:
        return "created"
    if isinstance(error, Conflict | KubeAlreadyExists):
        return "conflict"
    if isinstance(error, KubeQuotaExceeded):
        return "quota"
    if isinstance(error, TooManyRequests):
        return "busy"
    if isinstance(error, KubeInvalid):
        return "invalid"
    if 400 <= status < 500:
        return "rejected"
    return "error"
