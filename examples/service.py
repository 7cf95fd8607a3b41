"""A small HTTP service rate limited inside its database.

/login and /webhooks are limited by policies, rows in the database that every service
shares (a strict login policy, a generous webhook one with a "pro" tier of five times
the limits); the tier is read from the user's row in the same statement. A wrong
password records a strike (rl_penalize): after three, the subject is blocked for 120 s,
then 240 s, ..., and every policy refuses it meanwhile.

/work shows explicit limits instead:
Each user gets a bucket (a burst, refilled per minute) and a daily budget, checked
together with rl_take_all: both are charged, or neither. A refused request gets 429 with
Retry-After and the RateLimit headers from rl_headers, and the body
{"error": "rate_limited", "retry_after": n}. A request whose cost (`&cost=`, default 1)
is above a limit can never pass: it gets 413 and no Retry-After. When the work fails after
it was admitted, the service gives the tokens and the budget back (rl_refund,
rl_refund_budget). /health is never limited.

    /usr/bin/python3 examples/service.py --sqlite app.db --port 8080 --user alice:secret:pro
    /usr/bin/python3 examples/service.py --postgres "dbname=app" --port 8080
    curl -i 'localhost:8080/work?user=alice'          (add &fail=1 to simulate a failure)
    curl -i 'localhost:8080/login?user=alice&password=secret'
    curl -i 'localhost:8080/webhooks?user=alice'
"""
import argparse
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

HERE = os.path.dirname(os.path.abspath(__file__))

# The endpoint registry: each policy is set once at start (in production, by a deploy step
# running as a member of rl_admin) and changed without a redeploy.
POLICIES = {
    "login": {"limits": [{"burst": 5, "refill_per_minute": 5}, {"limit": 20, "window_seconds": 3600}],
              "tiers": {"free": 1, "pro": 1}},  # every plan gets the same few attempts
    "webhooks": {"limits": [{"burst": 200, "refill_per_minute": 200}], "tiers": {"free": 1, "pro": 5}},
}
ENDPOINTS = {"/login": "login", "/webhooks": "webhooks"}
EXEMPT = {"/health"}
DEFAULT_EXTENSION = os.path.join(os.path.dirname(HERE), "target", "release", "libratelimit")


class Limits:
    """The database side: one connection per thread, every limit check one SQL call."""

    def __init__(self, options):
        self.options = options
        self.local = threading.local()

    def connection(self):
        conn = getattr(self.local, "conn", None)
        if conn is None:
            if self.options.sqlite:
                import sqlite3

                conn = sqlite3.connect(self.options.sqlite, timeout=10, isolation_level=None)
                conn.enable_load_extension(True)
                conn.load_extension(self.options.extension)
                conn.enable_load_extension(False)
            else:
                import psycopg2

                conn = psycopg2.connect(self.options.postgres)
                conn.autocommit = True
            self.local.conn = conn
        return conn

    def call(self, sql, *args):
        """Runs `SELECT <sql>` with the args; returns the single value, JSON decoded."""
        conn = self.connection()
        if self.options.sqlite:
            value = conn.execute("SELECT " + sql.replace("%s", "?"), args).fetchone()[0]
        else:
            with conn.cursor() as cur:
                cur.execute("SELECT " + sql, args)
                value = cur.fetchone()[0]
        return json.loads(value) if isinstance(value, str) else value

    def setup(self, users):
        """The users table the tiers are read from, and the policies of the registry."""
        create = "CREATE TABLE IF NOT EXISTS app_users (name text PRIMARY KEY, password text NOT NULL, plan text NOT NULL)"
        conn = self.connection()
        if self.options.sqlite:
            conn.execute(create)
            conn.executemany("INSERT OR REPLACE INTO app_users VALUES (?, ?, ?)", users)
        else:
            with conn.cursor() as cur:
                cur.execute(create)
                cur.executemany("INSERT INTO app_users VALUES (%s, %s, %s) ON CONFLICT (name) DO UPDATE "
                                "SET password = EXCLUDED.password, plan = EXCLUDED.plan", users)
        for name, definition in POLICIES.items():
            self.call("rl_policy_set(%s, %s)", name, json.dumps(definition))

    def check(self, policy, user):
        """rl_check with the user's plan as the tier (users without a row are free)."""
        result = self.call("rl_check(%s, %s, 1, coalesce((SELECT plan FROM app_users WHERE name = %s), 'free'))",
                           policy, user, user)
        return result, self.call("rl_headers(%s)", json.dumps(result))

    def password_matches(self, user, password):
        return bool(self.call("EXISTS (SELECT 1 FROM app_users WHERE name = %s AND password = %s)", user, password))

    def limits_for(self, user, cost):
        o = self.options
        key = json.dumps(["example", user])  # the same encoding rl_key uses
        return key, [
            {"key": key, "burst": o.burst, "refill_per_minute": o.per_minute, "cost": cost},
            {"key": key, "period": "day", "quota": o.daily, "cost": cost},
        ]

    def admit(self, user, cost):
        key, limits = self.limits_for(user, cost)
        result = self.call("rl_take_all(%s)", json.dumps(limits))
        return result, self.call("rl_headers(%s)", json.dumps(result))

    def refund(self, user, cost):
        key, _ = self.limits_for(user, cost)
        o = self.options
        self.call("rl_refund(%s, %s, %s, %s)", key, o.burst, o.per_minute, cost)
        self.call("rl_refund_budget(%s, 'day', %s)", key, cost)


def make_handler(limits):
    class Handler(BaseHTTPRequestHandler):
        def reply(self, status, body, headers=None):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            url = urlparse(self.path)
            query = parse_qs(url.query)
            if url.path in EXEMPT:
                return self.reply(200, {"ok": True})
            user = query.get("user", ["anonymous"])[0]
            if url.path in ENDPOINTS:
                return self.by_policy(ENDPOINTS[url.path], user, query)
            if url.path != "/work":
                return self.reply(404, {"error": "not_found"})
            try:
                cost = float(query.get("cost", ["1"])[0])
            except ValueError:
                return self.reply(400, {"error": "cost must be a number"})
            if not cost > 0:
                return self.reply(400, {"error": "cost must be greater than 0"})
            result, headers = limits.admit(user, cost)
            if any(item["exceeds_limit"] for item in result["items"]):
                # no wait would admit it: not "too many requests" but "too large a request"
                return self.reply(413, {"error": "cost_above_limit"}, headers)
            if not result["admitted"]:
                return self.reply(429, {"error": "rate_limited", "retry_after": result["retry_after_seconds"]}, headers)
            try:
                if query.get("fail") == ["1"]:
                    raise RuntimeError("the work failed")
                return self.reply(200, {"ok": True, "user": user}, headers)
            except RuntimeError as e:
                limits.refund(user, cost)  # the caller did not get what it paid for
                return self.reply(500, {"error": str(e)})

        def by_policy(self, policy, user, query):
            result, headers = limits.check(policy, user)
            if not result["admitted"]:
                body = {"error": "blocked" if result["blocked"] else "rate_limited",
                        "retry_after": result["retry_after_seconds"]}
                return self.reply(429, body, headers)
            if policy == "login" and not limits.password_matches(user, query.get("password", [""])[0]):
                strike = limits.call("rl_penalize(%s)", user)  # three free strikes, then blocks
                return self.reply(401, {"error": "wrong_password", "strikes": strike["strikes"]}, headers)
            return self.reply(200, {"ok": True, "user": user, "tier": result["tier"]}, headers)

        def log_message(self, *args):  # keep the example quiet
            pass

    return Handler


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    engine = p.add_mutually_exclusive_group(required=True)
    engine.add_argument("--sqlite", metavar="FILE", help="SQLite database file")
    engine.add_argument("--postgres", metavar="DSN", help="libpq connection string (pg_ratelimit installed)")
    p.add_argument("--extension", default=DEFAULT_EXTENSION, help="path of libratelimit for SQLite")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--burst", type=float, default=5)
    p.add_argument("--per-minute", type=float, default=30)
    p.add_argument("--daily", type=float, default=1000)
    p.add_argument("--user", action="append", default=[], metavar="NAME:PASSWORD:PLAN",
                   help="a user row (plan free or pro); repeatable")
    options = p.parse_args()
    limits = Limits(options)
    limits.setup([tuple(u.split(":", 2)) for u in options.user])  # also fails fast if the database is unreachable
    server = ThreadingHTTPServer(("127.0.0.1", options.port), make_handler(limits))
    print(f"listening on http://127.0.0.1:{options.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
