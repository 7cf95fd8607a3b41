"""The test application's routes, policies and options, read from the spec every web
package shares (integrations/spec/app.json), and what each framework's test application
(app.py: ASGI; flask_app.py: WSGI; django_site: Django) does alike: who is signed in (a
bearer token signed with the spec's secret, never a header the client chooses), and the
handlers' runs. Settings from the environment: RL_WEB_ENGINE (sqlite or postgres),
RL_WEB_DB (a file, or a libpq connection string), RL_WEB_EXTENSION (SQLite's
libratelimit), RL_WEB_TIMEOUT (the limiter's timeout), the opt-in defenses
RL_WEB_REFUSAL_CACHE (entries) and RL_WEB_MAX_IN_FLIGHT; RL_WEB_EXTRA_POLICY adds a route
/extra limited by that policy (which may not exist), RL_WEB_EXTRA_LIMITS one whose explicit
limits are that JSON (which the engine may refuse)."""
import collections
import hashlib
import hmac
import json
import os
import threading
import urllib.parse

from ratelimit_web import Route

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = json.load(open(os.path.join(HERE, "..", "..", "spec", "app.json")))
ENGINE = os.environ.get("RL_WEB_ENGINE", "")
DB = os.environ.get("RL_WEB_DB", "")
EXTENSION = os.environ.get("RL_WEB_EXTENSION")
# the limiter's timeout when a test sets one; else the limiter's default, as a user gets it
TIMEOUT = float(os.environ["RL_WEB_TIMEOUT"]) if os.environ.get("RL_WEB_TIMEOUT") else None
SKIP = SPEC["options"]["skip"]


def options():
    """The middleware's options but its limiter, identify and tier (each framework reads
    its requests its own way)."""
    return dict(trusted_proxies=SPEC["options"]["trusted_proxies"], skip=SKIP,
                refusal_cache=int(os.environ.get("RL_WEB_REFUSAL_CACHE", "0")),
                max_in_flight=int(os.environ["RL_WEB_MAX_IN_FLIGHT"]) if os.environ.get("RL_WEB_MAX_IN_FLIGHT") else None)


def limiter_options():
    return {"timeout": TIMEOUT} if TIMEOUT is not None else {}


def by_query(name):
    """A route's own `identify`: a query parameter, from whichever request the framework
    gives (a Starlette Request, a WSGI environ, a Django HttpRequest)."""
    def identify(request):
        if isinstance(request, dict):
            return urllib.parse.parse_qs(request.get("QUERY_STRING", "")).get(name, [None])[0]
        if hasattr(request, "GET"):
            return request.GET.get(name)
        return request.query_params.get(name)
    return identify


def period_by_query(name, limits):
    """A route's `limits` as a function of the request: each budget with the period the
    query parameter `name` holds, when it holds one (a customer's own billing period)."""
    read = by_query(name)

    def limits_of(request):
        period = read(request)
        return [{**limit, "period": period} if period and "period" in limit else limit for limit in limits]
    return limits_of


def route_of(fields):
    fields = dict(fields)
    if "identify_by_query" in fields:
        fields["identify"] = by_query(fields.pop("identify_by_query"))
    if "period_by_query" in fields:
        fields["limits"] = period_by_query(fields.pop("period_by_query"), fields["limits"])
    return Route(**fields)


def routes():
    found = {pattern: route_of(fields) for pattern, fields in SPEC["routes"].items()}
    if os.environ.get("RL_WEB_EXTRA_POLICY"):
        found["/extra"] = Route(policy=os.environ["RL_WEB_EXTRA_POLICY"])
    if os.environ.get("RL_WEB_EXTRA_LIMITS"):
        found["/extra"] = Route(limits=json.loads(os.environ["RL_WEB_EXTRA_LIMITS"]))
    return found


# The handlers of their own (the work, the failures, the slow one); every other path a
# route of the spec names exactly is served by the plain handler, `ok`.
OWN_HANDLERS = {"/fail", "/pfail", "/sms", "/slow", "/ai", "/pai", "/bill", "/counts", "/metrics", "/runs"}


def ok_paths():
    """The paths each test application serves with its plain handler (GET and POST): every
    route of the spec named by an exact path and no handler of its own, the paths the
    middleware skips, /free (no route limits it) and /extra (RL_WEB_EXTRA_*). A route added
    to the spec is served without editing the applications."""
    named = {p for p in SPEC["routes"] if p.startswith("/") and "*" not in p and not p.startswith("/refund/")}
    return sorted((named | set(SKIP) | {"/free", "/extra"}) - OWN_HANDLERS)


def signature(claim: str) -> str:
    return hmac.new(SPEC["secret"].encode(), claim.encode(), hashlib.sha256).hexdigest()[:16]


def token(user: str, plan: str = None) -> str:
    """A bearer token for `user` (and `plan`), as the tests' client makes it: the claim
    percent-encoded (a header carries no UTF-8), then its signature."""
    claim = urllib.parse.quote(user, safe="") + (f":{plan}" if plan else "")
    return f"{claim}.{signature(claim)}"


def signed_in(authorization):
    """(user, plan) of a valid bearer token, else (None, None): the tests' stand-in for a
    session check. The user is never taken from a header the client chooses freely."""
    if not authorization or not authorization.startswith("Bearer "):
        return None, None
    claim, _, sig = authorization[len("Bearer "):].rpartition(".")
    if not claim or not hmac.compare_digest(sig, signature(claim)):
        return None, None
    user, _, plan = claim.partition(":")
    return urllib.parse.unquote(user), plan or None


RUNS = collections.Counter()
RUNS_LOCK = threading.Lock()


def ran(path: str) -> None:
    with RUNS_LOCK:
        RUNS[path] += 1


def runs() -> dict:
    with RUNS_LOCK:
        return dict(RUNS)
