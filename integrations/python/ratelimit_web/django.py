"""Django: a middleware (sync and async) and a view decorator, the rules of rules.py over
Django's own database connection (PostgreSQL, or SQLite with the loadable extension).

Settings: `RATELIMIT = {"routes": {...}, **options}`, the options of `RateLimitRules`
(`identify(request)` and `tier(request)` get the HttpRequest), plus `using` (the database
alias, "default") and `extension` (SQLite's libratelimit; default: the sqlite-ratelimit
package's).

Transactions: the middleware checks before Django opens the view's transaction
(ATOMIC_REQUESTS), so its take is committed at once and a failing view is refunded. The
decorator checks inside that transaction (in a savepoint, so an error of ours never spoils
it): a view that raises rolls its take back with its own writes, and one that answers 5xx
is refunded."""
from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from functools import wraps
from typing import Optional

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction
from django.db.backends.signals import connection_created
from django.http import JsonResponse

from .charging import KEY, RequestLimits
from .limiter import (NO_EXTENSIONS, DatabaseUnavailable, SyncLimiter, _extension, _Statements, _unavailable,
                      load_extension, sqlite_errors)
from .rules import Decision, RateLimitRules, Route


class DjangoLimiter(SyncLimiter):
    """Checks on the connection Django already has for `using`: no pool, no connection
    of its own. On SQLite the extension is loaded into each new connection."""

    def __init__(self, using: str = "default", extension: Optional[str] = None):
        self.using = using
        vendor = connections[using].vendor
        if vendor not in ("postgresql", "sqlite"):
            raise ImproperlyConfigured(f"ratelimit_web: database {using!r} is {vendor}: PostgreSQL or SQLite only")
        self.statements = _Statements("%s", "%s::jsonb" if vendor == "postgresql" else "%s")
        if vendor == "sqlite":
            if not hasattr(sqlite3.Connection, "enable_load_extension"):
                raise ImproperlyConfigured(f"ratelimit_web: {NO_EXTENSIONS.split(': pip install')[0]}, and Django's "
                                           "SQLite backend uses it: run a Python whose sqlite3 can load extensions "
                                           "(Debian's and Ubuntu's python3, for one), or PostgreSQL")
            self.extension = _extension(extension)
            connection_created.connect(self._load_extension, weak=False, dispatch_uid=f"ratelimit_web:{using}")
            if connections[using].connection is not None:  # already open on this thread
                load_extension(connections[using].connection, self.extension)

    def _load_extension(self, sender, connection, **kwargs):
        if connection.alias == self.using:
            load_extension(connection.connection, self.extension)

    def cannot_open(self) -> Optional[str]:
        """At startup: why the database cannot be opened (a SQLite file in a folder that is
        not there, or not writable), or None. PostgreSQL that does not answer yet is no
        configuration error: the fallback serves until it does."""
        conn = connections[self.using]
        if conn.vendor != "sqlite":
            return None
        try:
            conn.ensure_connection()
        except (OperationalError, InterfaceError) as e:
            return f"database {self.using!r} ({conn.settings_dict.get('NAME')}) cannot be opened: {e}"
        return None

    def in_transaction(self) -> bool:
        return connections[self.using].in_atomic_block

    def fetchone(self, sql: str, params: list):
        conn = connections[self.using]
        try:
            # inside the request's transaction: a savepoint, so that our error spoils nothing
            with transaction.atomic(using=self.using) if conn.in_atomic_block else contextlib.nullcontext():
                with conn.cursor() as cur:
                    cur.execute(sql, params)
                    return cur.fetchone() if cur.description is not None else None
        except (OperationalError, InterfaceError) as e:
            cause = e.__cause__
            if isinstance(cause, sqlite_errors("OperationalError")) and not _unavailable(cause):
                raise
            raise DatabaseUnavailable(f"{conn.settings_dict.get('NAME')}: {e}".strip()) from e


def _options() -> dict:
    options = dict(getattr(settings, "RATELIMIT", None) or {})
    options.pop("routes", None)
    return options


def _rules_and_limiter(routes: dict, options: dict):
    limiter = DjangoLimiter(options.pop("using", "default"), options.pop("extension", None))
    return RateLimitRules(routes, **options), limiter


def _subject(rules: RateLimitRules, route: Route, request) -> str:
    user = getattr(request, "user", None)  # AuthenticationMiddleware, when it runs before
    signed_in = str(user.pk) if user is not None and getattr(user, "is_authenticated", False) else None
    forwarded = [request.META["HTTP_X_FORWARDED_FOR"]] if "HTTP_X_FORWARDED_FOR" in request.META else []
    identified = rules.identifier(route, request)
    return rules.subject(identified, signed_in, request.META.get("REMOTE_ADDR"), forwarded)


def _reply(decision: Decision) -> JsonResponse:
    response = JsonResponse(decision.body, status=decision.status)
    for name, value in decision.headers.items():
        response[name] = value
    return response


class _Check:
    """One request's check and what follows it, in the calling thread (for async views:
    in Django's database thread, through sync_to_async)."""

    def __init__(self, rules: RateLimitRules, limiter: DjangoLimiter, route: Route, request):
        route = rules.for_request(route, request)
        self.rules, self.limiter, self.route, self.request = rules, limiter, route, request
        self.subject = _subject(rules, route, request)
        self.tier = rules.tier(request) if rules.tier else None
        self.cost = rules.cost(route, request)
        self.limits: Optional[RequestLimits] = None

    def decide(self) -> Decision:
        decision = self.rules.decide(self.route, self.subject, self.tier, self.cost,
                                     lambda: self.limiter.check(self.route, self.subject, self.tier, self.cost))
        if decision.kind != "answer":  # for charge(request, cost) in the view
            self.limits = self.request.META[KEY] = RequestLimits(
                self.rules, self.limiter, self.route, self.subject, self.tier, decision.headers,
                run_async=_in_database_thread)
        return decision

    def give_back(self) -> None:
        try:
            self.limiter.refund(self.route, self.subject, self.tier, self.cost)
        except (DatabaseUnavailable, DatabaseError) as e:
            self.rules.refund_failed(self.route, self.subject, e)

    def finish(self, decision: Decision, response):
        """The limit's headers on an admitted response; a status the route refunds gives
        back what was taken."""
        if decision.kind != "admit":
            return response
        if self.rules.refunds(self.route, response.status_code):
            self.give_back()
        for name, value in self.limits.headers.items():  # as a charge in the view left them
            response[name] = value
        return response


async def _in_database_thread(call, *args):
    """`run` for an async view's charge: Django's database calls on its sync thread."""
    return await sync_to_async(call)(*args)


def _off_the_event_loop(work):
    """`work()`, on a thread of its own when an event loop runs here (an ASGI server loads
    the middleware inside it, where Django refuses database calls); that thread's
    connection is closed after."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return work()

    def run():
        try:
            return work()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


class RateLimitMiddleware:
    """`MIDDLEWARE = [..., "ratelimit_web.django.RateLimitMiddleware"]` (after
    AuthenticationMiddleware, so that a signed-in user is the subject): limits the routes
    of `settings.RATELIMIT["routes"]`. Every route is checked when Django loads the
    middleware: limits the engine refuses, a policy that does not exist, or a database
    that cannot be opened (a SQLite path that is wrong) stop the start with
    ImproperlyConfigured."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
        options = _options()
        self.rules, self.limiter = _rules_and_limiter(getattr(settings, "RATELIMIT", {}).get("routes", {}), options)
        self.counters = self.rules.counters
        problem = _off_the_event_loop(lambda: self.limiter.cannot_open() or self.rules.check_routes(self.limiter))
        if problem is not None:
            raise ImproperlyConfigured(f"ratelimit_web: {problem}")

    def __call__(self, request):
        if self.is_async:
            return self.__acall__(request)
        if self.rules.skipped(request.path_info):
            return self.get_response(request)
        shed = self.rules.enter(request.method, request.path_info)
        if shed is not None:
            return _reply(shed)
        try:
            route = self.rules.match(request.method, request.path_info)
            if route is None:
                return self.get_response(request)
            check = _Check(self.rules, self.limiter, route, request)
            decision = check.decide()
            if decision.kind == "answer":
                return _reply(decision)
            return check.finish(decision, self.get_response(request))
        finally:
            self.rules.leave()

    async def __acall__(self, request):
        if self.rules.skipped(request.path_info):
            return await self.get_response(request)
        shed = self.rules.enter(request.method, request.path_info)
        if shed is not None:
            return _reply(shed)
        try:
            route = self.rules.match(request.method, request.path_info)
            if route is None:
                return await self.get_response(request)
            check = _Check(self.rules, self.limiter, route, request)
            decision = await sync_to_async(check.decide)()
            if decision.kind == "answer":
                return _reply(decision)
            response = await self.get_response(request)
            return await sync_to_async(check.finish)(decision, response)
        finally:
            self.rules.leave()


def rate_limit(route: Optional[Route] = None, **route_fields):
    """A view decorator: `@rate_limit(Route(policy="login"))` or `@rate_limit(limits=[...])`
    (the fields of Route); the route's name (the key of its limits) defaults to the view's
    dotted name. Sync and async views; the options come from settings.RATELIMIT."""
    route = route or Route(**route_fields)

    def decorate(view):
        route.name = route.name or f"{view.__module__}.{view.__qualname__}"
        state = {}

        def ready():
            if not state:
                state["rules"], state["limiter"] = _rules_and_limiter({route.name: route}, _options())
            return state["rules"], state["limiter"]

        def begin(request):
            rules, limiter = ready()
            check = _Check(rules, limiter, route, request)
            return check, check.decide()

        def on_exception(check: _Check, decision: Decision):
            # inside the request's transaction the rollback gives the take back with the
            # view's writes (which the exception undid too); outside it, the refund does,
            # where the route refunds a 500
            if decision.kind == "admit" and not check.limiter.in_transaction() and check.rules.refunds(route, 500):
                check.give_back()

        if iscoroutinefunction(view):
            @wraps(view)
            async def limited_async(request, *args, **kwargs):
                check, decision = await sync_to_async(begin)(request)
                if decision.kind == "answer":
                    return _reply(decision)
                try:
                    response = await view(request, *args, **kwargs)
                except Exception:
                    await sync_to_async(on_exception)(check, decision)
                    raise
                return await sync_to_async(check.finish)(decision, response)

            limited_async.rate_limit_route = route
            return limited_async

        @wraps(view)
        def limited(request, *args, **kwargs):
            check, decision = begin(request)
            if decision.kind == "answer":
                return _reply(decision)
            try:
                response = view(request, *args, **kwargs)
            except Exception:
                on_exception(check, decision)
                raise
            return check.finish(decision, response)

        limited.rate_limit_route = route
        return limited

    return decorate
