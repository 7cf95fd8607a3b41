"""The Django project the tests serve with gunicorn (WSGI, threads) and uvicorn (ASGI): the
middleware on routes.py's routes, over Django's own connection; RL_WEB_ATOMIC=1 turns on
ATOMIC_REQUESTS."""
import os

from ratelimit_web import Counters
from routes import DB, ENGINE, EXTENSION, options, routes, signed_in

SECRET_KEY = "tests only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "django_site.urls"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth"]
MIDDLEWARE = ["ratelimit_web.django.RateLimitMiddleware"]
USE_TZ = True
ATOMIC = os.environ.get("RL_WEB_ATOMIC") == "1"
if ENGINE == "sqlite":
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": DB, "ATOMIC_REQUESTS": ATOMIC,
                             "OPTIONS": {"timeout": float(os.environ.get("RL_WEB_TIMEOUT") or 5)}}}
else:
    # persistent connections under WSGI, as a deployment on PostgreSQL has them (one per
    # request is slow); none under ASGI, as Django advises: there each request runs its
    # database work in a thread of its own, and persistent connections pile up past the
    # server's max_connections under a burst
    ASGI = os.environ.get("RL_DJANGO_ASGI") == "1"
    DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": DB.removeprefix("dbname="),
                             "CONN_MAX_AGE": 0 if ASGI else 60, "ATOMIC_REQUESTS": ATOMIC}}


def _user(request):
    name = signed_in(request.headers.get("authorization"))[0]
    return name and "user:" + name


RATELIMIT = {"routes": routes(), "identify": _user,
             "tier": lambda request: signed_in(request.headers.get("authorization"))[1],
             "extension": EXTENSION, "counters": Counters(), **options()}
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"console": {"class": "logging.StreamHandler"}},
           "loggers": {"ratelimit_web": {"handlers": ["console"], "level": "WARNING"},
                       "django.request": {"handlers": ["console"], "level": "ERROR"}}}
