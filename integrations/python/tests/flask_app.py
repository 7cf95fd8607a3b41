"""The Flask application the tests serve with gunicorn (threads): RateLimitWSGI over a
sync limiter, on routes.py's routes."""
import dataclasses
import time

from flask import Flask, jsonify, request

from ratelimit_web import SyncPostgresLimiter, SyncSQLiteLimiter
from ratelimit_web.wsgi import RateLimitWSGI
from routes import DB, ENGINE, EXTENSION, TIMEOUT, options, routes

app = Flask(__name__)


@app.route("/health")
@app.route("/ready")
@app.route("/exact")
@app.route("/policy")
@app.route("/login", methods=["GET", "POST"])
@app.route("/api/<name>")
@app.route("/open")
@app.route("/retry", methods=["GET", "POST"])
@app.route("/free")
@app.route("/big")
@app.route("/flood")
@app.route("/gone")
@app.route("/extra")
def ok(name=None):
    return jsonify(ok=True, path=request.path)


@app.route("/slow")
def slow():
    time.sleep(float(request.args.get("seconds", "0.5")))
    return jsonify(ok=True)


@app.route("/fail")
@app.route("/pfail")
def fail():
    if request.args.get("how") == "503":
        return jsonify(ok=False), 503
    if request.args.get("how") == "ok":
        return jsonify(ok=True)
    raise RuntimeError("the handler failed")


@app.route("/counts")
def counts():
    return jsonify(dataclasses.asdict(app.wsgi_app.counters))


def user(environ):
    return environ.get("HTTP_X_USER") and "user:" + environ["HTTP_X_USER"]


limiter = (SyncSQLiteLimiter(DB, extension=EXTENSION, busy_timeout=TIMEOUT) if ENGINE == "sqlite"
           else SyncPostgresLimiter(DB, max_size=8, timeout=TIMEOUT))
app.wsgi_app = RateLimitWSGI(app.wsgi_app, limiter, routes(), identify=user, tier=lambda e: e.get("HTTP_X_PLAN"),
                             **options())
