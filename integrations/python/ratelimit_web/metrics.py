"""Prometheus metrics of the middleware, through prometheus_client (an optional
dependency: pip install ratelimit-web[metrics])."""
from __future__ import annotations

from typing import Optional

# What a request came to, as the `outcome` label (the fields of middleware.Counters).
OUTCOMES = ("admitted", "refused", "refused_locally", "shed", "fallback_admitted", "fallback_refused",
            "database_errors", "missing_policies")


class PrometheusMetrics:
    """`ratelimit_requests_total{route, outcome}` and the database check's latency,
    `ratelimit_check_seconds{route}` (a histogram), in `registry` (prometheus_client's
    default unless given). Pass it as the middleware's `metrics`; serve
    `prometheus_client.generate_latest(registry)` on a route of your own (/metrics)."""

    def __init__(self, registry=None, namespace: str = "ratelimit"):
        from prometheus_client import REGISTRY, Counter, Histogram

        self.registry = registry if registry is not None else REGISTRY
        self.requests = Counter("requests", "Requests the rate-limit middleware decided, by route and outcome",
                                ["route", "outcome"], namespace=namespace, registry=self.registry)
        self.check_seconds = Histogram("check_seconds", "Time the database took to answer a rate-limit check",
                                       ["route"], namespace=namespace, registry=self.registry,
                                       buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0))

    def count(self, route: Optional[str], outcome: str) -> None:
        self.requests.labels(route or "", outcome).inc()

    def observe(self, route: Optional[str], seconds: float) -> None:
        self.check_seconds.labels(route or "").observe(seconds)
