import asyncio
import dataclasses
import time

from django.conf import settings
from django.db import connection
from django.http import JsonResponse

from ratelimit_web import Route, charge, refund
from ratelimit_web.django import rate_limit
from ratelimit_web.rules import normalize_path
from routes import SPEC, ran, runs, signed_in

NEVER_REFILLS = SPEC["never_refills"]


def ok(request, name=None):
    ran(normalize_path(request.path))
    return JsonResponse({"ok": True, "path": request.path})


def ai(request):
    """The work, then its real cost charged (or an estimate's surplus refunded): a sync view."""
    ran(normalize_path(request.path))
    if "tokens" in request.GET:
        charge(request, float(request.GET["tokens"]))
    if "refund" in request.GET:
        refund(request, float(request.GET["refund"]))
    return JsonResponse({"ok": True, "path": request.path})


async def ai_async(request):
    """The same from an async view: awaited."""
    ran(normalize_path(request.path))
    if "tokens" in request.GET:
        await charge(request, float(request.GET["tokens"]))
    if "refund" in request.GET:
        await refund(request, float(request.GET["refund"]))
    return JsonResponse({"ok": True, "path": request.path})


def slow(request):
    time.sleep(float(request.GET.get("seconds", "0.5")))
    return JsonResponse({"ok": True})


def fail(request, order=None):
    ran(normalize_path(request.path))
    if request.GET.get("how") == "503":
        return JsonResponse({"ok": False}, status=503)
    if request.GET.get("how") == "ok":
        return JsonResponse({"ok": True})
    raise RuntimeError("the handler failed")


def counts(request):
    return JsonResponse(dataclasses.asdict(settings.RATELIMIT["counters"]))


def run_counts(request):
    return JsonResponse(runs())


# Limited by the decorator instead of the middleware (routes.py does not name them).
@rate_limit(Route(limits=[{"burst": 3, "refill_per_minute": NEVER_REFILLS}], name="decorated", refund_on=["5xx"]))
def decorated(request):
    """Writes a row, then fails as asked: under ATOMIC_REQUESTS a raise rolls both back."""
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS visits (who text)")
        cur.execute("INSERT INTO visits VALUES (%s)", [signed_in(request.headers.get("authorization"))[0] or ""])
    return fail(request)


@rate_limit(Route(limits=[{"burst": 3, "refill_per_minute": NEVER_REFILLS}], name="decorated_async"))
async def decorated_async(request):
    await asyncio.sleep(0)
    return JsonResponse({"ok": True})
