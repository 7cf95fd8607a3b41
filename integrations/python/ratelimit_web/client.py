"""An httpx transport that waits and retries when a server says 429 or 503: as long as its
Retry-After says (seconds or an HTTP date), else a capped exponential backoff; with
jitter, a bounded number of retries and an overall deadline. Cancellable: the waits are
anyio sleeps."""
from __future__ import annotations

import email.utils
import random
import time
from datetime import timezone
from typing import Callable, Optional

import anyio
import httpx

IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
# a request that is safe to repeat although its method is not idempotent:
# client.post(url, extensions={"retry_safe": True})
RETRY_SAFE = "retry_safe"


def retry_after_seconds(value: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """Retry-After as seconds from now: a number of seconds or an HTTP date; None when
    absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


class RetryTransport(httpx.AsyncBaseTransport):
    """Wraps another async transport (default: httpx's own). `max_retries` bounds the
    retries of one request and `deadline` (seconds) its whole time, waits included: a
    wait that would end past the deadline is not made and the last answer is returned.
    Without Retry-After, waits `backoff_base` × 2^attempt, at most `backoff_max`, with
    full jitter; with it, the time it says plus up to `jitter` seconds. Methods that are
    not idempotent are retried only when the request says it is safe
    (`extensions={"retry_safe": True}`) or `retry_non_idempotent` is set."""

    def __init__(self, transport: Optional[httpx.AsyncBaseTransport] = None, *, max_retries: int = 3,
                 deadline: float = 30.0, backoff_base: float = 0.5, backoff_max: float = 30.0, jitter: float = 1.0,
                 statuses=(429, 503), retry_non_idempotent: bool = False,
                 clock: Callable[[], float] = time.monotonic, sleep=anyio.sleep, rng: Optional[random.Random] = None):
        self.transport = transport or httpx.AsyncHTTPTransport()
        self.max_retries, self.deadline = max_retries, deadline
        self.backoff_base, self.backoff_max, self.jitter = backoff_base, backoff_max, jitter
        self.statuses, self.retry_non_idempotent = frozenset(statuses), retry_non_idempotent
        self.clock, self.sleep, self.rng = clock, sleep, rng or random.Random()

    def may_retry(self, request: httpx.Request) -> bool:
        safe = request.method in IDEMPOTENT or self.retry_non_idempotent or request.extensions.get(RETRY_SAFE)
        # a streamed body cannot be sent twice
        return bool(safe) and isinstance(request.stream, httpx.ByteStream)

    def wait_for(self, response: httpx.Response, attempt: int) -> float:
        told = retry_after_seconds(response.headers.get("Retry-After"))
        if told is not None:
            return told + self.rng.uniform(0, self.jitter)
        return self.rng.uniform(0, min(self.backoff_max, self.backoff_base * 2 ** attempt))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        ends_at = self.clock() + self.deadline
        attempt = 0
        while True:
            response = await self.transport.handle_async_request(request)
            if response.status_code not in self.statuses or attempt >= self.max_retries or not self.may_retry(request):
                return response
            wait = self.wait_for(response, attempt)
            if self.clock() + wait > ends_at:
                return response
            await response.aclose()
            await self.sleep(wait)
            attempt += 1

    async def aclose(self) -> None:
        await self.transport.aclose()
