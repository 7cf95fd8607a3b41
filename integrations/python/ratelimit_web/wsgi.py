"""The WSGI middleware (Flask, or any WSGI app): the rules of rules.py over a sync limiter
(SyncPostgresLimiter, SyncSQLiteLimiter)."""
from __future__ import annotations

import json
from typing import Dict, Iterable

from .charging import KEY, RequestLimits
from .limiter import DatabaseUnavailable
from .rules import Decision, RateLimitRules, Route


class RateLimitWSGI:
    """`app.wsgi_app = RateLimitWSGI(app.wsgi_app, limiter, routes, **options)`: the
    options of `RateLimitRules`; `identify(environ)` and `tier(environ)` get the WSGI
    environ. The subject defaults to REMOTE_USER, else the client address. Every route is
    checked here, at startup: limits the engine refuses, or a policy that does not exist,
    raise RuntimeError naming the route. The limiter's own timeout bounds each check."""

    def __init__(self, app, limiter, routes: Dict[str, Route], **options):
        self.app, self.limiter = app, limiter
        self.rules = RateLimitRules(routes, **options)
        self.counters = self.rules.counters
        problem = self.rules.check_routes(limiter)
        if problem is not None:
            raise RuntimeError(f"ratelimit_web: {problem}")

    def __call__(self, environ, start_response):
        rules = self.rules
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO") or "/"
        if rules.skipped(path):
            return self.app(environ, start_response)
        shed = rules.enter(method, path)
        if shed is not None:
            return respond(start_response, shed)
        try:
            body = self.limited(environ, start_response, method, path)
        except BaseException:
            rules.leave()
            raise
        return _Finally(body, rules.leave)  # in flight until the server has sent the body

    def limited(self, environ, start_response, method: str, path: str) -> Iterable[bytes]:
        rules = self.rules
        route = rules.match(method, path)
        if route is None:
            return self.app(environ, start_response)
        forwarded = [environ["HTTP_X_FORWARDED_FOR"]] if "HTTP_X_FORWARDED_FOR" in environ else []
        subject = rules.subject(rules.identifier(route, environ), environ.get("REMOTE_USER"),
                                environ.get("REMOTE_ADDR"), forwarded)
        tier = rules.tier(environ) if rules.tier else None
        route = rules.for_request(route, environ)
        cost = rules.cost(route, environ)
        decision = rules.decide(route, subject, tier, cost, lambda: self.limiter.check(route, subject, tier, cost))
        if decision.kind == "answer":
            return respond(start_response, decision)
        limits = environ[KEY] = RequestLimits(rules, self.limiter, route, subject, tier, decision.headers)
        if decision.kind == "fallback":
            return self.app(environ, start_response)
        refunded = []

        def give_back(status):
            if not refunded and rules.refunds(route, status):
                refunded.append(True)
                try:
                    self.limiter.refund(route, subject, tier, cost)
                except DatabaseUnavailable as e:
                    rules.refund_failed(route, subject, e)

        def start_with_headers(status, headers, exc_info=None):
            give_back(int(status.split(" ", 1)[0]))  # before the client hears of the failure
            # the headers as a charge in the handler left them
            return start_response(status, [*headers, *limits.headers.items()], exc_info)

        try:
            return _Finally(self.app(environ, start_with_headers), on_error=lambda: give_back(500))
        except Exception:
            give_back(500)
            raise


def respond(start_response, decision: Decision) -> Iterable[bytes]:
    data = json.dumps(decision.body).encode()
    start_response(f"{decision.status} {_REASONS.get(decision.status, '')}".strip(),
                   [("Content-Type", "application/json"), ("Content-Length", str(len(data))),
                    *decision.headers.items()])
    return [data]


_REASONS = {413: "Content Too Large", 429: "Too Many Requests", 500: "Internal Server Error",
            503: "Service Unavailable"}


class _Finally:
    """A WSGI body that runs `done` once the server closes it, and `on_error` if making
    it raises (a handler that fails while it streams)."""

    def __init__(self, body, done=None, on_error=None):
        self.body, self.done, self.on_error = body, done, on_error

    def __iter__(self):
        try:
            yield from self.body
        except Exception:
            if self.on_error is not None:
                self.on_error()
            raise

    def close(self):
        try:
            if hasattr(self.body, "close"):
                self.body.close()
        finally:
            if self.done is not None:
                self.done()
