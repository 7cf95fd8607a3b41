"""The application the middleware tests run under uvicorn, configured by environment:
RL_WEB_ENGINE (sqlite or postgres), RL_WEB_DB (a file, or a libpq connection string),
RL_WEB_EXTENSION (SQLite's libratelimit), RL_WEB_TIMEOUT (the per-check timeout), and the
opt-in defenses RL_WEB_REFUSAL_CACHE (entries) and RL_WEB_MAX_IN_FLIGHT; RL_WEB_EXTRA_POLICY
adds a route /extra limited by that policy (which may not exist)."""
import contextlib
import dataclasses
import os

import anyio

from starlette.applications import Starlette
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as Path

from ratelimit_web import Counters, PostgresLimiter, RateLimitMiddleware, Route, SQLiteLimiter
from ratelimit_web.metrics import PrometheusMetrics

NEVER_REFILLS = 1e-6  # tokens per minute: a run sees exactly the burst
ENGINE = os.environ["RL_WEB_ENGINE"]
if ENGINE == "sqlite":
    limiter = SQLiteLimiter(os.environ["RL_WEB_DB"], extension=os.environ["RL_WEB_EXTENSION"])
else:
    limiter = PostgresLimiter(os.environ["RL_WEB_DB"], min_size=2, max_size=8)


async def ok(request):
    return JSONResponse({"ok": True, "path": request.url.path})


COUNTERS = Counters()
METRICS = PrometheusMetrics(registry=CollectorRegistry())


async def metrics(request):
    return Response(generate_latest(METRICS.registry), media_type=CONTENT_TYPE_LATEST)


async def counts(request):
    return JSONResponse(dataclasses.asdict(COUNTERS))


async def slow(request):
    await anyio.sleep(float(request.query_params.get("seconds", "0.5")))
    return JSONResponse({"ok": True})


async def fail(request):
    if request.query_params.get("how") == "503":
        return JSONResponse({"ok": False}, status_code=503)
    if request.query_params.get("how") == "ok":
        return JSONResponse({"ok": True})
    raise RuntimeError("the handler failed")


@contextlib.asynccontextmanager
async def lifespan(app):
    await limiter.open()
    yield
    await limiter.aclose()


def user(request):
    return request.headers.get("x-user") and "user:" + request.headers["x-user"]


app = Starlette(
    routes=[Path("/health", ok), Path("/ready", ok), Path("/exact", ok), Path("/policy", ok), Path("/login", ok, methods=["GET", "POST"]),
            Path("/api/{name}", ok), Path("/fail", fail), Path("/pfail", fail), Path("/open", ok), Path("/retry", ok, methods=["GET", "POST"]), Path("/free", ok), Path("/big", ok),
            Path("/counts", counts), Path("/metrics", metrics), Path("/slow", slow), Path("/flood", ok), Path("/gone", ok), Path("/extra", ok)],
    lifespan=lifespan)
app.add_middleware(
    RateLimitMiddleware, limiter=limiter, identify=user, tier=lambda r: r.headers.get("x-plan"),
    trusted_proxies=["127.0.0.1/32"], check_timeout=float(os.environ.get("RL_WEB_TIMEOUT", "0.05")),
    skip=["/health", "/ready", "/counts", "/metrics"], counters=COUNTERS, metrics=METRICS,
    refusal_cache=int(os.environ.get("RL_WEB_REFUSAL_CACHE", "0")),
    max_in_flight=int(os.environ["RL_WEB_MAX_IN_FLIGHT"]) if os.environ.get("RL_WEB_MAX_IN_FLIGHT") else None,
    routes={
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
    })
