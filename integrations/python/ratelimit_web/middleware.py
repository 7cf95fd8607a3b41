"""An ASGI middleware (Starlette, FastAPI) limiting routes by policies or explicit limits
kept in the database, with a fallback for when the database does not answer."""
from __future__ import annotations

import fnmatch
import inspect
import ipaddress
import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Optional, Tuple, Union

import anyio

from .fallback import LocalBucket
from .limiter import Answer, DatabaseUnavailable

log = logging.getLogger("ratelimit_web")


@dataclass
class Route:
    """How one route (or route pattern) is limited: a policy's name (rl_check, the tier as
    its tier), or explicit `limits` as rl_take_all items without key and cost (buckets
    `{"burst", "refill_per_minute"}`, budgets `{"period", "quota"}`) with `tiers` giving
    their multipliers. `cost` is a number or a function of the request. A `sensitive`
    route fails closed (503) while the database is unreachable; the others admit through
    a local bucket at the middleware's `fallback_share` of their first bucket (for a
    policy, the one its last answer reported, or `fallback` = (burst, refill_per_minute)
    until there was one)."""

    policy: Optional[str] = None
    limits: Optional[list] = None
    tiers: Dict[str, float] = field(default_factory=dict)
    cost: Union[float, Callable[[Any], float]] = 1
    sensitive: bool = False
    fallback: Optional[Tuple[float, float]] = None
    name: str = ""

    def __post_init__(self):
        if (self.policy is None) == (self.limits is None):
            raise ValueError("Route: give either policy or limits")
        for limit in self.limits or ():
            if not ({"burst", "refill_per_minute"} <= limit.keys() or {"period", "quota"} <= limit.keys()):
                raise ValueError(f"Route: limit {limit!r} is neither a bucket nor a budget")

    def multiplier(self, tier: Optional[str]) -> float:
        if tier is None or not self.tiers:  # a route without tiers is the same for all
            return 1.0
        if tier not in self.tiers:
            raise ValueError(f"Route {self.name!r}: unknown tier {tier!r}")
        return float(self.tiers[tier])

    def first_bucket(self, tier: Optional[str]) -> Optional[Tuple[float, float]]:
        for limit in self.limits or ():
            if "burst" in limit:
                m = self.multiplier(tier)
                return limit["burst"] * m, limit["refill_per_minute"] * m
        return self.fallback


def _networks(addresses: Iterable[str]) -> list:
    return [ipaddress.ip_network(a, strict=False) for a in addresses]


def _in(address: str, networks: list) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in n for n in networks)


def client_address(scope, trusted: list) -> str:
    """The client's address: the peer's, or, when the peer is a trusted proxy, the nearest
    address in X-Forwarded-For that is not one (read right to left: only what trusted
    proxies appended can be believed)."""
    peer = scope["client"][0] if scope.get("client") else "unknown"
    if not trusted or not _in(peer, trusted):
        return peer
    forwarded = [part.strip() for name, value in scope.get("headers", ()) if name == b"x-forwarded-for"
                 for part in value.decode("latin-1").split(",") if part.strip()]
    for address in reversed(forwarded):
        if not _in(address, trusted):
            return address
    return forwarded[0] if forwarded else peer


async def _maybe_await(value):
    return await value if inspect.isawaitable(value) else value


class RateLimitMiddleware:
    """Limits the routes in `routes` (`{"/login": Route(policy="login"), "POST /api/*":
    Route(limits=[...])}`: a path or glob, optionally after a method; the first match
    applies). `identify(request)` names the subject (default: the authenticated user,
    else the client address, believing X-Forwarded-For only from `trusted_proxies`);
    `tier(request)` picks the tier. Paths in `skip` are never limited."""

    def __init__(self, app, limiter, routes: Dict[str, Route], *, identify: Optional[Callable] = None,
                 tier: Optional[Callable] = None, skip: Iterable[str] = ("/health", "/ready"),
                 trusted_proxies: Iterable[str] = (), check_timeout: float = 0.05, fallback_share: float = 0.5,
                 unavailable_retry_after: int = 5, log_interval: float = 60.0):
        self.app, self.limiter = app, limiter
        self.routes = []
        for pattern, route in routes.items():
            method, _, path = pattern.rpartition(" ")
            route.name = route.name or pattern
            self.routes.append((method.upper() or None, path, route))
        self.identify, self.tier = identify, tier
        self.skip = frozenset(skip)
        self.trusted = _networks(trusted_proxies)
        self.check_timeout, self.fallback_share = check_timeout, fallback_share
        self.unavailable_retry_after, self.log_interval = unavailable_retry_after, log_interval
        self.local_buckets: Dict[tuple, LocalBucket] = {}
        self.learned: Dict[tuple, Tuple[float, float]] = {}
        self.outage_since: Optional[float] = None
        self.logged_at = float("-inf")

    def match(self, method: str, path: str) -> Optional[Route]:
        for want, pattern, route in self.routes:
            if (want is None or want == method) and fnmatch.fnmatchcase(path, pattern):
                return route
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in self.skip:
            return await self.app(scope, receive, send)
        route = self.match(scope["method"], scope["path"])
        if route is None:
            return await self.app(scope, receive, send)
        from starlette.requests import Request

        request = Request(scope, receive)
        subject = (await _maybe_await(self.identify(request)) if self.identify else None) or self.subject(scope)
        tier = await _maybe_await(self.tier(request)) if self.tier else None
        cost = float(route.cost(request) if callable(route.cost) else route.cost)
        try:
            with anyio.fail_after(self.check_timeout):
                answer = await self.limiter.check(route, subject, tier, cost)
        except (DatabaseUnavailable, TimeoutError) as e:
            return await self.unavailable(route, subject, tier, cost, e, scope, receive, send)
        self.recovered()
        self.learn(route, tier, answer)
        if not answer.admitted:
            return await self.refuse(answer, send)
        await self.run_admitted(route, subject, tier, cost, answer, scope, receive, send)

    def subject(self, scope) -> str:
        user = scope.get("user")
        if user is not None and getattr(user, "is_authenticated", False):
            return "user:" + str(getattr(user, "identity", None) or user.display_name)
        return "ip:" + client_address(scope, self.trusted)

    async def run_admitted(self, route, subject, tier, cost, answer: Answer, scope, receive, send):
        """The handler, with the limit's headers on its response; a 5xx or an exception
        gives back what the check took."""
        extra = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in answer.headers.items()]
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
            with anyio.fail_after(self.check_timeout):
                await self.limiter.refund(route, subject, tier, cost)
        except (DatabaseUnavailable, TimeoutError) as e:
            log.warning("ratelimit_web: could not refund %s for %s: %s", route.name, subject, e or "timed out")

    async def refuse(self, answer: Answer, send):
        """429 with the headers; 413 for a cost above a limit, which no wait admits."""
        h = answer.headers
        r = answer.result
        too_large = bool(r.get("exceeds_limit")) or any(i.get("exceeds_limit") for i in r.get("items", ()))
        retry_after = h.get("Retry-After")
        detail = "Blocked" if r.get("blocked") else "Cost Above Limit" if too_large else "Too Many Requests"
        body = {"detail": detail,
                "limit": int(h.get("X-RateLimit-Limit", 0)),
                "remaining": int(h.get("X-RateLimit-Remaining", 0)),
                "reset": int(h.get("X-RateLimit-Reset", 0)),
                "retry_after": int(retry_after) if retry_after is not None else None}
        await self.respond(send, 413 if too_large else 429, body, h)

    @staticmethod
    async def respond(send, status: int, body: dict, headers: dict):
        data = json.dumps(body).encode()
        raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        raw += [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": data})

    def learn(self, route: Route, tier, answer: Answer):
        """A policy's first bucket, as its answers report it, for the fallback."""
        if route.policy is None:
            return
        for item in answer.result.get("items", ()):
            if item.get("refill_seconds"):
                self.learned[(route.name, tier)] = (item["limit"], item["limit"] * 60.0 / item["refill_seconds"])
                return

    async def unavailable(self, route, subject, tier, cost, error, scope, receive, send):
        """The database did not answer in time: sensitive routes (and routes whose limit
        is not known here) answer 503; the others take from a local bucket."""
        now = time.monotonic()
        if self.outage_since is None:
            self.outage_since = now
        if now - self.logged_at >= self.log_interval:
            self.logged_at = now
            log.warning("ratelimit_web: the database did not answer (%s): sensitive routes answer 503, "
                        "the others use local buckets at %g of their limit", error or "timed out", self.fallback_share)
        limit = None if route.sensitive else (self.learned.get((route.name, tier)) or route.first_bucket(tier))
        if limit is None:
            body = {"detail": "Service Unavailable", "retry_after": self.unavailable_retry_after}
            return await self.respond(send, 503, body, {"Retry-After": str(self.unavailable_retry_after)})
        bucket = self.local_buckets.get((route.name, tier))
        if bucket is None:
            share = self.fallback_share
            bucket = self.local_buckets[(route.name, tier)] = LocalBucket(limit[0] * share, limit[1] * share)
        wait = bucket.take(subject, cost)
        if wait:
            retry_after = None if wait == float("inf") else max(1, math.ceil(wait))
            body = {"detail": "Too Many Requests", "limit": int(bucket.burst), "remaining": 0,
                    "reset": retry_after or 0, "retry_after": retry_after}
            return await self.respond(send, 429, body, {"Retry-After": str(retry_after)} if retry_after else {})
        await self.app(scope, receive, send)

    def recovered(self):
        if self.outage_since is not None:
            log.warning("ratelimit_web: the database answers again after %.1f s", time.monotonic() - self.outage_since)
            self.outage_since = None
