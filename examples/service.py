"""A small HTTP service whose /work endpoint is rate limited inside its database.

Each user gets a bucket (a burst, refilled per minute) and a daily budget, checked
together with rl_take_all: both are charged, or neither. A refused request gets 429 with
Retry-After and the RateLimit headers from rl_headers, and the body
{"error": "rate_limited", "retry_after": n}. A request whose cost (`&cost=`, default 1)
is above a limit can never pass: it gets 413 and no Retry-After. When the work fails after
it was admitted, the service gives the tokens and the budget back (rl_refund,
rl_refund_budget). /health is never limited.

    /usr/bin/python3 examples/service.py --sqlite app.db --port 8080
    /usr/bin/python3 examples/service.py --postgres "dbname=app" --port 8080
    curl -i 'localhost:8080/work?user=alice'          (add &fail=1 to simulate a failure)
"""
import argparse
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

HERE = os.path.dirname(os.path.abspath(__file__))
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
            if url.path == "/health":
                return self.reply(200, {"ok": True})
            if url.path != "/work":
                return self.reply(404, {"error": "not_found"})
            user = query.get("user", ["anonymous"])[0]
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
    options = p.parse_args()
    limits = Limits(options)
    if options.postgres:
        limits.call("1")  # fail fast if the database is unreachable
    server = ThreadingHTTPServer(("127.0.0.1", options.port), make_handler(limits))
    print(f"listening on http://127.0.0.1:{options.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
