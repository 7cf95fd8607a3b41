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
from collections import OrderedDict
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


@dataclass
class Counters:
    """What one middleware did in this process: the figures metrics export."""

    checks: int = 0  # checks the database answered
    admitted: int = 0
    refused: int = 0
    refused_locally: int = 0  # answered from the refused-identifier cache, no database call
    shed: int = 0  # 503 before any work: too many requests in flight
    fallback_admitted: int = 0
    fallback_refused: int = 0
    database_errors: int = 0  # the database did not answer in time
    missing_policies: int = 0


class RefusalCache:
    """Subjects just refused, per route and tier, until their refusal's retry time ends:
    at most `size` (the least recently used forgotten). It only ever refuses: an entry
    repeats the database's refusal, its waits counted down, and goes when the wait ends."""

    def __init__(self, size: int, clock: Callable[[], float] = time.monotonic):
        self.size, self.clock = size, clock
        self.entries: "OrderedDict[tuple, Tuple[int, dict, dict, float]]" = OrderedDict()

    def put(self, key: tuple, status: int, body: dict, headers: dict, wait_seconds: float) -> None:
        self.entries[key] = (status, body, headers, self.clock() + wait_seconds)
        self.entries.move_to_end(key)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)

    def get(self, key: tuple) -> Optional[Tuple[int, dict, dict]]:
        entry = self.entries.get(key)
        if entry is None:
            return None
        status, body, headers, until = entry
        left = until - self.clock()
        if left <= 0:
            del self.entries[key]
            return None
        self.entries.move_to_end(key)
        seconds = max(1, math.ceil(left))
        headers = {**headers, "Retry-After": str(seconds)}
        return status, {**body, "retry_after": seconds}, headers


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
    `tier(request)` picks the tier. Paths in `skip` are never limited (nor shed).

    At startup (ASGI lifespan) every route's policy must exist, or the application fails
    to start with a message naming the route and the policy. Opt-in: `refusal_cache`
    (a number of entries, e.g. 10_000) answers a subject just refused on a route with
    429 locally, without a database call, until its refusal's retry time; and
    `max_in_flight` answers 503 with Retry-After (`shed_retry_after`) before any work
    once that many requests of this process are in flight. `counters` counts what it did;
    `metrics` (e.g. `metrics.PrometheusMetrics()`) is told each outcome and each check's
    latency."""

    def __init__(self, app, limiter, routes: Dict[str, Route], *, identify: Optional[Callable] = None,
                 tier: Optional[Callable] = None, skip: Iterable[str] = ("/health", "/ready"),
                 trusted_proxies: Iterable[str] = (), check_timeout: float = 0.05, fallback_share: float = 0.5,
                 unavailable_retry_after: int = 5, log_interval: float = 60.0, refusal_cache: int = 0,
                 max_in_flight: Optional[int] = None, shed_retry_after: int = 1,
                 counters: Optional[Counters] = None, metrics=None):
        self.app, self.limiter = app, limiter
        self.counters = counters if counters is not None else Counters()
        self.metrics = metrics
        self.refusals = RefusalCache(refusal_cache) if refusal_cache else None
        self.max_in_flight, self.shed_retry_after, self.in_flight = max_in_flight, shed_retry_after, 0
        self.policy_logged_at: Dict[str, float] = {}
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
        if scope["type"] == "lifespan":
            return await self.app(scope, receive, self.checking_policies_at_startup(send))
        if scope["type"] != "http" or scope["path"] in self.skip:
            return await self.app(scope, receive, send)
        if self.max_in_flight is not None and self.in_flight >= self.max_in_flight:
            route = self.match(scope["method"], scope["path"])
            self.note(route, "shed")
            body = {"detail": "Service Overloaded", "retry_after": self.shed_retry_after}
            return await self.respond(send, 503, body, {"Retry-After": str(self.shed_retry_after)})
        self.in_flight += 1
        try:
            await self.limited(scope, receive, send)
        finally:
            self.in_flight -= 1

    def note(self, route: Optional[Route], outcome: str) -> None:
        """Counts what a request came to (a field of Counters), and tells the metrics."""
        setattr(self.counters, outcome, getattr(self.counters, outcome) + 1)
        if self.metrics is not None:
            self.metrics.count(route.name if route else None, outcome)

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

    async def missing_policy(self) -> Optional[str]:
        for _, _, route in self.routes:
            if route.policy is None:
                continue
            try:
                with anyio.fail_after(max(self.check_timeout, 5.0)):
                    exists = await self.limiter.policy_exists(route.policy)
            except (DatabaseUnavailable, TimeoutError) as e:
                log.warning("ratelimit_web: could not check the routes' policies at startup (%s); "
                            "the fallback serves until the database answers", _why(e))
                return None
            if not exists:
                return f"route {route.name!r}: there is no policy named {route.policy!r} in the database"
        return None

    async def limited(self, scope, receive, send):
        route = self.match(scope["method"], scope["path"])
        if route is None:
            return await self.app(scope, receive, send)
        from starlette.requests import Request

        request = Request(scope, receive)
        subject = (await _maybe_await(self.identify(request)) if self.identify else None) or self.subject(scope)
        tier = await _maybe_await(self.tier(request)) if self.tier else None
        cost = float(route.cost(request) if callable(route.cost) else route.cost)
        refused = self.refusals.get((route.name, tier, subject)) if self.refusals else None
        if refused is not None:
            self.note(route, "refused_locally")
            return await self.respond(send, *refused)
        started = time.perf_counter()
        try:
            with anyio.fail_after(self.check_timeout):
                answer = await self.limiter.check(route, subject, tier, cost)
        except (DatabaseUnavailable, TimeoutError) as e:
            self.note(route, "database_errors")
            return await self.unavailable(route, subject, tier, cost, e, scope, receive, send)
        except Exception as e:
            if route.policy is not None and "there is no policy named" in str(e):
                return await self.policy_missing(route, e, send)
            raise
        self.counters.checks += 1
        if self.metrics is not None:
            self.metrics.observe(route.name, time.perf_counter() - started)
        self.recovered()
        self.learn(route, tier, answer)
        if not answer.admitted:
            self.note(route, "refused")
            return await self.refuse(route, subject, tier, answer, send)
        self.note(route, "admitted")
        await self.run_admitted(route, subject, tier, cost, answer, scope, receive, send)

    async def policy_missing(self, route: Route, error: Exception, send):
        """A route's policy is gone: a JSON 500 that says so, logged once per interval."""
        self.note(route, "missing_policies")
        now = time.monotonic()
        if now - self.policy_logged_at.get(route.name, float("-inf")) >= self.log_interval:
            self.policy_logged_at[route.name] = now
            log.error("ratelimit_web: route %r: there is no policy named %r in the database (%s)", route.name,
                      route.policy, _why(error))
        body = {"detail": "Rate Limit Policy Missing", "route": route.name, "policy": route.policy}
        await self.respond(send, 500, body, {})

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

    async def refuse(self, route: Route, subject: str, tier, answer: Answer, send):
        """429 with the headers (kept in the refused-identifier cache until the wait ends);
        413 for a cost above a limit, which no wait admits."""
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
        wait_ms = r.get("retry_after_ms")
        if self.refusals is not None and not too_large and isinstance(wait_ms, (int, float)) and wait_ms > 0:
            self.refusals.put((route.name, tier, subject), 429, body, h, wait_ms / 1000)
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
                        "the others use local buckets at %g of their limit", _why(error, self.check_timeout),
                        self.fallback_share)
        limit = None if route.sensitive else (self.learned.get((route.name, tier)) or route.first_bucket(tier))
        if limit is None:
            self.note(route, "fallback_refused")
            body = {"detail": "Service Unavailable", "retry_after": self.unavailable_retry_after}
            return await self.respond(send, 503, body, {"Retry-After": str(self.unavailable_retry_after)})
        bucket = self.local_buckets.get((route.name, tier))
        if bucket is None:
            share = self.fallback_share
            bucket = self.local_buckets[(route.name, tier)] = LocalBucket(limit[0] * share, limit[1] * share)
        wait = bucket.take(subject, cost)
        if wait:
            self.note(route, "fallback_refused")
            retry_after = None if wait == float("inf") else max(1, math.ceil(wait))
            body = {"detail": "Too Many Requests", "limit": int(bucket.burst), "remaining": 0,
                    "reset": retry_after or 0, "retry_after": retry_after}
            return await self.respond(send, 429, body, {"Retry-After": str(retry_after)} if retry_after else {})
        self.note(route, "fallback_admitted")
        await self.app(scope, receive, send)

    def recovered(self):
        if self.outage_since is not None:
            log.warning("ratelimit_web: the database answers again after %.1f s", time.monotonic() - self.outage_since)
            self.outage_since = None


def _why(error: BaseException, timeout: Optional[float] = None) -> str:
    """What failed, for a log line: the error's words, or, for a timeout (which has none),
    how long it waited."""
    text = str(error).strip()
    if text:
        return text
    if isinstance(error, TimeoutError) and timeout is not None:
        return f"no answer within {timeout * 1000:g} ms"
    return type(error).__name__
