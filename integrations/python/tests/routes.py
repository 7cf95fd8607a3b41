"""The routes every test application limits, whatever its framework (app.py: ASGI;
flask_app.py: WSGI; django_site: Django), and the settings they share, from the
environment: RL_WEB_ENGINE (sqlite or postgres), RL_WEB_DB (a file, or a libpq connection
string), RL_WEB_EXTENSION (SQLite's libratelimit), RL_WEB_TIMEOUT (the per-check timeout),
the opt-in defenses RL_WEB_REFUSAL_CACHE (entries) and RL_WEB_MAX_IN_FLIGHT;
RL_WEB_EXTRA_POLICY adds a route /extra limited by that policy (which may not exist)."""
import os

from ratelimit_web import Route

NEVER_REFILLS = 1e-6  # tokens per minute: a run sees exactly the burst
ENGINE = os.environ["RL_WEB_ENGINE"]
DB = os.environ["RL_WEB_DB"]
EXTENSION = os.environ.get("RL_WEB_EXTENSION")
TIMEOUT = float(os.environ.get("RL_WEB_TIMEOUT", "0.05"))
SKIP = ["/health", "/ready", "/counts", "/metrics"]


def options():
    """The middleware's options but its limiter, identify and tier (each framework reads
    its requests its own way)."""
    return dict(trusted_proxies=["127.0.0.1/32"], check_timeout=TIMEOUT, skip=SKIP,
                refusal_cache=int(os.environ.get("RL_WEB_REFUSAL_CACHE", "0")),
                max_in_flight=int(os.environ["RL_WEB_MAX_IN_FLIGHT"]) if os.environ.get("RL_WEB_MAX_IN_FLIGHT") else None)


def routes():
    return {
        "/exact": Route(limits=[{"burst": 300, "refill_per_minute": NEVER_REFILLS}]),
        "/policy": Route(policy="web_exact"),
        "/login": Route(policy="web_login", sensitive=True),
        "GET /api/*": Route(limits=[{"burst": 5, "refill_per_minute": NEVER_REFILLS}, {"period": "day", "quota": 8}],
                            tiers={"free": 1, "pro": 2}),
        "/fail": Route(limits=[{"burst": 2, "refill_per_minute": NEVER_REFILLS}]),
        "/pfail": Route(policy="web_fail"),
        "/open": Route(limits=[{"burst": 40, "refill_per_minute": NEVER_REFILLS}]),
        "/retry": Route(limits=[{"burst": 1, "refill_per_minute": 60}]),
        "/big": Route(limits=[{"burst": 5, "refill_per_minute": 60}], cost=10),
        "/slow": Route(limits=[{"burst": 1000, "refill_per_minute": NEVER_REFILLS}]),
        "/flood": Route(policy="web_flood"),
        "/gone": Route(policy="web_gone"),
        **({"/extra": Route(policy=os.environ["RL_WEB_EXTRA_POLICY"])} if os.environ.get("RL_WEB_EXTRA_POLICY") else {}),
    }
