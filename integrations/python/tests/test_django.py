"""Django's view decorator and ATOMIC_REQUESTS, served by gunicorn (WSGI) and uvicorn
(ASGI) on Django's own connection, on SQLite and (when a cluster is up) PostgreSQL. The
middleware's rules under Django run in test_middleware.py with the other frameworks."""
import json

import httpx
import pytest

from test_middleware import Server, auth, db  # noqa: F401 (db: the fixture)


def remaining(db, route, who, burst):
    key = json.dumps(["web", route, f"user:{who}", "0"], separators=(",", ":"))
    return int(db.sql(f"SELECT rl_peek(?, {burst}, 0.000001, 0) ->> 'remaining'", key))


def visits(db, who):
    return int(db.sql("SELECT count(*) FROM visits WHERE who = ?", who))


@pytest.mark.parametrize("atomic", [True, False], ids=["atomic_requests", "autocommit"])
def test_the_decorator_limits_a_view_and_a_failing_view_keeps_nothing_taken(db, atomic):
    db.conn.execute("CREATE TABLE visits (who text)")
    server = Server(db, framework="django", RL_WEB_ATOMIC="1" if atomic else "0")
    try:
        with httpx.Client(base_url=server.url) as c:
            raised = [c.get("/decorated", headers=auth("ann")).status_code for _ in range(4)]
            assert raised == [500] * 4  # a burst of 3, never spent
            assert remaining(db, "decorated", "ann", 3) == 3
            # ATOMIC_REQUESTS: the view's write and the decorator's take roll back together;
            # in autocommit the write stays and the refund gives the take back
            assert visits(db, "ann") == (0 if atomic else 4)
            failed = [c.get("/decorated?how=503", headers=auth("ann")).status_code for _ in range(4)]
            assert failed == [503] * 4  # answered, not raised: refunded (and committed) either way
            assert remaining(db, "decorated", "ann", 3) == 3
            answered = [c.get("/decorated?how=ok", headers=auth("ann")) for _ in range(4)]
            assert [r.status_code for r in answered] == [200, 200, 200, 429]
            assert [r.headers["X-RateLimit-Remaining"] for r in answered[:3]] == ["2", "1", "0"]
            assert answered[3].json()["detail"] == "Too Many Requests"
            assert remaining(db, "decorated", "ann", 3) == 0
            # the middleware checks before the view's transaction: a failing view is refunded
            assert [c.get("/fail", headers=auth("bo")).status_code for _ in range(4)] == [500] * 4
            assert remaining(db, "/fail", "bo", 2) == 2
    finally:
        server.output()


def test_the_decorator_limits_an_async_view(db):
    server = Server(db, framework="django-async")
    try:
        with httpx.Client(base_url=server.url) as c:
            statuses = [c.get("/decorated_async", headers=auth("cy")).status_code for _ in range(4)]
            assert statuses == [200, 200, 200, 429]
            assert c.get("/decorated_async", headers=auth("di")).status_code == 200
    finally:
        server.output()
