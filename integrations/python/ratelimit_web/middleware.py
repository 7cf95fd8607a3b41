"""The ASGI middleware (Starlette, FastAPI): the rules of rules.py over an async limiter,
with the routes' policies checked at startup (the lifespan)."""
from __future__ import annotations

import inspect
import json
import time
from typing import Dict

import anyio

from .limiter import DatabaseUnavailable
from .rules import Counters, Decision, RateLimitRules, RefusalCache, Route, log  # noqa: F401 (the package's names)


async def _maybe_await(value):
    return await value if inspect.isawaitable(value) else value


def _signed_in(scope):
    """The authenticated user's identity (Starlette's AuthenticationMiddleware), or None."""
    user = scope.get("user")
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return str(getattr(user, "identity", None) or user.display_name)


class RateLimitMiddleware:
    """`RateLimitMiddleware(app, limiter, routes, **options)`: the options of
    `RateLimitRules` (identify, tier, skip, trusted_proxies, check_timeout, fallback_share,
    refusal_cache, max_in_flight, counters, metrics, ...). `identify(request)` and
    `tier(request)` get a Starlette Request and may be async. At startup (ASGI lifespan)
    every route's policy must exist, or the application fails to start with a message
    naming the route and the policy."""

    def __init__(self, app, limiter, routes: Dict[str, Route], **options):
        self.app, self.limiter = app, limiter
        self.rules = RateLimitRules(routes, **options)
        self.counters = self.rules.counters

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self.app(scope, receive, self.checking_policies_at_startup(send))
        if scope["type"] != "http" or scope["path"] in self.rules.skip:
            return await self.app(scope, receive, send)
        shed = self.rules.enter(scope["method"], scope["path"])
        if shed is not None:
            return await self.respond(send, shed)
        try:
            await self.limited(scope, receive, send)
        finally:
            self.rules.leave()

    def checking_policies_at_startup(self, send):
        """`send` for the lifespan: startup completes only once every route's policy is
        found (a database that does not answer is logged and let be: the fallback serves)."""

        async def send_checked(message):
            if message["type"] == "lifespan.startup.complete":
                problem = await self.missing_policy()
                if problem is not None:
                    log.error("ratelimit_web: %s", problem)
                    message = {"type": "lifespan.startup.failed", "message": problem}
            await send(message)

        return send_checked

    async def missing_policy(self):
        for route in self.rules.policy_routes():
            try:
                with anyio.fail_after(max(self.rules.check_timeout, 5.0)):
                    exists = await self.limiter.policy_exists(route.policy)
            except (DatabaseUnavailable, TimeoutError) as e:
                self.rules.startup_unchecked(e)
                return None
            if not exists:
                return self.rules.missing(route)
        return None

    async def limited(self, scope, receive, send):
        rules = self.rules
        route = rules.match(scope["method"], scope["path"])
        if route is None:
            return await self.app(scope, receive, send)
        from starlette.requests import Request

        request = Request(scope, receive)
        identified = await _maybe_await(rules.identify(request)) if rules.identify else None
        forwarded = [v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"x-forwarded-for"]
        subject = rules.subject(identified, _signed_in(scope), scope["client"][0] if scope.get("client") else None,
                                forwarded)
        tier = await _maybe_await(rules.tier(request)) if rules.tier else None
        cost = rules.cost(route, request)
        decision = rules.cached(route, subject, tier)
        if decision is None:
            started = time.perf_counter()
            try:
                with anyio.fail_after(rules.check_timeout):
                    answer = await self.limiter.check(route, subject, tier, cost)
            except Exception as e:
                decision = rules.failed(route, subject, tier, cost, e)
            else:
                decision = rules.answered(route, subject, tier, answer, time.perf_counter() - started)
        if decision.kind == "answer":
            return await self.respond(send, decision)
        if decision.kind == "fallback":
            return await self.app(scope, receive, send)
        await self.run_admitted(route, subject, tier, cost, decision.headers, scope, receive, send)

    async def run_admitted(self, route, subject, tier, cost, headers, scope, receive, send):
        """The handler, with the limit's headers on its response; a 5xx or an exception
        gives back what the check took."""
        extra = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in headers.items()]
        refunded = False

        async def give_back():
            nonlocal refunded
            if not refunded:
                refunded = True
                await self.refund(route, subject, tier, cost)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                if message["status"] >= 500:
                    await give_back()  # before the client hears of the failure
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            await give_back()
            raise

    async def refund(self, route, subject, tier, cost):
        try:
            with anyio.fail_after(self.rules.check_timeout):
                await self.limiter.refund(route, subject, tier, cost)
        except (DatabaseUnavailable, TimeoutError) as e:
            self.rules.refund_failed(route, subject, e)

    @staticmethod
    async def respond(send, decision: Decision):
        data = json.dumps(decision.body).encode()
        raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        raw += [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in decision.headers.items()]
        await send({"type": "http.response.start", "status": decision.status, "headers": raw})
        await send({"type": "http.response.body", "body": data})
