"""The rules every framework's middleware follows, written once: which route a request is,
who its subject is, what the database's answer (or its silence) comes to, the
refused-identifier cache, load shedding and the fallback. The adapters (ASGI in
middleware.py, WSGI in wsgi.py, Django in django.py) only read requests and write
responses; the limiter they call may be async or not, so a check is split in two: what
comes before the database call and what its answer or error decides."""
from __future__ import annotations

import fnmatch
import ipaddress
import logging
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from .fallback import LocalBucket
from .limiter import Answer, DatabaseUnavailable, is_missing_policy

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


def client_address(peer: Optional[str], forwarded: Iterable[str], trusted: list) -> str:
    """The client's address: the peer's, or, when the peer is a trusted proxy, the nearest
    address in X-Forwarded-For (`forwarded`: the header's values) that is not one (read
    right to left: only what trusted proxies appended can be believed)."""
    peer = peer or "unknown"
    if not trusted or not _in(peer, trusted):
        return peer
    hops = [part.strip() for value in forwarded for part in value.split(",") if part.strip()]
    for address in reversed(hops):
        if not _in(address, trusted):
            return address
    return hops[0] if hops else peer


@dataclass
class Decision:
    """What a request comes to: `admit` (run the handler, add `headers` to its response;
    a 5xx or an exception gives back what the check took), `fallback` (run the handler,
    admitted by a local bucket: nothing to add or give back), or `answer` (reply `status`
    with the JSON `body` and `headers`, without running the handler)."""

    kind: str
    status: int = 200
    body: Optional[dict] = None
    headers: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def reply(cls, status: int, body: dict, headers: Optional[dict] = None) -> "Decision":
        return cls("answer", status, body, dict(headers or {}))


class RateLimitRules:
    """Limits the routes in `routes` (`{"/login": Route(policy="login"), "POST /api/*":
    Route(limits=[...])}`: a path or glob, optionally after a method; the first match
    applies). `identify(request)` names the subject (default: the authenticated user,
    else the client address, believing X-Forwarded-For only from `trusted_proxies`);
    `tier(request)` picks the tier. Paths in `skip` are never limited (nor shed).
    Opt-in: `refusal_cache` (a number of entries, e.g. 10_000) answers a subject just
    refused on a route with 429 locally, without a database call, until its refusal's
    retry time; `max_in_flight` answers 503 with Retry-After (`shed_retry_after`) before
    any work once that many requests of this process are in flight. `counters` counts
    what it did; `metrics` (e.g. `metrics.PrometheusMetrics()`) is told each outcome and
    each check's latency."""

    def __init__(self, routes: Dict[str, Route], *, identify: Optional[Callable] = None,
                 tier: Optional[Callable] = None, skip: Iterable[str] = ("/health", "/ready"),
                 trusted_proxies: Iterable[str] = (), check_timeout: float = 0.05, fallback_share: float = 0.5,
                 unavailable_retry_after: int = 5, log_interval: float = 60.0, refusal_cache: int = 0,
                 max_in_flight: Optional[int] = None, shed_retry_after: int = 1,
                 counters: Optional[Counters] = None, metrics=None):
        self.counters = counters if counters is not None else Counters()
        self.metrics = metrics
        self.refusals = RefusalCache(refusal_cache) if refusal_cache else None
        self.max_in_flight, self.shed_retry_after, self.in_flight = max_in_flight, shed_retry_after, 0
        self.in_flight_lock = threading.Lock()  # WSGI and Django serve requests on threads
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
        if path in self.skip:
            return None
        for want, pattern, route in self.routes:
            if (want is None or want == method) and fnmatch.fnmatchcase(path, pattern):
                return route
        return None

    def note(self, route: Optional[Route], outcome: str) -> None:
        """Counts what a request came to (a field of Counters), and tells the metrics."""
        setattr(self.counters, outcome, getattr(self.counters, outcome) + 1)
        if self.metrics is not None:
            self.metrics.count(route.name if route else None, outcome)

    # -- load shedding ---------------------------------------------------------------

    def enter(self, method: str, path: str) -> Optional[Decision]:
        """A request (not on a skip path) begins: None, or the 503 that sheds it. Every
        request let in must `leave()` once done."""
        with self.in_flight_lock:
            if self.max_in_flight is None or self.in_flight < self.max_in_flight:
                self.in_flight += 1
                return None
        self.note(self.match(method, path), "shed")
        body = {"detail": "Service Overloaded", "retry_after": self.shed_retry_after}
        return Decision.reply(503, body, {"Retry-After": str(self.shed_retry_after)})

    def leave(self) -> None:
        with self.in_flight_lock:
            self.in_flight -= 1

    # -- the request's subject, tier and cost ------------------------------------------

    def subject(self, identified: Optional[str], user: Optional[str], peer: Optional[str],
                forwarded: Iterable[str]) -> str:
        """`identify`'s answer, else the signed-in user, else the client address."""
        if identified:
            return identified
        if user:
            return "user:" + user
        return "ip:" + client_address(peer, forwarded, self.trusted)

    @staticmethod
    def cost(route: Route, request) -> float:
        return float(route.cost(request) if callable(route.cost) else route.cost)

    # -- startup -----------------------------------------------------------------------

    def policy_routes(self) -> Iterator[Route]:
        return (route for _, _, route in self.routes if route.policy is not None)

    @staticmethod
    def missing(route: Route) -> str:
        return f"route {route.name!r}: there is no policy named {route.policy!r} in the database"

    @staticmethod
    def startup_unchecked(error: BaseException) -> None:
        log.warning("ratelimit_web: could not check the routes' policies at startup (%s); "
                    "the fallback serves until the database answers", _why(error))

    # -- one check: before the database call, and what its answer or error decides -----

    def cached(self, route: Route, subject: str, tier: Optional[str]) -> Optional[Decision]:
        """The refused-identifier cache's 429, when it holds this subject's refusal."""
        refused = self.refusals.get((route.name, tier, subject)) if self.refusals else None
        if refused is None:
            return None
        self.note(route, "refused_locally")
        return Decision.reply(*refused)

    def answered(self, route: Route, subject: str, tier: Optional[str], answer: Answer, seconds: float) -> Decision:
        """The database answered in `seconds`: admit with its headers, or refuse."""
        self.counters.checks += 1
        if self.metrics is not None:
            self.metrics.observe(route.name, seconds)
        if self.outage_since is not None:
            log.warning("ratelimit_web: the database answers again after %.1f s", time.monotonic() - self.outage_since)
            self.outage_since = None
        self.learn(route, tier, answer)
        if answer.admitted:
            self.note(route, "admitted")
            return Decision("admit", headers=dict(answer.headers))
        self.note(route, "refused")
        return self.refusal(route, subject, tier, answer)

    def failed(self, route: Route, subject: str, tier: Optional[str], cost: float, error: BaseException) -> Decision:
        """The check raised `error`: the fallback when the database did not answer, a JSON
        500 when the route's policy is gone; anything else is raised again."""
        if isinstance(error, (DatabaseUnavailable, TimeoutError)):
            self.note(route, "database_errors")
            return self.unavailable(route, subject, tier, cost, error)
        if route.policy is not None and is_missing_policy(error):
            return self.policy_missing(route, error)
        raise error

    def decide(self, route: Route, subject: str, tier: Optional[str], cost: float,
               check: Callable[[], Answer]) -> Decision:
        """The whole check for a sync limiter (WSGI, Django): the cache, then `check()`
        (whose own timeout bounds it), then what it answered or raised comes to."""
        decision = self.cached(route, subject, tier)
        if decision is not None:
            return decision
        started = time.perf_counter()
        try:
            answer = check()
        except Exception as e:
            return self.failed(route, subject, tier, cost, e)
        return self.answered(route, subject, tier, answer, time.perf_counter() - started)

    def check_policies(self, exists: Callable[[str], bool]) -> Optional[str]:
        """At startup, for a sync limiter: what is wrong (a route's policy is missing), or
        None; a database that does not answer is logged and let be (the fallback serves)."""
        for route in self.policy_routes():
            try:
                if not exists(route.policy):
                    return self.missing(route)
            except DatabaseUnavailable as e:
                self.startup_unchecked(e)
                return None
        return None

    def refund_failed(self, route: Route, subject: str, error: BaseException) -> None:
        log.warning("ratelimit_web: could not refund %s for %s: %s", route.name, subject,
                    _why(error, self.check_timeout))

    def policy_missing(self, route: Route, error: BaseException) -> Decision:
        """A route's policy is gone: a JSON 500 that says so, logged once per interval."""
        self.note(route, "missing_policies")
        now = time.monotonic()
        if now - self.policy_logged_at.get(route.name, float("-inf")) >= self.log_interval:
            self.policy_logged_at[route.name] = now
            log.error("ratelimit_web: %s (%s)", self.missing(route), _why(error))
        return Decision.reply(500, {"detail": "Rate Limit Policy Missing", "route": route.name, "policy": route.policy})

    def refusal(self, route: Route, subject: str, tier, answer: Answer) -> Decision:
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
        return Decision.reply(413 if too_large else 429, body, h)

    def learn(self, route: Route, tier, answer: Answer):
        """A policy's first bucket, as its answers report it, for the fallback."""
        if route.policy is None:
            return
        for item in answer.result.get("items", ()):
            if item.get("refill_seconds"):
                self.learned[(route.name, tier)] = (item["limit"], item["limit"] * 60.0 / item["refill_seconds"])
                return

    def unavailable(self, route, subject, tier, cost, error) -> Decision:
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
            return Decision.reply(503, body, {"Retry-After": str(self.unavailable_retry_after)})
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
            return Decision.reply(429, body, {"Retry-After": str(retry_after)} if retry_after else {})
        self.note(route, "fallback_admitted")
        return Decision("fallback")


def _why(error: BaseException, timeout: Optional[float] = None) -> str:
    """What failed, for a log line: the error's words, or, for a timeout (which has none),
    how long it waited."""
    text = str(error).strip()
    if text:
        return text
    if isinstance(error, TimeoutError) and timeout is not None:
        return f"no answer within {timeout * 1000:g} ms"
    return type(error).__name__
