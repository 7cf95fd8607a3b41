"""The Rails controller helper (rate_limit_by, integrations/ruby) in a Rails 6.1 application
served by puma on ActiveRecord's own connection, on SQLite and (when a cluster is up)
PostgreSQL. The Rack middleware's rules, in Rails too, run in test_middleware.py."""
import json

import httpx
import pytest

from routes import SPEC
from test_middleware import Server, auth, db, hammer, need_puma  # noqa: F401 (db: the fixture)


@pytest.fixture
def rails(db):
    need_puma()
    s = Server(db, framework="rails")
    yield s
    s.output()


def test_the_helper_admits_exactly_the_limit_to_concurrent_clients_per_tier(rails):
    for plan, each, limit in (("free", 50, 300), ("pro", 100, 600)):
        responses = hammer(rails.url, "/helper_exact", clients=8, each=each, headers=auth(plan, plan))
        admitted = [r for r in responses if r.status_code == 200]
        assert len(admitted) == limit and len(responses) - len(admitted) == 8 * each - limit, plan
        assert sorted(int(r.headers["X-RateLimit-Remaining"]) for r in admitted) == list(range(limit))
        refused = [r for r in responses if r.status_code == 429]
        assert {r.headers["X-RateLimit-Limit"] for r in refused} == {str(limit)}
        assert refused[0].json()["detail"] == "Too Many Requests"


def test_the_helper_gives_back_what_a_failing_action_took(rails, db):
    with httpx.Client(base_url=rails.url) as c:
        statuses = [c.get("/helper_fail", headers=auth("eve")).status_code for _ in range(4)]
        statuses += [c.get("/helper_fail?how=503", headers=auth("eve")).status_code for _ in range(4)]
        assert statuses == [500] * 4 + [503] * 4  # a burst of 3, never spent
        key = json.dumps(["web", "helper", "user:eve", "0"], separators=(",", ":"))
        assert int(db.sql("SELECT rl_peek(?, 3, 0.000001, 0) ->> 'remaining'", key)) == 3
        assert [c.get("/helper", headers=auth("eve")).status_code for _ in range(4)] == [200, 200, 200, 429]
    # a policy (rl_check), by client address when nobody is signed in (through the trusted proxy)
    with httpx.Client(base_url=rails.url, transport=httpx.HTTPTransport(local_address=SPEC["trusted_proxy_address"])) as c:
        logins = [c.post("/helper_login", headers={"X-Forwarded-For": "203.0.113.5"}) for _ in range(4)]
        assert [r.status_code for r in logins] == [200, 200, 200, 429]
        assert c.post("/helper_login", headers={"X-Forwarded-For": "203.0.113.6"}).status_code == 200
