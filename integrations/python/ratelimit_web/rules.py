"""The rules every framework's middleware follows, written once: which route a request is,
who its subject is, what the database's answer (or its silence) comes to, the
refused-identifier cache, load shedding and the fallback. The adapters (ASGI in
middleware.py, WSGI in wsgi.py, Django in django.py) only read requests and write
responses; the limiter they call may be async or not, so a check is split in two: what
comes before the database call and what its answer or error decides."""
from __future__ import annotations

import fnmatch
import hashlib
import ipaddress
import json
import logging
import math
import os.path
import re
import threading
import time
import unicodedata
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from .fallback import LocalBucket
from .limiter import Answer, DatabaseUnavailable, is_missing_policy

log = logging.getLogger("ratelimit_web")


def limit_list(limits, what: str) -> list:
    """`limits` as a list of limit objects, or a ValueError that starts with `what`."""
    if not isinstance(limits, (list, tuple)) or not limits or not all(isinstance(l, dict) for l in limits):
        raise ValueError(f"{what}: limits must be a list of limit objects, e.g. "
                         '[{"burst": 5, "refill_per_minute": 5}]')
    return list(limits)


@dataclass
class Route:
    """How one route (or route pattern) is limited: a policy's name (rl_check, the tier as
    its tier), or explicit `limits` as rl_take_all items without key and cost (any kind the engine
    has, passed through as given: docs/guides/limits.md, rl_take_all) with `tiers` giving
    their multipliers. `limits` may be a function of the request that answers
    them, for limits that differ by customer (a budget counted from each customer's billing
    date: `lambda request: [{"period": f"month from {day}", "quota": quota}]`); the engine
    validates its answer on every call instead of at startup. `cost` is a number or a
    function of the request. A `sensitive` route fails closed (503) while the database is
    unreachable; the others admit through a local bucket at the middleware's
    `fallback_share` of their first bucket (for a policy, the one its last answer reported,
    or `fallback` = (burst, refill_per_minute) until there was one).

    `refund_on` gives back what an admitted request took when its response has one of
    these statuses: status classes and codes (`["5xx"]`, `[503]`) or a predicate of the
    status (`lambda status: status < 400` counts only failures, for a login route). None
    (the default) takes the middleware's `refund_on`, which is off unless set; a
    sensitive route never takes the middleware's: it refunds only what it names itself. A
    refund lets a client whose request failed try again: never name statuses a client can
    cause at will on a route whose handler does its work before it fails.

    `identify` chooses this route's subject in place of the middleware's (django-ratelimit's
    `key=` per view): a function of the request as the middleware's `identify` gets it
    (may be async under ASGI); None or an empty answer falls back to the middleware's
    `identify`, then the signed-in user, then the client address."""

    policy: Optional[str] = None
    limits: Union[None, list, Callable[[Any], list]] = None
    tiers: Dict[str, float] = field(default_factory=dict)
    cost: Union[float, Callable[[Any], float]] = 1
    sensitive: bool = False
    fallback: Optional[Tuple[float, float]] = None
    name: str = ""
    refund_on: Any = None
    identify: Optional[Callable[[Any], Any]] = None

    def __post_init__(self):
        if (self.policy is None) == (self.limits is None):
            raise ValueError(f"Route {self.name!r}: give either policy or limits" if self.name
                             else "Route: give either policy or limits")
        if self.limits is not None and not callable(self.limits):
            self.limits = limit_list(self.limits, "Route")
        self.refunds = refund_rule(self.refund_on)
        # the limits as the refused-identifier cache tells them apart: a request whose
        # limits differ (a customer's new plan, another billing period) is not answered
        # with a refusal under the old ones
        self.limits_key = None if self.limits is None or callable(self.limits) else \
            json.dumps(self.limits, sort_keys=True, separators=(",", ":"))

    def for_request(self, request) -> "Route":
        """This route as it limits `request`: itself, or a copy holding what its `limits`
        function answered for the request."""
        if not callable(self.limits):
            return self
        return replace(self, limits=limit_list(self.limits(request), f"Route {self.name!r}: limits(request)"))

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

    def definition(self) -> dict:
        """The route's explicit limits as a policy definition, which the engine validates
        (rl_policy_validate) with the same rules and texts as a policy."""
        return {"limits": list(self.limits or ()), **({"tiers": self.tiers} if self.tiers else {})}


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
    """Subjects just refused, per route, limits and tier, until their refusal's retry time ends:
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


# -- client addresses ------------------------------------------------------------------

def parse_address(text: Optional[str]):
    """An IP address as a server or a proxy writes it, or None: IPv4, IPv6 in any
    spelling, bracketed and with a port (`[2001:db8::1]:443`), IPv4 with a port
    (`203.0.113.9:4711`, Azure Application Gateway's hops), with a zone id (`fe80::1%eth0`);
    an IPv4-mapped IPv6 address (`::ffff:203.0.113.9`, a dual-stack listener's) is IPv4."""
    if not text:
        return None
    t = text.strip().strip('"')
    if t.startswith("["):
        end = t.find("]")
        if end < 0:
            return None
        t = t[1:end]
    elif t.count(":") == 1:
        t = t.split(":", 1)[0]
    t = t.split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(t)
    except ValueError:
        return None
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def address_subject(ip, ipv6_prefix: int = 56) -> str:
    """What an address counts as: an IPv4 address itself, an IPv6 address its /ipv6_prefix
    (/56 by default, as express-rate-limit groups them: one customer's network, so that
    rotating through a /64 gains nothing), written one way only."""
    if ip.version == 4 or ipv6_prefix >= 128:
        return str(ip)
    return str(ipaddress.ip_network(f"{ip}/{ipv6_prefix}", strict=False))


def _networks(addresses: Iterable[str]) -> list:
    networks = []
    for a in addresses:
        net = ipaddress.ip_network(a.strip(), strict=False)
        mapped = getattr(net.network_address, "ipv4_mapped", None)
        if mapped is not None and net.prefixlen >= 96:  # ::ffff:127.0.0.1/128 is 127.0.0.1/32
            net = ipaddress.ip_network(f"{mapped}/{net.prefixlen - 96}", strict=False)
        networks.append(net)
    return networks


def _trusted(ip, networks: list) -> bool:
    return ip is not None and any(ip.version == n.version and ip in n for n in networks)


def client_address(peer: Optional[str], forwarded: Iterable[str], trusted: list, ipv6_prefix: int = 56) -> str:
    """The client's address (see address_subject): the peer's, or, when the peer is a
    trusted proxy, the X-Forwarded-For hop that proxy appended, and so on leftwards while
    each hop is itself a trusted proxy (`forwarded`: the header's values). A hop left of the
    first untrusted one was written by the client and is never read."""
    ip = parse_address(peer)
    if ip is None:
        return bounded(peer or "unknown")
    if not _trusted(ip, trusted):
        return address_subject(ip, ipv6_prefix)
    hops = [part.strip() for value in forwarded for part in value.split(",") if part.strip()]
    for hop in reversed(hops):
        hop_ip = parse_address(hop)
        if hop_ip is None:  # written by the trusted proxy on its right, but no address
            return bounded(hop)
        ip = hop_ip
        if not _trusted(ip, trusted):
            break
    return address_subject(ip, ipv6_prefix)


# -- paths -----------------------------------------------------------------------------

def normalize_path(path: str, *, case_insensitive: bool = False, formats: bool = False) -> str:
    """The path as a router dispatches it, so that no spelling of a limited route escapes
    its limit: percent-decoded once, repeated slashes merged, `.` and `..` segments
    resolved, no trailing slash; lower case where the router ignores case (Express); a
    format suffix (`/login.json`) dropped where the router reads one (Rails)."""
    segments: List[str] = []
    for segment in urllib.parse.unquote(path or "/").split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if segments:
                segments.pop()
            continue
        segments.append(segment)
    if formats and segments:
        stem, dot, extension = segments[-1].rpartition(".")
        if dot and stem and extension.isalnum():
            segments[-1] = stem
    normalized = "/" + "/".join(segments)
    return normalized.lower() if case_insensitive else normalized


# -- databases -------------------------------------------------------------------------

SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3", ".db3")


def database_of(text: str, is_file: Callable[[str], bool] = None) -> Tuple[str, str]:
    """What a `--db` (or an AdminView's database) names, never guessed: ("postgres", the
    connection string) for a URL (`postgresql://`, `postgres://`) or a libpq string
    (`dbname=app host=...`); ("sqlite", the path) for `sqlite:PATH` (`sqlite:///abs/path`),
    a file that exists, or a name ending in .db, .sqlite, .sqlite3 or .db3. Anything else
    (`app`) is a ValueError that says both forms, rather than a new SQLite file."""
    is_file = is_file or os.path.isfile
    text = (text or "").strip()
    if text.startswith(("postgres://", "postgresql://")) or "=" in text:
        return "postgres", text
    if text.startswith("sqlite:"):
        path = text[len("sqlite:"):]
        path = path[2:] if path.startswith("//") else path
        if path:
            return "sqlite", path
    elif text and (is_file(text) or text.lower().endswith(SQLITE_SUFFIXES)):
        return "sqlite", text
    raise ValueError(f"{text!r} names no database: a PostgreSQL one is postgresql://HOST/NAME or dbname=NAME, "
                     f"a SQLite one an existing file, a name ending in .db, .sqlite or .sqlite3, or sqlite:PATH")


# -- identifiers -----------------------------------------------------------------------

#: An identifier longer than this, in UTF-8 bytes, is kept as its SHA-256 instead.
IDENTIFIER_MAX_BYTES = 256


def bounded(text: str) -> str:
    """Text of at most IDENTIFIER_MAX_BYTES bytes as it is; longer, `sha256:` and its hash
    (a fixed length, and the same text always gives the same key)."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= IDENTIFIER_MAX_BYTES:
        return text
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def normalize_identifier(value, *, case_insensitive: bool = False) -> Optional[str]:
    """An identifier `identify` or the signed-in user gave: Unicode NFKC (a fullwidth `ｂｏｂ`
    is `bob`), case-folded where identifiers are case-insensitive, bounded; None when
    empty (the address decides then)."""
    if value is None:
        return None
    text = unicodedata.normalize("NFKC", str(value))
    if case_insensitive:
        text = text.casefold()
    return bounded(text) if text else None


# -- refunds ---------------------------------------------------------------------------

def refund_rule(refund_on) -> Optional[Callable[[int], bool]]:
    """`refund_on` as a predicate of the status: None (never), status classes and codes
    (`["5xx"]`, `[503, "4xx"]`) or a callable of the status."""
    if refund_on is None:
        return None
    if callable(refund_on):
        return refund_on
    classes = set()
    for item in ([refund_on] if isinstance(refund_on, (str, int)) else refund_on):
        text = str(item).lower()
        if not re.fullmatch(r"[1-5]xx|[1-5][0-9]{2}", text):
            raise ValueError(f"refund_on: {item!r} is no status class (\"5xx\") or code (503)")
        classes.add(text)
    return lambda status: str(status) in classes or f"{str(status)[0]}xx" in classes


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
    applies; a `GET` route covers HEAD, which the frameworks answer with the GET handler).
    Paths are matched as the router dispatches them (`normalize_path`: merged slashes, dot
    segments, no trailing slash, and lower case where `case_insensitive_paths`, format
    suffixes where `path_formats`, as each adapter sets for its framework).

    The subject: `identify(request)`, else the signed-in user, else the client address
    (`client_address`: X-Forwarded-For believed only as far as `trusted_proxies` vouch
    for it; IPv6 grouped by `ipv6_prefix`, /56). Identifiers are normalized
    (`normalize_identifier`; `case_insensitive_identifiers` folds case) and bounded.
    `tier(request)` picks the tier. Paths in `skip` are never limited (nor shed).
    `refund_on` is every non-sensitive route's default (see Route; off). `policies`
    (`{"login": {"limits": [...]}}`) are set in the database at startup, before the routes
    are checked (rl_policy_set: on PostgreSQL the limiter's role must be a member of
    rl_admin or the extension's owner).

    Opt-in: `refusal_cache` (a number of entries, e.g. 10_000) answers a subject just
    refused on a route with 429 locally, without a database call, until its refusal's
    retry time (while its limits stay the same: a route's `limits` function that answers
    other limits asks the database again), and lets at most `checks_per_subject` (8) of one subject's checks wait for
    the database at once (the surplus is answered 429 at once: a flood of one subject
    never crowds out the others' checks); `max_in_flight` answers 503 with Retry-After
    (`shed_retry_after`) before any work once that many requests of this process are in
    flight, not counting requests whose body is still arriving (slow clients cannot use
    it up). `counters` counts what it did; `metrics` (e.g.
    `metrics.PrometheusMetrics()`) is told each outcome and each check's latency."""

    def __init__(self, routes: Dict[str, Route], *, identify: Optional[Callable] = None,
                 tier: Optional[Callable] = None, skip: Iterable[str] = ("/health", "/ready"),
                 trusted_proxies: Iterable[str] = (), ipv6_prefix: int = 56,
                 fallback_share: float = 0.5, unavailable_retry_after: int = 5, log_interval: float = 60.0,
                 refusal_cache: int = 0, checks_per_subject: int = 8, max_in_flight: Optional[int] = None,
                 shed_retry_after: int = 1, refund_on: Any = None, case_insensitive_paths: bool = False,
                 path_formats: bool = False, case_insensitive_identifiers: bool = False,
                 policies: Optional[Dict[str, dict]] = None,
                 counters: Optional[Counters] = None, metrics=None):
        self.counters = counters if counters is not None else Counters()
        self.metrics = metrics
        self.policies = dict(policies or {})
        self.refusals = RefusalCache(refusal_cache) if refusal_cache else None
        self.checks_per_subject = checks_per_subject if refusal_cache else None
        self.checking: Dict[tuple, int] = {}
        self.max_in_flight, self.shed_retry_after, self.in_flight, self.receiving = max_in_flight, shed_retry_after, 0, 0
        self.in_flight_lock = threading.Lock()  # WSGI and Django serve requests on threads
        self.policy_logged_at: Dict[str, float] = {}
        self.case_insensitive_paths, self.path_formats = case_insensitive_paths, path_formats
        self.case_insensitive_identifiers = case_insensitive_identifiers
        self.default_refunds = refund_rule(refund_on)
        if not 0 <= int(ipv6_prefix) <= 128:
            raise ValueError(f"ipv6_prefix must be 0 to 128, got {ipv6_prefix!r}")
        self.ipv6_prefix = int(ipv6_prefix)
        self.routes = []
        for pattern, route in routes.items():
            method, _, path = pattern.rpartition(" ")
            route.name = route.name or pattern
            self.routes.append((method.upper() or None, self.normalize(path), route))
        self.identify, self.tier = identify, tier
        self.skip = frozenset(skip)
        self.trusted = _networks(trusted_proxies)
        self.fallback_share = fallback_share
        self.unavailable_retry_after, self.log_interval = unavailable_retry_after, log_interval
        self.local_buckets: Dict[tuple, LocalBucket] = {}
        self.learned: Dict[tuple, Tuple[float, float]] = {}
        self.outage_since: Optional[float] = None
        self.logged_at = float("-inf")

    def identifiers(self, route: Route) -> list:
        """Who may name `route`'s subject, in order: the route's `identify`, then the
        middleware's; the first non-empty answer wins."""
        return [f for f in (route.identify, self.identify) if f is not None]

    def identifier(self, route: Route, request):
        """The identifier of `request` on `route` for a sync adapter (see identifiers)."""
        for identify in self.identifiers(route):
            value = identify(request)
            if value is not None and value != "":
                return value
        return None

    def normalize(self, path: str) -> str:
        return normalize_path(path, case_insensitive=self.case_insensitive_paths, formats=self.path_formats)

    def skipped(self, path: str) -> bool:
        return path in self.skip or self.normalize(path) in self.skip

    def match(self, method: str, path: str) -> Optional[Route]:
        if self.skipped(path):
            return None
        path = self.normalize(path)
        method = method.upper()
        for want, pattern, route in self.routes:
            if (want is None or want == method or (want == "GET" and method == "HEAD")) \
                    and fnmatch.fnmatchcase(path, pattern):
                return route
        return None

    def note(self, route: Optional[Route], outcome: str) -> None:
        """Counts what a request came to (a field of Counters), and tells the metrics."""
        setattr(self.counters, outcome, getattr(self.counters, outcome) + 1)
        if self.metrics is not None:
            self.metrics.count(route.name if route else None, outcome, route.policy if route else None)

    # -- load shedding ---------------------------------------------------------------

    def enter(self, method: str, path: str, receiving: bool = False) -> Optional[Decision]:
        """A request (not on a skip path) begins: None, or the 503 that sheds it. Every
        request let in must `leave()` once done. One whose body is still `receiving` is
        not counted until `received()`."""
        with self.in_flight_lock:
            if self.max_in_flight is None or self.in_flight < self.max_in_flight:
                if receiving:
                    self.receiving += 1
                else:
                    self.in_flight += 1
                return None
        self.note(self.match(method, path), "shed")
        body = {"detail": "Service Overloaded", "retry_after": self.shed_retry_after}
        return Decision.reply(503, body, {"Retry-After": str(self.shed_retry_after)})

    def received(self) -> None:
        """A request let in `receiving` has its whole body: it counts from now on."""
        with self.in_flight_lock:
            self.receiving -= 1
            self.in_flight += 1

    def leave(self, receiving: bool = False) -> None:
        with self.in_flight_lock:
            if receiving:
                self.receiving -= 1
            else:
                self.in_flight -= 1

    # -- the request's subject, tier and cost ------------------------------------------

    def subject(self, identified: Optional[str], user: Optional[str], peer: Optional[str],
                forwarded: Iterable[str]) -> str:
        """`identify`'s answer, else the signed-in user, else the client address; an empty
        identifier is none."""
        fold = self.case_insensitive_identifiers
        identified = normalize_identifier(identified, case_insensitive=fold)
        if identified:
            return identified
        user = normalize_identifier(user, case_insensitive=fold)
        if user:
            return "user:" + user
        return "ip:" + client_address(peer, forwarded, self.trusted, self.ipv6_prefix)

    @staticmethod
    def for_request(route: Route, request) -> Route:
        """The route with the limits its `limits` function gives `request` (itself when they
        are fixed): what the check, its refund and the handler's charge all use."""
        return route.for_request(request)

    @staticmethod
    def cost(route: Route, request) -> float:
        return float(route.cost(request) if callable(route.cost) else route.cost)

    def refunds(self, route: Route, status: int) -> bool:
        """Whether an admitted request whose response has `status` gets its cost back."""
        rule = route.refunds if route.refunds is not None or route.sensitive else self.default_refunds
        return rule is not None and bool(rule(status))

    # -- startup -----------------------------------------------------------------------

    def startup_questions(self) -> Iterator[Tuple[str, Route]]:
        """What startup asks the database about each route, in order: ("limits", route)
        (the engine validates the route's explicit limits), ("policy", route) (its policy
        exists)."""
        for _, _, route in self.routes:
            if not callable(route.limits):  # limits per request: the engine checks each call's
                yield ("limits" if route.limits is not None else "policy"), route

    @staticmethod
    def missing(route: Route) -> str:
        return f"route {route.name!r}: there is no policy named {route.policy!r} in the database"

    @staticmethod
    def refused_limits(route: Route, problem: str) -> str:
        return f"route {route.name!r}: {problem}"

    @staticmethod
    def startup_unchecked(error: BaseException) -> None:
        log.warning("ratelimit_web: could not check the routes at startup (%s); "
                    "the fallback serves until the database answers", _why(error))

    def check_routes(self, limiter) -> Optional[str]:
        """At startup, for a sync limiter: sets the `policies` given, then says what is
        wrong with a route (limits the engine refuses, naming the route and the limit's
        field; a policy that does not exist), or None; the engine's reading of explicit
        limits is kept. A database that does not answer is logged and let be (the
        fallback serves)."""
        try:
            for name, definition in self.policies.items():
                limiter.set_policy(name, definition)
            for kind, route in self.startup_questions():
                if kind == "limits":
                    problem, limits = limiter.validate_limits(route.definition())
                    if problem is not None:
                        return self.refused_limits(route, problem)
                    route.limits = limits
                elif not limiter.policy_exists(route.policy):
                    return self.missing(route)
        except DatabaseUnavailable as e:
            self.startup_unchecked(e)
        return None

    async def check_routes_async(self, limiter) -> Optional[str]:
        """check_routes for an async limiter (raises DatabaseUnavailable for the caller)."""
        for name, definition in self.policies.items():
            await limiter.set_policy(name, definition)
        for kind, route in self.startup_questions():
            if kind == "limits":
                problem, limits = await limiter.validate_limits(route.definition())
                if problem is not None:
                    return self.refused_limits(route, problem)
                route.limits = limits
            elif not await limiter.policy_exists(route.policy):
                return self.missing(route)
        return None

    # -- one check: before the database call, and what its answer or error decides -----

    def cached(self, route: Route, subject: str, tier: Optional[str]) -> Optional[Decision]:
        """The refused-identifier cache's 429, when it holds this subject's refusal."""
        refused = self.refusals.get((route.name, route.limits_key, tier, subject)) if self.refusals else None
        if refused is None:
            return None
        self.note(route, "refused_locally")
        return Decision.reply(*refused)

    def begin_check(self, route: Route, subject: str, tier: Optional[str]) -> Tuple[Optional[Decision], Optional[tuple]]:
        """Before a database check: the refused-identifier cache's 429, or the 429 of a
        subject that has `checks_per_subject` checks waiting already (with the cache on);
        else no decision and a slot to give back with `end_check` once the check is done."""
        decision = self.cached(route, subject, tier)
        if decision is not None or self.checks_per_subject is None:
            return decision, None
        slot = (route.name, tier, subject)
        with self.in_flight_lock:
            waiting = self.checking.get(slot, 0)
            if waiting < self.checks_per_subject:
                self.checking[slot] = waiting + 1
                return None, slot
        self.note(route, "refused_locally")
        return Decision.reply(429, {"detail": "Too Many Requests", "retry_after": 1}, {"Retry-After": "1"}), None

    def end_check(self, slot: Optional[tuple]) -> None:
        if slot is None:
            return
        with self.in_flight_lock:
            left = self.checking.get(slot, 1) - 1
            if left > 0:
                self.checking[slot] = left
            else:
                self.checking.pop(slot, None)

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
        if self.metrics is not None and hasattr(self.metrics, "refuse"):
            self.metrics.refuse(route.name, route.policy, subject)
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
        decision, slot = self.begin_check(route, subject, tier)
        if decision is not None:
            return decision
        started = time.perf_counter()
        try:
            answer = check()
        except Exception as e:
            return self.failed(route, subject, tier, cost, e)
        finally:
            self.end_check(slot)
        return self.answered(route, subject, tier, answer, time.perf_counter() - started)

    def refund_failed(self, route: Route, subject: str, error: BaseException) -> None:
        log.warning("ratelimit_web: could not refund %s for %s: %s", route.name, subject, _why(error))

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
            self.refusals.put((route.name, route.limits_key, tier, subject), 429, body, h, wait_ms / 1000)
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
            log.warning("ratelimit_web: the database could not be reached (%s): sensitive routes answer 503, "
                        "the others use local buckets at %g of their limit", _why(error),
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


def _why(error: BaseException) -> str:
    """What failed, for a log line: the error's words, or its kind when it has none."""
    return str(error).strip() or type(error).__name__
