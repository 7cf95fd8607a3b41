"""charge(request, cost) and refund(request, cost) where the HTTP cases cannot reach: a
request no route admitted, a cost that is no cost, a database that does not answer, and
which of the sync and async forms a caller gets. The charges themselves, on every
framework and engine, are the spec's HTTP case (test_spec.py)."""
import asyncio
import logging

import pytest

from ratelimit_web import charge, refund
from ratelimit_web.charging import KEY, RequestLimits, awaited
from ratelimit_web.limiter import Answer, DatabaseUnavailable
from ratelimit_web.rules import RateLimitRules, Route


class Limiter:
    """Records calls; fails as told."""

    def __init__(self, fail=False):
        self.calls, self.fail = [], fail

    def charge(self, route, subject, tier, cost):
        self.calls.append(("charge", subject, tier, cost))
        if self.fail:
            raise DatabaseUnavailable("connection refused")
        return Answer({"admitted": True}, {"X-RateLimit-Remaining": "7"})

    def refund(self, route, subject, tier, cost):
        self.calls.append(("refund", subject, tier, cost))
        if self.fail:
            raise DatabaseUnavailable("connection refused")


class AsyncLimiter(Limiter):
    async def charge(self, *args):
        return Limiter.charge(self, *args)

    async def refund(self, *args):
        return Limiter.refund(self, *args)


def limits(limiter, **kw):
    route = Route(limits=[{"period": "day", "quota": 10}], name="/ai")
    rules = RateLimitRules({"/ai": route})
    return RequestLimits(rules, limiter, route, "user:ann", "pro", {"X-RateLimit-Remaining": "9"}, **kw)


def test_a_request_no_route_admitted_says_so():
    for request in ({}, object()):
        with pytest.raises(LookupError, match="not admitted by a rate-limited route"):
            charge(request, 5)
        with pytest.raises(LookupError, match="not admitted by a rate-limited route"):
            refund(request, 5)


@pytest.mark.parametrize("cost", [0, -1, float("nan"), float("inf"), "5", None, True])
def test_a_cost_must_be_a_finite_number_above_zero(cost):
    environ = {KEY: limits(Limiter())}
    with pytest.raises(ValueError, match=r"^charge: cost must be a finite number greater than 0, got "):
        charge(environ, cost)
    with pytest.raises(ValueError, match=r"^refund: cost must be a finite number greater than 0, got "):
        refund(environ, cost)
    assert environ[KEY].limiter.calls == []


def test_a_charge_takes_the_headers_after_it():
    environ = {KEY: limits(Limiter())}
    assert charge(environ, 3).admitted
    assert environ[KEY].headers == {"X-RateLimit-Remaining": "7"}
    assert refund(environ, 2) is None
    assert environ[KEY].limiter.calls == [("charge", "user:ann", "pro", 3.0), ("refund", "user:ann", "pro", 2.0)]
    assert environ[KEY].headers == {"X-RateLimit-Remaining": "7"}  # a refund leaves them


def test_a_database_that_does_not_answer_is_logged_not_raised(caplog):
    environ = {KEY: limits(Limiter(fail=True))}
    with caplog.at_level(logging.WARNING, logger="ratelimit_web"):
        assert charge(environ, 3) is None
        assert refund(environ, 3) is None
    assert environ[KEY].headers == {"X-RateLimit-Remaining": "9"}
    assert [r.getMessage() for r in caplog.records] == [
        "ratelimit_web: could not charge /ai for user:ann: connection refused",
        "ratelimit_web: could not refund /ai for user:ann: connection refused"]


def test_awaited_where_a_loop_runs_called_where_none_does():
    limiter = AsyncLimiter()
    scope = {KEY: limits(limiter, run_sync=lambda call, *a: asyncio.run(call(*a)), run_async=awaited)}
    assert charge(scope, 1).admitted  # no loop here: the sync form

    async def handler():
        pending = charge(scope, 2)
        assert asyncio.iscoroutine(pending)
        return await pending

    assert asyncio.run(handler()).admitted
    assert [c[3] for c in limiter.calls] == [1.0, 2.0]
