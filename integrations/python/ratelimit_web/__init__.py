"""Rate limits for web applications, decided inside PostgreSQL (pg_ratelimit) or SQLite
(sqlite ratelimit): middleware for ASGI (Starlette, FastAPI), WSGI (Flask) and Django,
`charge` and `refund` for costs known after the work, and an httpx transport that honours
Retry-After."""
from .charging import RequestLimits, charge, refund
from .fallback import LocalBucket
from .limiter import DatabaseUnavailable, PostgresLimiter, SQLiteLimiter, SyncPostgresLimiter, SyncSQLiteLimiter
from .middleware import RateLimitMiddleware
from .rules import Counters, RateLimitRules, RefusalCache, Route

__all__ = [
    "Counters",
    "DatabaseUnavailable",
    "LocalBucket",
    "PostgresLimiter",
    "RateLimitMiddleware",
    "RateLimitRules",
    "RefusalCache",
    "RequestLimits",
    "Route",
    "SQLiteLimiter",
    "SyncPostgresLimiter",
    "SyncSQLiteLimiter",
    "charge",
    "refund",
]
