"""Prometheus metrics of the middleware, through prometheus_client (an optional
dependency: pip install ratelimit-web[metrics])."""
from __future__ import annotations

import threading
from typing import Dict, List, Optional, Tuple

# What a request came to, as the `outcome` label (the fields of middleware.Counters).
OUTCOMES = ("admitted", "refused", "refused_locally", "shed", "fallback_admitted", "fallback_refused",
            "database_errors", "missing_policies")


class TopSubjects:
    """The `k` subjects refused most (a space-saving summary, as the database's
    rl_top_refused keeps): a new subject past `k` takes the place of the least refused,
    inheriting its count. `add` answers the subject's count and the subject it replaced."""

    def __init__(self, k: int):
        self.k = k
        self.entries: Dict[str, List[int]] = {}  # subject: [refusals, error], in the order they came

    def add(self, subject: str) -> Tuple[int, Optional[str]]:
        entry = self.entries.get(subject)
        if entry is not None:
            entry[0] += 1
            return entry[0], None
        if len(self.entries) < self.k:
            self.entries[subject] = [1, 0]
            return 1, None
        victim = min(self.entries, key=lambda s: self.entries[s][0])
        least = self.entries.pop(victim)[0]
        self.entries[subject] = [least + 1, least]
        return least + 1, victim


class PrometheusMetrics:
    """`ratelimit_requests_total{route, policy, outcome}`, the database check's latency
    `ratelimit_check_seconds{route}` (a histogram), and the subjects the database refused
    most per route, `ratelimit_refused_subject_refusals{route, policy, subject}` (a gauge of
    at most `top_subjects` subjects per route, this process's refusals since it started),
    in `registry` (prometheus_client's default unless given). `policy` is the route's
    policy, empty for explicit limits. Pass it as the middleware's `metrics`; serve
    `prometheus_client.generate_latest(registry)` on a route of your own (/metrics)."""

    def __init__(self, registry=None, namespace: str = "ratelimit", top_subjects: int = 10):
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        self.registry = registry if registry is not None else REGISTRY
        self.requests = Counter("requests", "Requests the rate-limit middleware decided, by route, policy and outcome",
                                ["route", "policy", "outcome"], namespace=namespace, registry=self.registry)
        self.refused_subjects = Gauge("refused_subject_refusals",
                                      "Refusals of the subjects the database refused most, per route (at most "
                                      "top_subjects per route; a listed count may be above the true one by what "
                                      "the subject it replaced had)", ["route", "policy", "subject"],
                                      namespace=namespace, registry=self.registry)
        self.top_subjects = top_subjects
        self._tops: Dict[str, TopSubjects] = {}
        self._lock = threading.Lock()
        self.check_seconds = Histogram("check_seconds", "Time the database took to answer a rate-limit check",
                                       ["route"], namespace=namespace, registry=self.registry,
                                       buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0))

    def count(self, route: Optional[str], outcome: str, policy: Optional[str] = None) -> None:
        self.requests.labels(route or "", policy or "", outcome).inc()

    def refuse(self, route: Optional[str], policy: Optional[str], subject: str) -> None:
        """The database refused `subject` on `route`: its place in the route's top list."""
        with self._lock:
            top = self._tops.setdefault(route or "", TopSubjects(self.top_subjects))
            refusals, replaced = top.add(subject)
            if replaced is not None:
                self.refused_subjects.remove(route or "", policy or "", replaced)
            self.refused_subjects.labels(route or "", policy or "", subject).set(refusals)

    def observe(self, route: Optional[str], seconds: float) -> None:
        self.check_seconds.labels(route or "").observe(seconds)
