"""The ASGI middleware and the retrying httpx transport, through uvicorn on loopback and
real HTTP clients, on SQLite and (when a cluster is up: PGHOST) PostgreSQL."""
import json
import itertools
import os
import random
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import anyio
import httpx
import pytest

from ratelimit_web.client import RetryTransport, retry_after_seconds
from routes import SPEC, token

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
EXTENSION = os.path.join(ROOT, "target", "release", "libratelimit")
PG_DIR = os.environ.get("RL_PG_DIR")
# the spec's (integrations/spec/app.json); web_flood gives one token back every second: a
# flood from one subject is refused with a wait of about 1 s
POLICIES = SPEC["policies"]


def auth(user, plan=None):
    """The headers of a request signed in as `user` (the test applications' bearer token)."""
    return {"Authorization": "Bearer " + token(user, plan)}


def free_port():
    """A free port outside the kernel's ephemeral range (32768-60999 by default), so no
    outgoing connection or port-0 bind of another process takes it before the server
    under test binds it; random, so two callers in a row get different ones."""
    low, high = (int(n) for n in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    while True:
        port = random.randrange(20000, low) if low > 21000 else random.randrange(high + 1, 65536)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue


class Database:
    """The application's database, as the test sees it."""

    def __init__(self, engine, tmp_path):
        self.engine = engine
        if engine == "sqlite":
            self.dsn = str(tmp_path / "app.db")
            self.conn = sqlite3.connect(self.dsn, isolation_level=None, timeout=30)
            self.conn.enable_load_extension(True)
            self.conn.load_extension(EXTENSION)
            self.conn.execute("PRAGMA journal_mode=wal")
        else:
            import psycopg

            name = "rl_web_" + tmp_path.name.replace("-", "_").lower()[-40:]
            with psycopg.connect(dbname="postgres", autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {name}")
                admin.execute(f"CREATE DATABASE {name}")
            self.dsn = f"dbname={name}"
            self.conn = psycopg.connect(self.dsn, autocommit=True)
            self.conn.execute("CREATE EXTENSION pg_ratelimit")
        for name, definition in POLICIES.items():
            self.sql("SELECT rl_policy_set(?, ?)", name, json.dumps(definition))

    def sql(self, statement, *args):
        if self.engine == "postgres":
            statement = statement.replace("?", "%s")
        row = self.conn.execute(statement, args).fetchone()
        return None if row is None else row[0]


ENGINES = ["sqlite"] + (["postgres"] if os.environ.get("PGHOST") else [])


@pytest.fixture(params=ENGINES)
def db(request, tmp_path):
    if request.param == "postgres" and os.environ.get("RL_REQUIRE_PG") != "1" and not os.environ.get("PGHOST"):
        pytest.skip("no PostgreSQL cluster (PGHOST)")
    return Database(request.param, tmp_path)


RUBY_TESTS = os.path.join(ROOT, "integrations", "ruby", "test")


def server_command(framework, port, workers=1):
    """How each test application is served: uvicorn for ASGI, gunicorn (8 threads) for WSGI,
    puma (8 threads) for Rack and Rails (integrations/ruby/test); `workers` processes for
    uvicorn and gunicorn."""
    # --no-proxy-headers: the middleware decides whom to believe (trusted_proxies); uvicorn
    # would otherwise rewrite the client address from a loopback peer's X-Forwarded-For first
    where = ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log", "--no-proxy-headers"]
    gunicorn = [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", str(workers),
                "--threads", "8", "--log-level", "warning"]
    if workers > 1:
        where += ["--workers", str(workers)]
    puma = ["puma", "--bind", f"tcp://127.0.0.1:{port}", "--threads", "8:8", "--quiet"]
    return {"asgi": [sys.executable, "-m", "uvicorn", "app:app", *where],
            "django-async": [sys.executable, "-m", "uvicorn", "django_site.asgi:application", *where],
            "django": [*gunicorn, "django_site.wsgi:application"],
            "flask": [*gunicorn, "flask_app:app"],
            "rack": [*puma, os.path.join(RUBY_TESTS, "rack_app.ru")],
            "rails": [*puma, os.path.join(RUBY_TESTS, "rails_app.ru")]}[framework]


class Server:
    def __init__(self, db, timeout=None, framework="asgi", workers=1, **settings):
        self.port = free_port()
        # a file, not a pipe: a server that logs much (Rails' traces) never blocks on it
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ, RL_WEB_ENGINE=db.engine, RL_WEB_DB=db.dsn, RL_WEB_EXTENSION=EXTENSION,
                   RL_WEB_TIMEOUT="" if timeout is None else str(timeout), PYTHONPATH=os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")])), DJANGO_SETTINGS_MODULE="django_site.settings",
                   RUBYLIB=os.path.join(ROOT, "integrations", "ruby", "lib"), **settings)
        self.process = subprocess.Popen(server_command(framework, self.port, workers), env=env, cwd=HERE,
                                        stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(self.url + "/health", timeout=1)
                return
            except httpx.TransportError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.process.kill()
                    raise RuntimeError(f"{framework} did not start: " + self.read_log())
                time.sleep(0.1)

    def read_log(self):
        self.process.wait(timeout=30)
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def output(self):
        self.process.terminate()
        return self.read_log()


@pytest.fixture
def server(db):
    s = Server(db)  # the limiters' own timeouts: the exact-count tests must never fall back under them
    yield s
    s.output()


# The same rules under every framework: ASGI (Starlette), WSGI (Flask), Django (WSGI and
# ASGI), Rack and Rails (the Ruby gem, served by puma; its rules are a port of rules.py's)
FRAMEWORKS = ["asgi", "flask", "django", "django-async", "rack", "rails"]


def need_puma():
    if shutil.which("puma"):
        return
    if os.environ.get("RL_REQUIRE_RUBY") == "1":
        pytest.fail("puma (Debian's) is not installed: bash scripts/setup.sh --pg")
    pytest.skip("no puma here (Debian's ruby, ruby-rails and puma: setup.sh --pg installs them)")


@pytest.fixture(params=FRAMEWORKS)
def framework(request):
    if request.param in ("rack", "rails"):
        need_puma()
    return request.param


@pytest.fixture
def any_server(db, framework):
    s = Server(db, framework=framework)
    yield s
    s.output()


def hammer(url, path, clients=8, each=2000, headers=None, total=None):
    """`clients` concurrent keep-alive clients sending `each` requests (or `total` among
    them, as each finishes its last): every response."""
    remaining = itertools.count(total - 1, -1) if total is not None else None

    def client(_):
        with httpx.Client(base_url=url, headers=headers or {}, timeout=30) as c:
            if remaining is None:
                return [c.get(path) for _ in range(each)]
            return [c.get(path) for _ in iter(lambda: next(remaining) >= 0, False)]

    with ThreadPoolExecutor(clients) as pool:
        return [r for responses in pool.map(client, range(clients)) for r in responses]


# The load test: a burst of 2,000 requests from 32 concurrent clients at a route of limit
# 300 on each server as deployed (uvicorn and gunicorn with 2 worker processes, puma with
# 8 threads), on this 2-core machine. Each check may wait 5 s (LOAD_TIMEOUT) instead of the
# limiters' defaults, so the database answers every check in time and alone decides:
# exactly 300 admitted, each seeing its own remaining count once, and no fallback logged.
# (With the defaults, one SQLite check under Flask waited past its 1 s for the write lock in
# a CI run with compiles beside it, and the fallback admitted it: 301. How long checks wait
# is a speed question, for the harness; the README says what to set.)
LOAD_REQUESTS, LOAD_CLIENTS, LOAD_TIMEOUT = 2000, 32, 5.0


def test_a_burst_of_2000_requests_from_32_clients_admits_exactly_the_limit(db, framework):
    # explicit limits (rl_take_all) on one engine, a policy (rl_check) on the other, each
    # server taking each kind on one of them
    kinds = ["/exact", "/policy"] if FRAMEWORKS.index(framework) % 2 == 0 else ["/policy", "/exact"]
    path = kinds[0] if db.engine == "sqlite" else kinds[1]
    server = Server(db, timeout=LOAD_TIMEOUT, framework=framework, workers=2)
    try:
        responses = hammer(server.url, path, clients=LOAD_CLIENTS, total=LOAD_REQUESTS)
    finally:
        log = server.output()
    admitted = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(responses) == LOAD_REQUESTS
    assert (len(admitted), len(refused)) == (300, LOAD_REQUESTS - 300), log
    # each admission saw its own remaining count: 299 down to 0, once each
    assert sorted(int(r.headers["X-RateLimit-Remaining"]) for r in admitted) == list(range(300))
    for r in admitted + refused:
        assert r.headers["X-RateLimit-Limit"] == "300" and "RateLimit-Policy" in r.headers and "RateLimit" in r.headers
    body = refused[-1].json()
    assert body["detail"] == "Too Many Requests" and body["limit"] == 300 and body["remaining"] == 0
    assert body["retry_after"] == int(refused[-1].headers["Retry-After"]) and body["reset"] >= 0
    assert "could not be reached" not in log and "could not check" not in log, log


def test_the_client_waits_as_told_and_gives_up_at_its_deadline(server):
    async def main():
        async with httpx.AsyncClient(base_url=server.url, transport=RetryTransport(jitter=0.1)) as c:
            assert (await c.get("/retry", headers=auth("fay"))).status_code == 200
            started = time.monotonic()
            r = await c.get("/retry", headers=auth("fay"))  # refused, Retry-After: 1, then admitted
            waited = time.monotonic() - started
            assert r.status_code == 200 and 0.9 <= waited < 3, waited
        # (the bounds below tell "at once" from a wait of a second, or of a 0.9 s deadline,
        # with room for a busy machine)
        async with httpx.AsyncClient(base_url=server.url, transport=RetryTransport(deadline=0.9)) as c:
            await c.get("/retry", headers=auth("gus"))
            started = time.monotonic()
            r = await c.get("/retry", headers=auth("gus"))
            assert r.status_code == 429 and time.monotonic() - started < 0.8
        async with httpx.AsyncClient(base_url=server.url, transport=RetryTransport()) as c:
            await c.get("/retry", headers=auth("hal"))
            started = time.monotonic()
            # not idempotent: answered as is, unless the request says it is safe
            assert (await c.post("/retry", headers=auth("hal"))).status_code == 429
            assert time.monotonic() - started < 0.8
            started = time.monotonic()
            r = await c.post("/retry", headers=auth("hal"), extensions={"retry_safe": True})
            assert r.status_code == 200 and time.monotonic() - started >= 0.9
            await c.get("/retry", headers=auth("ivy"))
            started = time.monotonic()
            with anyio.move_on_after(0.2) as scope:  # cancelled while it waits
                await c.get("/retry", headers=auth("ivy"))
            assert scope.cancelled_caught and time.monotonic() - started < 0.8

    anyio.run(main)


def test_retry_after_is_read_as_seconds_or_a_date():
    assert retry_after_seconds("7") == 7
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470) == 10
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490) == 0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


def test_backoff_without_retry_after_is_capped_exponential_with_jitter():
    class Fixed:
        def uniform(self, low, high):
            return high

    t = RetryTransport(backoff_base=0.5, backoff_max=3, rng=Fixed())
    response = httpx.Response(503)
    assert [t.wait_for(response, a) for a in range(5)] == [0.5, 1, 2, 3, 3]


def stop_postgres():
    subprocess.run(["runuser", "-u", "postgres", "--", os.environ["RL_PG_BIN"] + "/pg_ctl", "-D",
                    os.path.join(PG_DIR, "data"), "-m", "fast", "-w", "stop"], check=True, capture_output=True)


def start_postgres():
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "pg_cluster.sh"), "start"], check=True, capture_output=True)


def test_an_unreachable_database_fails_closed_on_sensitive_routes_and_open_elsewhere(db, framework):
    if db.engine == "postgres" and not (PG_DIR and os.environ.get("RL_PG_BIN")):
        pytest.skip("needs the test cluster's RL_PG_DIR and RL_PG_BIN to stop and start it")
    server = Server(db, timeout=0.05, framework=framework)
    try:
        with httpx.Client(base_url=server.url, timeout=5) as c:
            assert c.get("/open", headers=auth("jo")).status_code == 200
            lock = None
            if db.engine == "sqlite":
                lock = sqlite3.connect(db.dsn, isolation_level=None)
                lock.execute("BEGIN EXCLUSIVE")  # every other connection now waits, then gives up
            else:
                db.conn.close()
                stop_postgres()
            try:
                timings, statuses = [], []
                for _ in range(30):
                    started = time.monotonic()
                    statuses.append(c.get("/open", headers=auth("jo")).status_code)
                    timings.append(time.monotonic() - started)
                login = c.post("/login", headers=auth("jo"))
                assert login.status_code == 503 and int(login.headers["Retry-After"]) > 0
                # a local bucket at half the limit (40): 20 admitted, then refused
                assert statuses == [200] * 20 + [429] * 10, statuses
                assert max(timings) < 1.0, timings  # nobody waits past the check's timeout for long
            finally:
                if lock is not None:
                    lock.execute("ROLLBACK")
                else:
                    start_postgres()
            # it recovers by itself: the database decides again (it held 39 tokens; a check
            # abandoned at its timeout while running, one per connection, may have taken
            # its token when the lock came free)
            deadline = time.monotonic() + 60
            while True:
                r = c.get("/open", headers=auth("jo"))
                if "X-RateLimit-Remaining" in r.headers or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert r.status_code == 200 and 34 <= int(r.headers["X-RateLimit-Remaining"]) <= 38
    finally:
        log = server.output()
    assert log.count("the database could not be reached") == 1, log
    assert "the database answers again" in log, log


def test_a_route_whose_policy_is_missing_stops_the_application_at_startup(db, framework):
    with pytest.raises(RuntimeError) as started:
        Server(db, timeout=5.0, framework=framework, RL_WEB_EXTRA_POLICY="no_such_policy")
    # (Ruby quotes names as "...")
    assert re.search("""route (['"])/extra\\1: there is no policy named (['"])no_such_policy\\2 in the database""",
                     str(started.value)), str(started.value)


def test_a_policy_dropped_later_answers_a_json_500_logged_once(any_server, db):
    server = any_server
    with httpx.Client(base_url=server.url) as c:
        assert c.get("/gone").status_code == 200
        db.sql("SELECT rl_policy_drop('web_gone')")
        answers = [c.get("/gone") for _ in range(5)]
        assert {r.status_code for r in answers} == {500}
        assert answers[0].json() == {"detail": "Rate Limit Policy Missing", "route": "/gone", "policy": "web_gone"}
        assert c.get("/open").status_code == 200, "other routes go on"
        assert c.get("/counts").json()["missing_policies"] == 5
    log = server.output()
    assert len(re.findall("""route (['"])/gone\\1: there is no policy named (['"])web_gone\\2""", log)) == 1, log


def test_the_refused_identifier_cache_spares_the_database_a_flood(db):
    """One subject floods a route limited to 2 and a token a second: after each refusal
    the cache answers it locally until the wait ends, so the database sees about one call
    per second from it, while another subject is served by the database as before."""
    s = Server(db, timeout=5.0, RL_WEB_REFUSAL_CACHE="10000")
    try:
        seconds, started = 3.0, time.monotonic()
        statuses = []
        with httpx.Client(base_url=s.url, headers=auth("flood")) as c:
            while time.monotonic() - started < seconds:
                r = c.get("/flood")
                statuses.append(r.status_code)
                if r.status_code == 429:
                    assert r.json()["detail"] == "Too Many Requests" and int(r.headers["Retry-After"]) >= 1
                    assert r.headers["X-RateLimit-Limit"] == "2" and "RateLimit-Policy" in r.headers
            counts = c.get("/counts").json()
        elapsed = time.monotonic() - started
        with httpx.Client(base_url=s.url, headers=auth("calm")) as c:
            assert [c.get("/flood").status_code for _ in range(3)] == [200, 200, 429]
        # a route's limits as a function of the request: a refusal is kept for the limits
        # it was given under, so the same customer under other limits (another billing
        # period here, a new plan in an application) is asked of the database again
        with httpx.Client(base_url=s.url, headers=auth("biller")) as c:
            first, other = "/bill?period=month%20from%205", "/bill?period=month%20from%206"
            assert [c.get(first).status_code for _ in range(4)] == [200, 200, 200, 429]
            before = c.get("/counts").json()
            assert c.get(first).status_code == 429
            assert c.get(other).status_code == 200
            after = c.get("/counts").json()
            assert after["refused_locally"] == before["refused_locally"] + 1, (before, after)
            assert after["checks"] == before["checks"] + 1, (before, after)
        database_calls = counts["checks"]
        print(f"\n{db.engine}: {len(statuses)} requests in {elapsed:.1f} s from one subject; "
              f"{database_calls} reached the database, {counts['refused_locally']} refused locally")
        assert statuses[:2] == [200, 200] and len(statuses) > 200
        # 2 admissions, then about one check per second's token (each admitted, then refused again)
        assert database_calls <= 2 + 2 * (elapsed + 1), counts
        assert counts["refused_locally"] == len(statuses) - database_calls
        # it only ever refuses: the database admitted every 200
        assert statuses.count(200) == counts["admitted"]
    finally:
        s.output()


def test_load_shedding_answers_503_before_any_work_and_never_sheds_skip_paths(db):
    s = Server(db, timeout=5.0, RL_WEB_MAX_IN_FLIGHT="4")
    try:
        def slow(_):
            with httpx.Client(base_url=s.url, timeout=30) as c:
                return c.get("/slow?seconds=3", headers=auth("slow"))

        with ThreadPoolExecutor(10) as pool:
            pending = [pool.submit(slow, i) for i in range(10)]
            # until the first four are in their handler and the rest were shed at once (asked
            # of /counts, a skip path, rather than a fixed wait a busy machine can outrun)
            with httpx.Client(base_url=s.url) as c:
                deadline = time.monotonic() + 20
                while ((counts := c.get("/counts").json())["shed"], counts["checks"]) != (6, 4):
                    assert time.monotonic() < deadline and counts["shed"] <= 6 and counts["checks"] <= 4, counts
                    time.sleep(0.02)
                assert c.get("/health").status_code == 200, "a health probe is never shed"
                shed = c.get("/open", headers=auth("other"))
            responses = [f.result() for f in pending]
        statuses = sorted(r.status_code for r in responses)
        assert statuses == [200] * 4 + [503] * 6, statuses
        assert shed.status_code == 503 and shed.headers["Retry-After"] == "1"
        assert shed.json() == {"detail": "Service Overloaded", "retry_after": 1}
        with httpx.Client(base_url=s.url) as c:
            counts = c.get("/counts").json()
            # shed requests never reached the database: only the four admitted ones did
            assert (counts["shed"], counts["checks"]) == (7, 4), counts
            assert c.get("/open", headers=auth("other")).status_code == 200, "room again once they finish"
    finally:
        s.output()


def test_an_unopenable_database_is_named_in_the_error(tmp_path):
    from ratelimit_web import SQLiteLimiter

    missing = str(tmp_path / "no" / "such" / "folder" / "app.db")
    limiter = SQLiteLimiter(missing, extension=EXTENSION, threads=1)
    with pytest.raises(sqlite3.OperationalError) as failed:
        anyio.run(limiter.open)
    assert missing in str(failed.value) and "unable to open database file" in str(failed.value)


def test_wait_takes_when_allowed_sleeps_the_retry_time_and_gives_up_or_is_cancelled(tmp_path):
    from ratelimit_web import Route, SQLiteLimiter

    limiter = SQLiteLimiter(str(tmp_path / "jobs.db"), extension=EXTENSION, threads=1)
    route = Route(limits=[{"burst": 1, "refill_per_minute": 30}], name="jobs")  # a token every two seconds

    async def main():
        await limiter.open()
        started = time.monotonic()
        assert (await limiter.wait(route, "tenant:7")).admitted
        assert time.monotonic() - started < 0.8  # at once, not two seconds (room for a busy machine)
        started = time.monotonic()
        assert (await limiter.wait(route, "tenant:7", jitter=0)).admitted
        assert 1.9 <= time.monotonic() - started < 4.5
        # the next token is two seconds away: a deadline of 0.9 s gives up at once, with the refusal
        started = time.monotonic()
        assert not (await limiter.wait(route, "tenant:7", timeout=0.9)).admitted
        assert time.monotonic() - started < 0.8
        # no wait admits a cost above the burst
        assert not (await limiter.wait(route, "tenant:8", cost=5)).admitted
        # a cancel scope ends the sleep
        started = time.monotonic()
        with anyio.move_on_after(0.1):
            await limiter.wait(route, "tenant:7")
        assert time.monotonic() - started < 0.8
        await limiter.aclose()

    anyio.run(main)


@pytest.mark.parametrize("framework", ["asgi", "rack"])
def test_metrics_count_each_outcome_per_route_and_time_the_checks(db, framework):
    """The same series from the Python package (prometheus_client) and the Ruby gem (its
    own text format)."""
    if framework == "rack":
        need_puma()
    server = Server(db, framework=framework)
    try:
        with httpx.Client(base_url=server.url) as c:
            statuses = [c.get("/api/a", headers=auth("metered")).status_code for _ in range(7)]
            assert statuses == [200] * 5 + [429] * 2
            text = c.get("/metrics").text
    finally:
        server.output()
    assert 'ratelimit_requests_total{outcome="admitted",policy="",route="GET /api/*"} 5.0' in text, text
    assert 'ratelimit_requests_total{outcome="refused",policy="",route="GET /api/*"} 2.0' in text
    assert 'ratelimit_refused_subject_refusals{policy="",route="GET /api/*",subject="user:metered"} 2.0' in text
    assert 'ratelimit_check_seconds_count{route="GET /api/*"} 7.0' in text
    assert 'ratelimit_check_seconds_bucket{le="1.0",route="GET /api/*"} 7.0' in text
