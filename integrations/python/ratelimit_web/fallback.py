"""The in-process token buckets a route falls back on while the database is unreachable."""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable


class LocalBucket:
    """Token buckets per subject in this process only (each worker process has its own),
    at most `max_subjects` of them (the least recently used is forgotten)."""

    def __init__(self, burst: float, refill_per_minute: float, *, max_subjects: int = 10_000,
                 clock: Callable[[], float] = time.monotonic):
        self.burst, self.per_second = float(burst), float(refill_per_minute) / 60.0
        self.max_subjects, self.clock = max_subjects, clock
        self.buckets: "OrderedDict[str, tuple]" = OrderedDict()

    def take(self, subject: str, cost: float = 1.0) -> float:
        """Takes `cost` from the subject's bucket: 0 when admitted, else the seconds until
        it would be (infinity for a cost above the burst)."""
        now = self.clock()
        level, at = self.buckets.pop(subject, (self.burst, now))
        level = min(self.burst, level + (now - at) * self.per_second)
        admitted = cost <= level
        self.buckets[subject] = (level - cost if admitted else level, now)
        if len(self.buckets) > self.max_subjects:
            self.buckets.popitem(last=False)
        if admitted:
            return 0.0
        if cost > self.burst or self.per_second <= 0:
            return float("inf")
        return (cost - level) / self.per_second
