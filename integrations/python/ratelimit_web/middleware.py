"""The ASGI middleware (Starlette, FastAPI): the rules of rules.py over an async limiter,
with the routes' policies checked at startup (the lifespan)."""
from __future__ import annotations

import inspect
import json
import time
from typing import Dict

import anyio

from .charging import KEY, RequestLimits, awaited, from_worker_thread
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


def _has_body(scope) -> bool:
    """Whether a request body is on its way (a length above 0, or chunked)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return value.strip() not in (b"", b"0")
        if name == b"transfer-encoding":
            return True
    return False


class RateLimitMiddleware:
    """`RateLimitMiddleware(app, limiter, routes, **options)`: the options of
    `RateLimitRules` (identify, tier, skip, trusted_proxies, ipv6_prefix, refund_on,
    fallback_share, refusal_cache, max_in_flight, counters, metrics, ...). `identify(request)`
    and `tier(request)` get a Starlette Request and may be async. At startup (ASGI lifespan)
    every route's limits are validated by the engine and every route's policy must exist,
    or the application fails to start with a message naming the route. The limiter's own
    `timeout` bounds each check (see its class)."""

    def __init__(self, app, limiter, routes: Dict[str, Route], **options):
        self.app, self.limiter = app, limiter
        self.rules = RateLimitRules(routes, **options)
        self.counters = self.rules.counters

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self.app(scope, receive, self.checking_routes_at_startup(send))
        if scope["type"] != "http" or self.rules.skipped(scope["path"]):
            return await self.app(scope, receive, send)
        receiving = _has_body(scope)
        shed = self.rules.enter(scope["method"], scope["path"], receiving=receiving)
        if shed is not None:
            return await self.respond(send, shed)
        state = {"receiving": receiving, "abandoned": False}

        async def counted_receive():
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False) and state["receiving"]:
                state["receiving"] = False
                self.rules.received()
            elif message["type"] == "http.disconnect":
                state["abandoned"] = True  # the client left before its body was read
            return message

        try:
            await self.limited(scope, counted_receive, send, state)
        finally:
            self.rules.leave(receiving=state["receiving"])

    def checking_routes_at_startup(self, send):
        """`send` for the lifespan: startup completes only once every route's limits are
        valid and every route's policy is found (a database that does not answer is
        logged and let be: the fallback serves)."""

        async def send_checked(message):
            if message["type"] == "lifespan.startup.complete":
                problem = await self.startup_problem()
                if problem is not None:
                    log.error("ratelimit_web: %s", problem)
                    message = {"type": "lifespan.startup.failed", "message": problem}
            await send(message)

        return send_checked

    async def startup_problem(self):
        try:
            with anyio.fail_after(max(getattr(self.limiter, "timeout", 1.0), 5.0)):
                return await self.rules.check_routes_async(self.limiter)
        except (DatabaseUnavailable, TimeoutError) as e:
            self.rules.startup_unchecked(e)
            return None

    async def limited(self, scope, receive, send, state):
        rules = self.rules
        route = rules.match(scope["method"], scope["path"])
        if route is None:
            return await self.app(scope, receive, send)
        from starlette.requests import Request

        request = Request(scope, receive)
        identified = None
        for identify in rules.identifiers(route):  # the route's own first, then the middleware's
            identified = await _maybe_await(identify(request))
            if identified is not None and identified != "":
                break
        forwarded = [v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"x-forwarded-for"]
        subject = rules.subject(identified, _signed_in(scope), scope["client"][0] if scope.get("client") else None,
                                forwarded)
        tier = await _maybe_await(rules.tier(request)) if rules.tier else None
        route = rules.for_request(route, request)
        cost = rules.cost(route, request)
        decision, slot = rules.begin_check(route, subject, tier)
        if decision is None:
            started = time.perf_counter()
            try:
                answer = await self.limiter.check(route, subject, tier, cost)
            except Exception as e:
                decision = rules.failed(route, subject, tier, cost, e)
            else:
                decision = rules.answered(route, subject, tier, answer, time.perf_counter() - started)
            finally:
                rules.end_check(slot)
        if decision.kind == "answer":
            return await self.respond(send, decision)
        limits = scope[KEY] = RequestLimits(rules, self.limiter, route, subject, tier, decision.headers,
                                                   from_worker_thread, awaited)
        if decision.kind == "fallback":
            return await self.app(scope, receive, send)
        await self.run_admitted(route, subject, tier, cost, limits, scope, receive, send, state)

    async def run_admitted(self, route, subject, tier, cost, limits, scope, receive, send, state):
        """The handler, with the limit's headers on its response (as a charge in the
        handler left them); a response whose status the route refunds (refund_on), or an
        exception when it refunds 500, gives back what the check took, unless the client
        abandoned its request."""
        refunded = False

        async def give_back(status):
            nonlocal refunded
            if not refunded and not state["abandoned"] and self.rules.refunds(route, status):
                refunded = True
                await self.refund(route, subject, tier, cost)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                await give_back(message["status"])  # before the client hears of the failure
                extra = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in limits.headers.items()]
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            await give_back(500)
            raise

    async def refund(self, route, subject, tier, cost):
        try:
            await self.limiter.refund(route, subject, tier, cost)
        except DatabaseUnavailable as e:
            self.rules.refund_failed(route, subject, e)

    @staticmethod
    async def respond(send, decision: Decision):
        data = json.dumps(decision.body).encode()
        raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        raw += [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in decision.headers.items()]
        await send({"type": "http.response.start", "status": decision.status, "headers": raw})
        await send({"type": "http.response.body", "body": data})
