"""Rate limits for web applications, decided inside PostgreSQL (pg_ratelimit) or SQLite
(sqlite ratelimit): an ASGI middleware for Starlette and FastAPI, and an httpx transport
that honours Retry-After."""
from .fallback import LocalBucket
from .limiter import DatabaseUnavailable, PostgresLimiter, SQLiteLimiter
from .middleware import Counters, RateLimitMiddleware, RefusalCache, Route

__all__ = [
    "Counters",
    "DatabaseUnavailable",
    "LocalBucket",
    "PostgresLimiter",
    "RateLimitMiddleware",
    "RefusalCache",
    "Route",
    "SQLiteLimiter",
]
