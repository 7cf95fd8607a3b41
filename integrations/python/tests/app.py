"""The ASGI application (Starlette) the middleware tests run under uvicorn; its routes and
settings are routes.py's (the spec's)."""
import contextlib
import dataclasses

import anyio

from starlette.applications import Starlette
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as Path

from ratelimit_web import Counters, PostgresLimiter, RateLimitMiddleware, SQLiteLimiter, charge, refund
from ratelimit_web.metrics import PrometheusMetrics
from ratelimit_web.rules import normalize_path
from routes import DB, ENGINE, EXTENSION, limiter_options, ok_paths, options, ran, routes, runs, signed_in

if ENGINE == "sqlite":
    limiter = SQLiteLimiter(DB, extension=EXTENSION, **limiter_options())
else:
    limiter = PostgresLimiter(DB, min_size=2, max_size=8, **limiter_options())


async def ok(request):
    ran(normalize_path(request.url.path))
    return JSONResponse({"ok": True, "path": request.url.path})


async def ai(request):
    """The work, then its real cost charged (or an estimate's surplus refunded): awaited."""
    ran(normalize_path(request.url.path))
    if "tokens" in request.query_params:
        await charge(request, float(request.query_params["tokens"]))
    if "refund" in request.query_params:
        await refund(request, float(request.query_params["refund"]))
    return JSONResponse({"ok": True, "path": request.url.path})


def ai_sync(request):
    """The same from a sync endpoint (Starlette runs it in a worker thread): called."""
    ran(normalize_path(request.url.path))
    if "tokens" in request.query_params:
        charge(request, float(request.query_params["tokens"]))
    if "refund" in request.query_params:
        refund(request, float(request.query_params["refund"]))
    return JSONResponse({"ok": True, "path": request.url.path})


COUNTERS = Counters()
METRICS = PrometheusMetrics(registry=CollectorRegistry())


async def metrics(request):
    return Response(generate_latest(METRICS.registry), media_type=CONTENT_TYPE_LATEST)


async def counts(request):
    return JSONResponse(dataclasses.asdict(COUNTERS))


async def run_counts(request):
    return JSONResponse(runs())


async def slow(request):
    await anyio.sleep(float(request.query_params.get("seconds", "0.5")))
    return JSONResponse({"ok": True})


async def fail(request):
    ran(normalize_path(request.url.path))
    how = request.query_params.get("how")
    if how == "503":
        return JSONResponse({"ok": False}, status_code=503)
    if how == "ok":
        return JSONResponse({"ok": True})
    raise RuntimeError("the handler failed")


@contextlib.asynccontextmanager
async def lifespan(app):
    await limiter.open()
    yield
    await limiter.aclose()


def user(request):
    name = signed_in(request.headers.get("authorization"))[0]
    return name and "user:" + name


def plan(request):
    return signed_in(request.headers.get("authorization"))[1]


app = Starlette(
    routes=[*[Path(p, ok, methods=["GET", "POST"]) for p in ok_paths()],
            Path("/api/{name}", ok), Path("/fail", fail), Path("/pfail", fail), Path("/sms", fail), Path("/refund/{order}", fail),
            Path("/counts", counts), Path("/runs", run_counts), Path("/metrics", metrics), Path("/slow", slow),
            Path("/ai", ai), Path("/pai", ai_sync), Path("/bill", ai)],
    lifespan=lifespan)
app.add_middleware(
    RateLimitMiddleware, limiter=limiter, identify=user, tier=plan,
    counters=COUNTERS, metrics=METRICS, routes=routes(), **options())
