"""The ASGI application (Starlette) the middleware tests run under uvicorn; its routes and
settings are routes.py's."""
import contextlib
import dataclasses

import anyio

from starlette.applications import Starlette
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as Path

from ratelimit_web import Counters, PostgresLimiter, RateLimitMiddleware, SQLiteLimiter
from ratelimit_web.metrics import PrometheusMetrics
from routes import DB, ENGINE, EXTENSION, options, routes

if ENGINE == "sqlite":
    limiter = SQLiteLimiter(DB, extension=EXTENSION)
else:
    limiter = PostgresLimiter(DB, min_size=2, max_size=8)


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
    counters=COUNTERS, metrics=METRICS, routes=routes(), **options())
