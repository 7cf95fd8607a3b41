"""Costs known after the work (LLM tokens, bytes sent): `charge(request, cost)` and
`refund(request, cost)` in a handler, on the limits of the route that admitted the request.

The middleware (ASGI, WSGI, Django) leaves a `RequestLimits` on each request it let
through: the route, its subject and tier, and the headers the response will carry. A
charge takes `cost` from every limit of the route whatever they hold (rl_charge_all for
explicit limits, rl_charge_check for a policy, scaled by the tier): a bucket goes into
debt, a budget past its quota, a window past its limit, and later requests are refused
until it is paid back. The response then carries the headers of the state after the
charge. A refund gives `cost` back (rl_refund_all, rl_refund_check) and leaves the headers
as they were (they never promise more than is there).

In an async handler (Starlette, FastAPI, an async Django view) await them: `await
charge(request, tokens)`; in a sync one (Flask, a sync Django view, a plain `def` FastAPI
endpoint) call them: `charge(request, tokens)`. A database that
does not answer is logged and the call returns None: the work is done, the client gets
its answer."""
from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, Callable, Optional

from .limiter import Answer, DatabaseUnavailable

log = logging.getLogger("ratelimit_web")

#: Where the middleware leaves a request's RequestLimits: a key of the ASGI scope, the WSGI
#: environ or Django's request.META.
KEY = "ratelimit_web.limits"


def amount(function: str, cost: Any) -> float:
    """`cost` as a float, or a ValueError naming the function and the argument."""
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost <= 0:
        raise ValueError(f"{function}: cost must be a finite number greater than 0, got {cost!r}")
    return float(cost)


def _direct(call, *args):
    return call(*args)


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class RequestLimits:
    """One admitted request's route, subject and tier, and the headers its response gets.
    A limiter call runs through `run_sync` in a thread without an event loop (a Flask
    view, a sync Django or Starlette endpoint in its worker thread), and through
    `run_async` as a coroutine the caller awaits where a loop runs (an async endpoint)."""

    def __init__(self, rules, limiter, route, subject: str, tier: Optional[str], headers: dict,
                 run_sync: Callable = _direct, run_async: Optional[Callable] = None):
        self.rules, self.limiter, self.route = rules, limiter, route
        self.subject, self.tier = subject, tier
        self.headers = dict(headers)
        self.run_sync, self.run_async = run_sync, run_async

    def _failed(self, what: str, error: BaseException) -> None:
        log.warning("ratelimit_web: could not %s %s for %s: %s", what, self.route.name, self.subject,
                    str(error).strip() or type(error).__name__)

    def _charged(self, answer: Answer) -> Answer:
        self.headers = dict(answer.headers)
        return answer

    def charge(self, cost):
        """Charges `cost` to the route's limits (see the module); the Answer, or None when
        the database did not answer. A coroutine where an event loop runs."""
        cost = amount("charge", cost)
        if self.run_async is not None and _in_event_loop():
            return self._charge_async(cost)
        try:
            return self._charged(self.run_sync(self.limiter.charge, self.route, self.subject, self.tier, cost))
        except DatabaseUnavailable as e:
            self._failed("charge", e)
            return None

    def refund(self, cost):
        """Gives `cost` back to the route's limits (see the module). A coroutine where an
        event loop runs."""
        cost = amount("refund", cost)
        if self.run_async is not None and _in_event_loop():
            return self._refund_async(cost)
        try:
            self.run_sync(self.limiter.refund, self.route, self.subject, self.tier, cost)
        except DatabaseUnavailable as e:
            self._failed("refund", e)

    async def _charge_async(self, cost: float) -> Optional[Answer]:
        try:
            return self._charged(await self.run_async(self.limiter.charge, self.route, self.subject, self.tier, cost))
        except DatabaseUnavailable as e:
            self._failed("charge", e)
            return None

    async def _refund_async(self, cost: float) -> None:
        try:
            await self.run_async(self.limiter.refund, self.route, self.subject, self.tier, cost)
        except DatabaseUnavailable as e:
            self._failed("refund", e)


async def awaited(call, *args):
    """`run_async` for an async limiter: its call is a coroutine."""
    return await call(*args)


def from_worker_thread(call, *args):
    """`run_sync` for an async limiter called from a sync endpoint's worker thread."""
    import anyio.from_thread

    return anyio.from_thread.run(call, *args)


def limits_of(request) -> RequestLimits:
    """The RequestLimits the middleware left on `request` (a Starlette, Flask or Django
    request, an ASGI scope or a WSGI environ)."""
    for holder in (getattr(request, "META", None), getattr(request, "environ", None), getattr(request, "scope", None),
                   request):
        if isinstance(holder, dict) and KEY in holder:
            return holder[KEY]
    raise LookupError("ratelimit_web: this request was not admitted by a rate-limited route (charge and refund "
                      "work in the handler of a route the middleware or the decorator limits)")


def charge(request, cost):
    """Charges `cost` (a finite number above 0) to the limits of the route that admitted
    `request`, whatever they hold, and puts the state after the charge in the response's
    headers. Returns the engine's answer (None if the database did not answer); await it
    in an async handler."""
    return limits_of(request).charge(cost)


def refund(request, cost):
    """Gives `cost` back to the limits of the route that admitted `request` (what an
    estimate took too much). Await it in an async handler."""
    return limits_of(request).refund(cost)
