"""Rate limits for web applications, decided inside PostgreSQL (pg_ratelimit) or SQLite
(sqlite ratelimit): middleware for ASGI (Starlette, FastAPI), WSGI (Flask) and Django,
and an httpx transport that honours Retry-After."""
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
    "Route",
    "SQLiteLimiter",
    "SyncPostgresLimiter",
    "SyncSQLiteLimiter",
]
