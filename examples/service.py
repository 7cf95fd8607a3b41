"""A small HTTP service (Starlette) rate limited inside its database by the ratelimit_web
middleware (integrations/python).

/login and /webhooks are limited by policies, rows in the database that every service
shares (a strict login policy, a generous webhook one with a "pro" tier of five times
the limits); the tier is read from the user's row. A wrong password records a strike
(rl_penalize): after three, the subject is blocked for 120 s, then 240 s, ..., and every
policy refuses it meanwhile. /login fails closed (503) if the database does not answer.

/work shows explicit limits instead: each signed-in user (`?user=` with its `&password=`; a
request that proves no user is limited by its address) gets a bucket (a burst, refilled per
minute) and a daily budget, both charged or neither (`&cost=`, default 1). A refusal is
a 429 with the RateLimit headers and {"detail", "limit", "remaining", "reset",
"retry_after"}; a cost above a limit, which no wait admits, a 413 without Retry-After.
When the work fails after it was admitted (`&fail=1`), the middleware gives the tokens
and the budget back. /health is never limited.

    pip install "./integrations/python[postgres]" uvicorn    (or use scripts/setup.sh --pg's venv)
    python examples/service.py --sqlite app.db --port 8080 --user alice:secret:pro
    python examples/service.py --postgres "dbname=app" --port 8080
    curl -i 'localhost:8080/work?user=alice'
    curl -i 'localhost:8080/login?user=alice&password=secret'
"""
import argparse
import contextlib
import json
import os
import socket

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route as Path

from ratelimit_web import PostgresLimiter, RateLimitMiddleware, Route, SQLiteLimiter

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_EXTENSION = os.path.join(os.path.dirname(HERE), "target", "release", "libratelimit")
# The endpoint registry: each policy is set once at start (in production, by a deploy step
# running as a member of rl_admin) and changed without a redeploy.
POLICIES = {
    "login": {"limits": [{"burst": 5, "refill_per_minute": 5}, {"limit": 20, "window_seconds": 3600}],
              "tiers": {"free": 1, "pro": 1}},  # every plan gets the same few attempts
    "webhooks": {"limits": [{"burst": 200, "refill_per_minute": 200}], "tiers": {"free": 1, "pro": 5}},
}


def make_app(options):
    if options.sqlite:
        limiter = SQLiteLimiter(options.sqlite, extension=options.extension, timeout=options.check_timeout or 1.0)
    else:
        limiter = PostgresLimiter(options.postgres, timeout=options.check_timeout or 0.5)
    mark = "?" if options.sqlite else "%s"

    async def query(sql, *args):
        """One statement on the limiter's connections: its first value (JSON decoded)."""
        row = await limiter.fetchone(sql.replace("?", mark), list(args))
        value = None if row is None else row[0]
        return json.loads(value) if isinstance(value, str) and value.startswith(("{", "[")) else value

    async def signed_in(request):
        """The user the request proves it is (`?user=` with its `&password=`), else None."""
        name, password = request.query_params.get("user", ""), request.query_params.get("password", "")
        if name and await query("SELECT EXISTS (SELECT 1 FROM app_users WHERE name = ? AND password = ?)",
                                name, password):
            return name
        return None

    async def user_of(request):
        """Whom a request is limited as. A login is limited per account it tries (the name
        it claims: guessing one account's password stays slow from any address); any other
        route per signed-in user, and a request that proves no user per client address
        (None: the middleware's rule), so a name alone never buys a bucket of its own."""
        if request.url.path == "/login":
            return request.query_params.get("user", "")
        return await signed_in(request)

    async def plan_of(request):
        """The tier: the signed-in user's plan (free for everyone else)."""
        user = await signed_in(request)
        plan = user and await query("SELECT plan FROM app_users WHERE name = ?", user)
        return plan or "free"

    async def work(request):
        if request.query_params.get("fail") == "1":
            return JSONResponse({"error": "the work failed"}, status_code=500)
        return JSONResponse({"ok": True, "user": await signed_in(request)})

    async def login(request):
        user, password = request.query_params.get("user", ""), request.query_params.get("password", "")
        if not await query("SELECT EXISTS (SELECT 1 FROM app_users WHERE name = ? AND password = ?)", user, password):
            strike = await query("SELECT rl_penalize(?)", user)  # three free strikes, then blocks
            return JSONResponse({"error": "wrong_password", "strikes": strike["strikes"]}, status_code=401)
        return JSONResponse({"ok": True, "user": user, "tier": await plan_of(request)})

    async def webhooks(request):
        return JSONResponse({"ok": True, "user": await signed_in(request), "tier": await plan_of(request)})

    async def health(request):
        return JSONResponse({"ok": True})

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await limiter.open()
        create = "CREATE TABLE IF NOT EXISTS app_users (name text PRIMARY KEY, password text NOT NULL, plan text NOT NULL)"
        await query(create)
        for name, password, plan in options.users:
            await query("INSERT INTO app_users VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE "
                        "SET password = excluded.password, plan = excluded.plan", name, password, plan)
        for name, definition in POLICIES.items():
            await query("SELECT rl_policy_set(?, ?)", name, json.dumps(definition))
        yield
        await limiter.aclose()

    def cost_of(request):
        try:
            cost = float(request.query_params.get("cost", "1"))
        except ValueError:
            return 1.0
        return cost if cost > 0 else 1.0

    app = Starlette(routes=[Path("/work", work), Path("/login", login), Path("/webhooks", webhooks),
                            Path("/health", health)], lifespan=lifespan)
    app.add_middleware(
        RateLimitMiddleware, limiter=limiter, identify=user_of, tier=plan_of,
        routes={
            "/login": Route(policy="login", sensitive=True),
            "/webhooks": Route(policy="webhooks"),
            "/work": Route(limits=[{"burst": options.burst, "refill_per_minute": options.per_minute},
                                   {"period": "day", "quota": options.daily}], cost=cost_of,
                           # the work's own failure (a 5xx) gives back what it took; the
                           # client cannot cause one (?fail=1 stands for a broken backend)
                           refund_on=["5xx"]),
        })
    return app


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    engine = p.add_mutually_exclusive_group(required=True)
    engine.add_argument("--sqlite", metavar="FILE", help="SQLite database file")
    engine.add_argument("--postgres", metavar="DSN", help="libpq connection string (pg_ratelimit installed)")
    p.add_argument("--extension", default=DEFAULT_EXTENSION, help="path of libratelimit for SQLite")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--check-timeout", type=float, default=None, metavar="SECONDS",
                   help="how long a check may take before the database counts as unreachable and the fallback "
                        "decides (default: the limiter's, 1 s on SQLite and 0.5 s on PostgreSQL)")
    p.add_argument("--burst", type=float, default=5)
    p.add_argument("--per-minute", type=float, default=30)
    p.add_argument("--daily", type=float, default=1000)
    p.add_argument("--user", action="append", default=[], metavar="NAME:PASSWORD:PLAN",
                   help="a user row (plan free or pro); repeatable")
    options = p.parse_args()
    options.users = [tuple(u.split(":", 2)) for u in options.user]
    # bound before it is announced: a client may connect as soon as it reads the line
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", options.port))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(make_app(options), log_level="warning", access_log=False))
    # --port 0: a free port, the one this line names
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
