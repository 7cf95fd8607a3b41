"""The Flask application the tests serve with gunicorn (threads): RateLimitWSGI over a
sync limiter, on routes.py's routes (the spec's)."""
import dataclasses
import time

from flask import Flask, jsonify, request

from ratelimit_web import SyncPostgresLimiter, SyncSQLiteLimiter, charge, refund
from ratelimit_web.rules import normalize_path
from ratelimit_web.wsgi import RateLimitWSGI
from routes import DB, ENGINE, EXTENSION, limiter_options, ok_paths, options, ran, routes, runs, signed_in

app = Flask(__name__)


@app.route("/api/<name>")
def ok(name=None):
    ran(normalize_path(request.path))
    return jsonify(ok=True, path=request.path)


for path in ok_paths():
    app.add_url_rule(path, view_func=ok, methods=["GET", "POST"])


@app.route("/ai")
@app.route("/pai")
@app.route("/bill")
def ai():
    """The work, then its real cost charged (or an estimate's surplus refunded)."""
    ran(normalize_path(request.path))
    if "tokens" in request.args:
        charge(request, float(request.args["tokens"]))
    if "refund" in request.args:
        refund(request, float(request.args["refund"]))
    return jsonify(ok=True, path=request.path)


@app.route("/slow")
def slow():
    time.sleep(float(request.args.get("seconds", "0.5")))
    return jsonify(ok=True)


@app.route("/fail")
@app.route("/pfail")
@app.route("/sms")
@app.route("/refund/<order>")
def fail(order=None):
    ran(normalize_path(request.path))
    if request.args.get("how") == "503":
        return jsonify(ok=False), 503
    if request.args.get("how") == "ok":
        return jsonify(ok=True)
    raise RuntimeError("the handler failed")


@app.route("/counts")
def counts():
    return jsonify(dataclasses.asdict(app.wsgi_app.counters))


@app.route("/runs")
def run_counts():
    return jsonify(runs())


def user(environ):
    name = signed_in(environ.get("HTTP_AUTHORIZATION"))[0]
    return name and "user:" + name


limiter = (SyncSQLiteLimiter(DB, extension=EXTENSION, **limiter_options()) if ENGINE == "sqlite"
           else SyncPostgresLimiter(DB, max_size=8, **limiter_options()))
app.wsgi_app = RateLimitWSGI(app.wsgi_app, limiter, routes(), identify=user,
                             tier=lambda e: signed_in(e.get("HTTP_AUTHORIZATION"))[1], **options())
