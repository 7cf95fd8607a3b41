"""One list of calls with explicit now_ms, run against SQLite and PostgreSQL: both engines
must return equal JSON (parsed) and the values the contract states."""
import calendar
import datetime
import json
import re

import pytest

from conftest import CARGO_VERSION, PgEngine, SqliteEngine, pg_available


def ms(*ymd_hms):
    return calendar.timegm(datetime.datetime(*ymd_hms).timetuple()) * 1000


def take(admitted, remaining, limit, retry_ms, reset_s):
    return {
        "admitted": admitted,
        "remaining": remaining,
        "limit": limit,
        "retry_after_ms": retry_ms,
        "retry_after_seconds": -(-retry_ms // 1000),
        "reset_after_seconds": reset_s,
    }


def spend(admitted, used, limit, resets_at_ms, retry_s):
    return {
        "admitted": admitted,
        "used": used,
        "limit": limit,
        "remaining": round(limit - used, 6),
        "resets_at": resets_at_ms // 1000,
        "retry_after_seconds": retry_s,
    }


def zspend(admitted, used, limit, start_ms, end_ms, retry_s, cost=None):
    """An answer of a budget whose period is anchored or zoned: its bounds stated, as the
    UTC calendar of `period_seconds` cannot give them."""
    return {**spend(admitted, used, limit, end_ms, retry_s), "exceeds_limit": cost is not None and cost > limit,
            "period_seconds": (end_ms - start_ms) // 1000}


def period_seconds(period, resets_at):
    """The length of the UTC hour, day, ISO week, month or year that ends at resets_at
    (epoch seconds)."""
    fixed = {"hour": 3600, "day": 86400, "week": 7 * 86400}
    if period in fixed:
        return fixed[period]
    end = datetime.datetime.fromtimestamp(resets_at, datetime.timezone.utc)
    last = end - datetime.timedelta(days=1)
    start = last.replace(day=1) if period == "month" else last.replace(month=1, day=1)
    return int((end - start).total_seconds())


def with_derived_keys(function, args, expected):
    """The keys each result shape carries for headers and clients, from the call's own
    arguments as the contract defines them: `exceeds_limit` (refused for a cost above the
    limit), and the window `w` of rl_headers: a bucket's `refill_seconds` (burst * 60 /
    refill_per_minute) or a budget's `period_seconds`. A step that states them is left as it is."""
    if not isinstance(expected, dict) or "exceeds_limit" in expected:
        return expected
    if function in ("rl_take_all", "rl_check_limits"):
        limits = args[2] if function == "rl_check_limits" else args[0]
        items = [with_derived_keys(kind, args_of, item) for (kind, args_of), item
                 in zip(item_calls(limits), expected["items"])]
        return {**expected, "items": items}
    cost = args[3] if len(args) > 3 else 1
    if function in ("rl_take", "rl_peek", "rl_charge"):
        return {**expected, "exceeds_limit": not expected["admitted"] and cost > args[1],
                "refill_seconds": args[1] * 60 / args[2]}
    if function in ("rl_spend", "rl_budget"):
        return {**expected, "exceeds_limit": not expected["admitted"] and cost > args[2],
                "period_seconds": period_seconds(args[1], expected["resets_at"])}
    if function in ("rl_window", "rl_window_peek", "rl_fixed_window", "rl_fixed_window_peek"):
        return {**expected, "exceeds_limit": not expected["admitted"] and cost > args[1]}
    return expected


def with_reset_after(expected, now_ms):
    """A budget's `reset_after_seconds`, wherever one appears in an answer (rl_spend,
    rl_budget, the items of rl_take_all and of a policy's check): the seconds from the
    call's clock (its last argument) until `resets_at`, rounded up, as the contract defines
    it. A step that states it is left as it is."""
    if isinstance(expected, list):
        return [with_reset_after(e, now_ms) for e in expected]
    if not isinstance(expected, dict):
        return expected
    out = {k: with_reset_after(v, now_ms) for k, v in expected.items()}
    if "period_seconds" in out and "resets_at" in out and "reset_after_seconds" not in out:
        out["reset_after_seconds"] = max(0, -(-(out["resets_at"] * 1000 - now_ms) // 1000))
    return out


def item_calls(limits):
    """rl_take_all's items as the single calls they stand for: (function, arguments)."""
    calls = []
    for item in json.loads(limits):
        cost, m = item.get("cost", 1), item.get("multiplier", 1)  # a multiplier scales the limit
        if "period" in item:
            calls.append(("rl_spend", (item["key"], item["period"], item["quota"] * m, cost)))
        elif "window_seconds" in item or "fixed_window_seconds" in item:
            seconds = item.get("window_seconds", item.get("fixed_window_seconds"))
            calls.append(("rl_window", (item["key"], item["limit"] * m, seconds, cost)))
        else:
            calls.append(("rl_take", (item["key"], item["burst"] * m, item["refill_per_minute"] * m, cost)))
    return calls


def window(admitted, remaining, limit, retry_ms, reset_s, window_s):
    return {**take(admitted, remaining, limit, retry_ms, reset_s), "window_seconds": window_s}


class Lease:
    """A lease id of the form the contract gives, '<issued_ms>-<n>-' then 16 hex digits of
    secret. As an expected value it matches any such id; as an argument it stands for the
    id the engine handed out under that prefix in this run (the secret is random)."""

    def __init__(self, prefix):
        self.prefix = prefix

    def __eq__(self, other):
        return isinstance(other, str) and re.fullmatch(re.escape(self.prefix) + "-[0-9a-f]{16}", other) is not None

    def __repr__(self):
        return f"Lease({self.prefix!r})"


def lease_prefix(lease_id):
    return lease_id.rsplit("-", 1)[0]


def acquired(lease, in_flight, limit, expires_at):
    return {"admitted": True, "lease": Lease(lease), "in_flight": in_flight, "limit": limit, "expires_at": expires_at,
            "retry_after_ms": 0, "retry_after_seconds": 0}


def refused_lease(in_flight, limit, retry_ms):
    return {"admitted": False, "lease": None, "in_flight": in_flight, "limit": limit, "expires_at": None,
            "retry_after_ms": retry_ms, "retry_after_seconds": -(-retry_ms // 1000)}


def bucket_item(admitted, remaining, limit, retry_ms, reset_s, refill_s):
    return {**take(admitted, remaining, limit, retry_ms, reset_s), "exceeds_limit": False, "refill_seconds": refill_s}


def day_budget_item(admitted, used, limit, retry_s=0):
    return {**spend(admitted, used, limit, 86_400_000, retry_s), "exceeds_limit": False, "period_seconds": 86400}


def checked(items, policy, tier=None, retry_ms=0, shadow=False, would_refuse=False, blocked=False):
    admitted = shadow or not would_refuse
    return {"admitted": admitted, "retry_after_ms": retry_ms,
            "retry_after_seconds": None if retry_ms is None else -(-retry_ms // 1000),
            "items": items, "policy": policy, "tier": tier, "shadow": shadow, "would_refuse": would_refuse,
            "blocked": blocked}


def strikes(n, blocked_until=None, retry_s=0, blocked=None):
    blocked = blocked if blocked is not None else blocked_until is not None
    return {"strikes": n, "blocked": blocked, "blocked_until": blocked_until, "retry_after_seconds": retry_s}


LOGIN = {"limits": [{"burst": 5, "refill_per_minute": 5}, {"period": "day", "quota": 100}], "tiers": {"pro": 5},
         "shadow": False}

NOV_29 = ms(2026, 11, 29, 12, 0, 0)
DEC_1 = ms(2026, 12, 1)
MAX_NOW = "253402300799999"

# (function, args, expected[, engine]): expected is a dict (exact JSON), an int, a str
# (rl_key), or ("error", message[, sqlstate]) for an error with that exact text (and in
# PostgreSQL that SQLSTATE, 22023 unless given). This is the one place where error texts
# are asserted. A step naming an engine runs on that engine only: SQLite takes values of
# any type, PostgreSQL's own input parser rejects text that is no number before the call.
STEPS = [
    # the contract's example: burst 3, refill 60/min
    ("rl_take", ("a", 3, 60, 1, 0), take(True, 2, 3, 0, 1)),
    ("rl_take", ("a", 3, 60, 1, 0), take(True, 1, 3, 0, 2)),
    ("rl_take", ("a", 3, 60, 1, 0), take(True, 0, 3, 0, 3)),
    ("rl_take", ("a", 3, 60, 1, 0), take(False, 0, 3, 1000, 3)),
    ("rl_take", ("a", 3, 60, 1, 999), take(False, 0, 3, 1, 3)),
    ("rl_take", ("a", 3, 60, 1, 1000), take(True, 0, 3, 0, 3)),
    ("rl_take", ("b", 3, 60, 1, 1000), take(True, 2, 3, 0, 1)),
    ("rl_take", ("a", 3, 60, 1, 100_000_000), take(True, 2, 3, 0, 1)),
    # cost above burst: refused with the time to refill a full bucket
    ("rl_take", ("c", 3, 60, 5, 0), {**take(False, 3, 3, 3000, 0), "exceeds_limit": True, "refill_seconds": 3}),
    # odd rates: 7/min needs 8572 ms for one token
    ("rl_take", ("odd", 1, 7, 1, 0), take(True, 0, 1, 0, 9)),
    ("rl_take", ("odd", 1, 7, 1, 1), take(False, 0, 1, 8571, 9)),
    ("rl_take", ("odd", 1, 7, 1, 8571), take(False, 0, 1, 1, 1)),
    ("rl_take", ("odd", 1, 7, 1, 8572), take(True, 0, 1, 0, 9)),
    ("rl_take", ("half", 1, 0.5, 1, 0), take(True, 0, 1, 0, 120)),
    ("rl_take", ("half", 1, 0.5, 1, 119_999), take(False, 0, 1, 1, 1)),
    ("rl_take", ("fast", 2, 100000, 2, 0), take(True, 0, 2, 0, 1)),
    ("rl_take", ("fast", 2, 100000, 1, 0), take(False, 0, 2, 1, 1)),
    ("rl_take", ("fast", 2, 100000, 1, 1), take(True, 0, 2, 0, 1)),
    # a clock behind the row gets no refill
    ("rl_take", ("skew", 2, 60, 2, 10_000), take(True, 0, 2, 0, 2)),
    ("rl_take", ("skew", 2, 60, 1, 5_000), take(False, 0, 2, 6000, 7)),
    # limits may change: a lower burst caps the stored level
    ("rl_take", ("cap", 10, 60, 1, 0), take(True, 9, 10, 0, 1)),
    ("rl_take", ("cap", 3, 60, 1, 0), take(True, 2, 3, 0, 1)),
    # fractional burst and cost
    ("rl_take", ("frac", 2.5, 60, 0.5, 0), take(True, 2, 2.5, 0, 1)),
    # budgets: day and month in UTC, separate from each other and from buckets
    ("rl_spend", ("a", "day", 2, 1, NOV_29), spend(True, 1, 2, ms(2026, 11, 30), 0)),
    ("rl_spend", ("a", "day", 2, 1, NOV_29), spend(True, 2, 2, ms(2026, 11, 30), 0)),
    ("rl_spend", ("a", "day", 2, 1, NOV_29), spend(False, 2, 2, ms(2026, 11, 30), 43200)),
    ("rl_budget", ("a", "day", 2, 1, NOV_29), spend(False, 2, 2, ms(2026, 11, 30), 43200)),
    ("rl_budget", ("a", "day", 5, 1, NOV_29), spend(True, 3, 5, ms(2026, 11, 30), 0)),  # as rl_spend would answer
    ("rl_spend", ("a", "month", 2, 1, NOV_29), spend(True, 1, 2, DEC_1, 0)),
    ("rl_spend", ("a", "day", 2, 1, ms(2026, 11, 30)), spend(True, 1, 2, ms(2026, 12, 1), 0)),
    # a spend 1 ms before midnight, and the refusal never says 0 seconds
    ("rl_spend", ("edge", "day", 1, 1, ms(2026, 12, 31, 23, 59, 59) + 999), spend(True, 1, 1, ms(2027, 1, 1), 0)),
    ("rl_spend", ("edge", "day", 1, 1, ms(2026, 12, 31, 23, 59, 59) + 999), spend(False, 1, 1, ms(2027, 1, 1), 1)),
    ("rl_spend", ("edge", "day", 1, 1, ms(2027, 1, 1)), spend(True, 1, 1, ms(2027, 1, 2), 0)),
    ("rl_spend", ("leap", "month", 1, 1, ms(2028, 2, 29, 23)), spend(True, 1, 1, ms(2028, 3, 1), 0)),
    ("rl_spend", ("leap", "day", 1, 1, ms(2028, 2, 28, 23)), spend(True, 1, 1, ms(2028, 2, 29), 0)),
    ("rl_spend", ("dec", "month", 1, 1, ms(2026, 12, 15)), spend(True, 1, 1, ms(2027, 1, 1), 0)),
    # decimal exactness: ten spends of 0.1 fill a quota of 1 exactly
    *[("rl_spend", ("tenth", "day", 1, 0.1, NOV_29), spend(True, round(0.1 * i, 1), 1, ms(2026, 11, 30), 0)) for i in range(1, 10)],
    ("rl_spend", ("tenth", "day", 1, 0.1, NOV_29), spend(True, 1, 1, ms(2026, 11, 30), 0)),
    ("rl_spend", ("tenth", "day", 1, 0.1, NOV_29), spend(False, 1, 1, ms(2026, 11, 30), 43200)),
    # sweep: the bucket "b" (taken at 1000) is full at 2000; budgets end at their period
    ("rl_sweep", (1999,), None),  # value depends on earlier rows; checked for equality only
    ("rl_take", ("sw", 2, 60, 2, 0), take(True, 0, 2, 0, 2)),
    ("rl_sweep", (1999,), 0),
    ("rl_sweep", (2000,), 2),  # "b" and "sw"
    ("rl_take", ("sw", 2, 60, 1, 2500), take(True, 1, 2, 0, 1)),
    # keys
    ("rl_key", ("share1", "caller:2"), '["share1","caller:2"]'),
    ("rl_key", ('a","b',), '["a\\",\\"b"]'),
    ("rl_key", ("a", "b"), '["a","b"]'),
    # the library's version, from Cargo.toml
    ("rl_version", (), CARGO_VERSION),
    ("rl_key", ("ünï", "\n"), '["ünï","\\n"]'),
    # every bad input: a clear error naming the function, the argument and the value
    ("rl_take", (None, 3, 60), ("error", "rl_take: key must be text, got NULL")),
    ("rl_take", ("", 3, 60), ("error", "rl_take: key must not be empty")),
    ("rl_take", ("x" * 1025, 3, 60), ("error", "rl_take: key must be at most 1024 bytes, got 1025 bytes")),
    ("rl_take", ("k", None, 60), ("error", "rl_take: burst must be a finite number greater than 0, got NULL")),
    ("rl_take", ("k", 0, 60), ("error", "rl_take: burst must be a finite number greater than 0, got 0")),
    ("rl_take", ("k", -3, 60), ("error", "rl_take: burst must be a finite number greater than 0, got -3")),
    ("rl_take", ("k", 3, 0), ("error", "rl_take: refill_per_minute must be a finite number greater than 0, got 0")),
    ("rl_take", ("k", 3, None), ("error", "rl_take: refill_per_minute must be a finite number greater than 0, got NULL")),
    ("rl_take", ("k", 3, 60, 0), ("error", "rl_take: cost must be a finite number greater than 0, got 0")),
    ("rl_take", ("k", 3, 60, None), ("error", "rl_take: cost must be a finite number greater than 0, got NULL")),
    ("rl_take", ("k", 3, 60, 1, -1), ("error", "rl_take: now_ms must be an integer number of epoch milliseconds from 0 to 253402300799999, got -1")),
    ("rl_take", ("k", 3, 60, 1, 1.5), ("error", "rl_take: now_ms must be an integer number of epoch milliseconds from 0 to 253402300799999, got 1.5")),
    # hours, ISO weeks (from Monday) and years, in UTC: 1970-01-01 was a Thursday
    ("rl_spend", ("ph", "hour", 2, 1, ms(2026, 12, 6) + 3_599_999), spend(True, 1, 2, ms(2026, 12, 6, 1), 0)),
    ("rl_spend", ("ph", "hour", 2, 1, ms(2026, 12, 6, 1)), spend(True, 1, 2, ms(2026, 12, 6, 2), 0)),
    ("rl_spend", ("pw", "week", 2, 2, 0), spend(True, 2, 2, ms(1970, 1, 5), 0)),
    ("rl_spend", ("pw", "week", 2, 1, 0), spend(False, 2, 2, ms(1970, 1, 5), 4 * 86400)),
    ("rl_spend", ("pw", "week", 2, 1, ms(1970, 1, 5)), spend(True, 1, 2, ms(1970, 1, 12), 0)),
    ("rl_spend", ("py", "year", 10, 4, ms(2028, 2, 29)), spend(True, 4, 10, ms(2029, 1, 1), 0)),
    ("rl_budget", ("py", "year", 10, 0, ms(2028, 12, 31, 23)), spend(True, 4, 10, ms(2029, 1, 1), 0)),
    ("rl_budget", ("py", "year", 10, 0, ms(2029, 1, 1)), spend(True, 0, 10, ms(2030, 1, 1), 0)),
    ("rl_spend", ("pw", "day", 2, 1, 0), spend(True, 1, 2, ms(1970, 1, 2), 0)),  # a day beside the week
    ("rl_spend", ("k", "fortnight", 3), ("error", "rl_spend: period must be 'hour', 'day', 'week', 'month' or 'year', got 'fortnight'")),
    ("rl_spend", ("k", None, 3), ("error", "rl_spend: period must be 'hour', 'day', 'week', 'month' or 'year', got NULL")),
    ("rl_spend", ("k", "day", 0), ("error", "rl_spend: quota must be a finite number greater than 0, got 0")),
    ("rl_spend", ("k", "day", 3, -0.5), ("error", "rl_spend: cost must be a finite number greater than 0, got -0.5")),
    ("rl_spend", (None, "day", 3), ("error", "rl_spend: key must be text, got NULL")),
    ("rl_budget", ("k", "Day", 3), ("error", "rl_budget: period must be 'hour', 'day', 'week', 'month' or 'year', got 'Day'")),
    ("rl_budget", ("k", "day", None), ("error", "rl_budget: quota must be a finite number greater than 0, got NULL")),
    ("rl_sweep", (-1,), ("error", "rl_sweep: now_ms must be an integer number of epoch milliseconds from 0 to 253402300799999, got -1")),
    ("rl_key", ("a", None), ("error", "rl_key: part 2 must not be NULL")),
    ("rl_take", ("k", "abc", 60), ("error", "rl_take: burst must be a finite number greater than 0, got 'abc'"), "sqlite"),
    ("rl_take", ("k", "abc", 60), ("error", 'invalid input syntax for type double precision: "abc"', "22P02"), "postgres"),
    ("rl_take", ("k", b"\xff\xfe", 60), ("error", "rl_take: burst must be a finite number greater than 0, got a blob of 2 bytes"), "sqlite"),
    ("rl_take", (b"\xff", 3, 60), ("error", "rl_take: key must be text, got a blob of 1 byte"), "sqlite"),
    ("rl_take", ("k", float("nan"), 60), ("error", "rl_take: burst must be a finite number greater than 0, got NULL"), "sqlite"),
    ("rl_take", ("k", float("inf"), 60), ("error", "rl_take: burst must be a finite number greater than 0, got Infinity")),
    ("rl_take", ("k", 3, 60, 1, "noon"), ("error", "rl_take: now_ms must be an integer number of epoch milliseconds from 0 to 253402300799999, got 'noon'"), "sqlite"),
    ("rl_take", ("k", 3), ("error", "rl_take: expected 3 to 5 arguments, got 2"), "sqlite"),
    ("rl_sweep", (1, 2, 3), ("error", "rl_sweep: expected 0 to 2 arguments, got 3"), "sqlite"),
    ("rl_version", ("x",), ("error", "rl_version: expected 0 arguments, got 1"), "sqlite"),
    ("rl_version", ("x",), ("error", "function rl_version(unknown) does not exist", "42883"), "postgres"),
    # nothing was written by the failed calls: "k" is still a full bucket
    ("rl_take", ("k", 3, 60, 1, 0), take(True, 2, 3, 0, 1)),
    # sweeping in batches
    ("rl_sweep", (10**10, 1), 1),
    ("rl_sweep", (0, None), 0),
    ("rl_sweep", (None, 0), ("error", "rl_sweep: max_rows must be a positive integer, got 0")),
    # peek: rl_take's answer, taking nothing
    ("rl_take", ("p", 3, 60, 3, 0), take(True, 0, 3, 0, 3)),
    ("rl_peek", ("p", 3, 60, 1, 500), take(False, 0, 3, 500, 3)),
    ("rl_peek", ("p", 3, 60, 1, 1000), take(True, 0, 3, 0, 3)),
    ("rl_take", ("p", 3, 60, 1, 1000), take(True, 0, 3, 0, 3)),
    # refunds: never above burst, never below 0
    ("rl_refund", ("p", 3, 60, 2, 1000), {"remaining": 2, "limit": 3, "reset_after_seconds": 1}),
    ("rl_refund", ("p", 3, 60, 5, 1000), {"remaining": 3, "limit": 3, "reset_after_seconds": 0}),
    ("rl_spend", ("p", "day", 1, 0.7, 0), spend(True, 0.7, 1, ms(1970, 1, 2), 0)),
    ("rl_refund_budget", ("p", "day", 0.2, 0), {"used": 0.5, "resets_at": 86400}),
    ("rl_refund_budget", ("p", "day", 9, 0), {"used": 0, "resets_at": 86400}),
    ("rl_refund", ("p", 3, 60, 0), ("error", "rl_refund: amount must be a finite number greater than 0, got 0")),
    ("rl_refund_budget", ("p", "fortnight", 1), ("error", "rl_refund_budget: period must be 'hour', 'day', 'week', 'month' or 'year', got 'fortnight'")),
    # reset: every bucket and budget under the key
    ("rl_spend", ("p", "month", 1, 1, 0), spend(True, 1, 1, ms(1970, 2, 1), 0)),
    ("rl_reset", ("p",), 3),
    ("rl_reset", ("p",), 0),
    ("rl_reset", ("",), ("error", "rl_reset: key must not be empty")),
    # take_all: all or nothing over buckets and budgets
    ("rl_take_all", ('[{"key":"ta","burst":2,"refill_per_minute":60},{"key":"ta","period":"day","quota":2}]', 0),
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0,
      "items": [take(True, 1, 2, 0, 1), spend(True, 1, 2, ms(1970, 1, 2), 0)]}),
    ("rl_take_all", ('[{"key":"ta","burst":2,"refill_per_minute":60},{"key":"ta","period":"day","quota":1}]', 0),
     {"admitted": False, "retry_after_ms": 86_400_000, "retry_after_seconds": 86_400,
      "items": [take(True, 1, 2, 0, 1), spend(False, 1, 1, ms(1970, 1, 2), 86_400)]}),  # the bucket: as it is now
    ("rl_take", ("ta", 2, 60, 1, 0), take(True, 0, 2, 0, 2)),  # the refused call charged nothing
    ("rl_take_all", ('[{"key":"ta","burst":2,"refill_per_minute":60,"cost":1}]', 500),
     {"admitted": False, "retry_after_ms": 500, "retry_after_seconds": 1, "items": [take(False, 0, 2, 500, 2)]}),
    ("rl_take_all", ('[{"key":"x","burst":1,"refill_per_minute":1},{"key":"x","burst":1,"refill_per_minute":1}]', 0),
     ("error", "rl_take_all: items 1 and 2 are the same limit (one key may appear once per kind and period)")),
    ("rl_take_all", ('[{"key":"x","quota":1,"period":"fortnight"}]', 0),
     ("error", "rl_take_all: item 1: period must be 'hour', 'day', 'week', 'month' or 'year', got 'fortnight'")),
    ("rl_take_all", ('[]', 0), ("error", "rl_take_all: limits must hold 1 to 64 items, got 0")),
    ("rl_take_all", (None, 0), ("error", "rl_take_all: limits must be a JSON array, got NULL")),
    # a JSON boolean, array or object where a number or a key belongs is named as what it is
    ("rl_take_all", ('[{"key":true,"burst":5,"refill_per_minute":60}]', 0),
     ("error", "rl_take_all: item 1: key must be text, got true")),
    ("rl_take_all", ('[{"key":"j","burst":[5],"refill_per_minute":60}]', 0),
     ("error", "rl_take_all: item 1: burst must be a finite number greater than 0, got a JSON array")),
    ("rl_take_all", ('[{"key":"j","burst":5,"refill_per_minute":60,"cost":false}]', 0),
     ("error", "rl_take_all: item 1: cost must be a finite number greater than 0, got false")),
    # rl_check_limits: rl_take_all's answer, counted under a name (tests/test_policies.py)
    ("rl_check_limits", ("POST /ai", "ann", '[{"key":"cl","burst":1,"refill_per_minute":60}]', 0),
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0, "items": [take(True, 0, 1, 0, 1)]}),
    ("rl_check_limits", ("POST /ai", "ann", '[{"key":"cl","burst":1,"refill_per_minute":60}]', 0),
     {"admitted": False, "retry_after_ms": 1000, "retry_after_seconds": 1, "items": [take(False, 0, 1, 1000, 1)]}),
    ("rl_check_limits", ("", "ann", '[{"key":"cl","burst":1,"refill_per_minute":60}]', 0),
     ("error", "rl_check_limits: name must not be empty")),
    ("rl_check_limits", ("POST /ai", None, '[{"key":"cl","burst":1,"refill_per_minute":60}]', 0),
     ("error", "rl_check_limits: subject must be text, got NULL")),
    ("rl_check_limits", ("POST /ai", "ann", None, 0), ("error", "rl_check_limits: limits must be a JSON array, got NULL")),
    ("rl_check_limits", ("POST /ai", "ann", '[]', 0), ("error", "rl_check_limits: limits must hold 1 to 64 items, got 0")),
    # headers from any result
    ("rl_headers", ('{"admitted":false,"remaining":0,"limit":3,"retry_after_ms":1,"retry_after_seconds":1,"reset_after_seconds":3}',),
     {"RateLimit-Policy": '"bucket";q=3', "RateLimit": '"bucket";r=0;t=3', "X-RateLimit-Limit": "3",
      "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "3", "Retry-After": "1"}),
    ("rl_headers", ('{"admitted":true,"used":0.5,"limit":1,"remaining":0.5,"resets_at":86400,"retry_after_seconds":0}',),
     {"RateLimit-Policy": '"budget";q=1', "RateLimit": '"budget";r=0', "X-RateLimit-Limit": "1",
      "X-RateLimit-Remaining": "0.5", "X-RateLimit-Reset": "86400"}),
    # a policy's check: items named by the policy and the kind, a kind that recurs numbered,
    # the policy's name as a structured field's string holds it
    ("rl_headers", (json.dumps({"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0, "items": [
        {"admitted": True, "remaining": 4, "limit": 5, "retry_after_ms": 0, "retry_after_seconds": 0, "reset_after_seconds": 12,
         "exceeds_limit": False, "refill_seconds": 60},
        {"admitted": True, "used": 3, "limit": 50, "remaining": 47, "resets_at": 86400, "retry_after_seconds": 0,
         "exceeds_limit": False, "period_seconds": 86400},
        {"admitted": True, "remaining": 99, "limit": 100, "retry_after_ms": 0, "retry_after_seconds": 0, "reset_after_seconds": 1,
         "exceeds_limit": False, "refill_seconds": 600}],
        "policy": 'lo"gin é', "tier": None, "shadow": False, "would_refuse": False, "blocked": False}),),
     {"RateLimit-Policy": '"lo\\"gin _-bucket-1";q=5;w=60, "lo\\"gin _-budget";q=50;w=86400, "lo\\"gin _-bucket-2";q=100;w=600',
      "RateLimit": '"lo\\"gin _-bucket-1";r=4;t=12, "lo\\"gin _-budget";r=47, "lo\\"gin _-bucket-2";r=99;t=1',
      "X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "4", "X-RateLimit-Reset": "12"}),
    ("rl_headers", (json.dumps({"admitted": False, "retry_after_ms": 1000, "retry_after_seconds": 1, "items": [
        {"admitted": False, "remaining": 0, "limit": 5, "retry_after_ms": 1000, "retry_after_seconds": 1, "reset_after_seconds": 5,
         "exceeds_limit": False, "refill_seconds": 60}], "policy": "login", "tier": None, "shadow": False,
        "would_refuse": True, "blocked": False}),),
     {"RateLimit-Policy": '"login-bucket";q=5;w=60', "RateLimit": '"login-bucket";r=0;t=5', "X-RateLimit-Limit": "5",
      "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "5", "Retry-After": "1"}),
    ("rl_headers", ('{"used":1}',), ("error", "rl_headers: result must be the JSON answer of a limit, budget, window or lease call (such as rl_take, rl_check, rl_spend, rl_fixed_window or rl_acquire)")),
    # sliding window: at most 3 in any 10 s; entries of one millisecond merge
    ("rl_window", ("win", 3, 10, 1, 0), window(True, 2, 3, 0, 10, 10)),
    ("rl_window", ("win", 3, 10, 1, 0), window(True, 1, 3, 0, 10, 10)),
    ("rl_window", ("win", 3, 10, 1, 4000), window(True, 0, 3, 0, 10, 10)),
    # the two units of 0 ms leave at exactly 10 000 ms: 1 ms before, still refused
    ("rl_window", ("win", 3, 10, 1, 9999), window(False, 0, 3, 1, 5, 10)),
    ("rl_window", ("win", 3, 10, 2, 10_000), window(True, 0, 3, 0, 10, 10)),
    # a cost above the limit: the time until the window is empty
    ("rl_window", ("win", 3, 10, 4, 10_000), window(False, 0, 3, 10_000, 10, 10)),
    ("rl_window_peek", ("win", 3, 10, 1, 14_000), window(True, 0, 3, 0, 10, 10)),
    ("rl_window", ("win", 3, 10, 1, 13_999), window(False, 0, 3, 1, 7, 10)),
    ("rl_window_peek", ("win", 3, 10, 1, 13_999), window(False, 0, 3, 1, 7, 10)),  # the refusal recorded nothing
    ("rl_window", ("wf", 1.5, 0.5, 1, 0), window(True, 0, 1.5, 0, 1, 0.5)),
    ("rl_window", ("wf", 1.5, 0.5, 0.5, 499), window(True, 0, 1.5, 0, 1, 0.5)),
    ("rl_window", ("wf", 1.5, 0.5, 0.5, 500), window(True, 0, 1.5, 0, 1, 0.5)),  # 0 ms left at 500 ms
    ("rl_window", (None, 3, 10), ("error", "rl_window: key must be text, got NULL")),
    ("rl_window", ("k", 0, 10), ("error", "rl_window: limit must be a finite number greater than 0, got 0")),
    ("rl_window", ("k", 3, 0), ("error", "rl_window: window_seconds must be a finite number greater than 0, got 0")),
    ("rl_window", ("k", 3, 31_536_001), ("error", "rl_window: window_seconds must be at most 31536000 (one year), got 31536001")),
    ("rl_window", ("k", 3, 10, 0), ("error", "rl_window: cost must be a finite number greater than 0, got 0")),
    ("rl_window_peek", ("k", 3, None), ("error", "rl_window_peek: window_seconds must be a finite number greater than 0, got NULL")),
    # leases: at most 2 in flight, each for 30 s unless released or renewed
    ("rl_acquire", ("job", 2, 30, 0), acquired("0-1", 1, 2, 30_000)),
    ("rl_acquire", ("job", 2, 30, 1000), acquired("1000-2", 2, 2, 31_000)),
    ("rl_acquire", ("job", 2, 30, 2000), refused_lease(2, 2, 28_000)),
    ("rl_in_flight", ("job", 2000), 2),
    ("rl_acquire", ("job", 2, 30, 29_999), refused_lease(2, 2, 1)),
    ("rl_acquire", ("job", 2, 30, 30_000), acquired("30000-3", 2, 2, 60_000)),  # the first expired at exactly 30 s
    ("rl_release", ("job", Lease("0-1"), 30_000), False),  # expired
    ("rl_release", ("job", Lease("1000-2"), 30_000), True),
    ("rl_release", ("job", Lease("1000-2"), 30_000), False),  # true once
    ("rl_release", ("job", "no-such-lease", 30_000), False),
    ("rl_in_flight", ("job", 30_000), 1),
    ("rl_renew", ("job", Lease("30000-3"), 60, 40_000), {"renewed": True, "expires_at": 100_000}),
    ("rl_in_flight", ("job", 99_999), 1),
    ("rl_in_flight", ("job", 100_000), 0),
    ("rl_renew", ("job", Lease("30000-3"), 60, 100_000), {"renewed": False, "expires_at": None}),
    ("rl_acquire", ("job", 1, 30, 100_000), acquired("100000-4", 1, 1, 130_000)),
    # a cap lowered below what is held waits for enough leases to expire
    *[("rl_acquire", ("cap2", 3, 10, t), acquired(f"{t}-{i + 1}", i + 1, 3, t + 10_000)) for i, t in enumerate((0, 1000, 2000))],
    ("rl_acquire", ("cap2", 1, 10, 3000), refused_lease(3, 1, 9000)),
    ("rl_acquire", ("job", 0, 30), ("error", "rl_acquire: max_in_flight must be an integer from 1 to 1000, got 0")),
    ("rl_acquire", ("job", 1001, 30), ("error", "rl_acquire: max_in_flight must be an integer from 1 to 1000, got 1001")),
    ("rl_acquire", ("job", 2.5, 30), ("error", "rl_acquire: max_in_flight must be an integer from 1 to 1000, got 2.5"), "sqlite"),
    ("rl_acquire", ("job", 2, 0), ("error", "rl_acquire: lease_seconds must be a finite number greater than 0, got 0")),
    ("rl_acquire", ("", 2, 1), ("error", "rl_acquire: key must not be empty")),
    ("rl_release", ("job", None), ("error", "rl_release: lease must be text, got NULL")),
    ("rl_renew", ("job", "x", -1), ("error", "rl_renew: lease_seconds must be a finite number greater than 0, got -1")),
    ("rl_in_flight", (None,), ("error", "rl_in_flight: key must be text, got NULL")),
    # one key, four kinds of state that never meet
    ("rl_window", ("job", 1, 10, 1, 0), window(True, 0, 1, 0, 10, 10)),
    ("rl_take", ("job", 1, 60, 1, 0), take(True, 0, 1, 0, 1)),
    ("rl_reset", ("job",), 3),
    ("rl_in_flight", ("job", 100_000), 0),
    # charging after the fact: into debt, repaid by refill to the millisecond
    ("rl_charge", ("ch", 10, 60, 25, 0), take(True, -15, 10, 0, 25)),
    ("rl_take", ("ch", 10, 60, 1, 0), take(False, -15, 10, 16_000, 25)),
    ("rl_take", ("ch", 10, 60, 1, 15_999), take(False, 0, 10, 1, 10)),
    ("rl_take", ("ch", 10, 60, 1, 16_000), take(True, 0, 10, 0, 10)),
    ("rl_charge", ("ch", 10, 60, 0), ("error", "rl_charge: amount must be a finite number greater than 0, got 0")),
    ("rl_spend", ("chb", "day", 10, 4, 0), spend(True, 4, 10, ms(1970, 1, 2), 0)),
    ("rl_charge_budget", ("chb", "day", 8, 0), {"admitted": True, "used": 12, "resets_at": 86400}),
    ("rl_spend", ("chb", "day", 10, 0.5, 0), spend(False, 12, 10, ms(1970, 1, 2), 86400)),
    ("rl_refund_budget", ("chb", "day", 3, 0), {"used": 9, "resets_at": 86400}),
    ("rl_spend", ("chb", "day", 10, 1, 0), spend(True, 10, 10, ms(1970, 1, 2), 0)),
    ("rl_charge_budget", ("chb", "fortnight", 1), ("error", "rl_charge_budget: period must be 'hour', 'day', 'week', 'month' or 'year', got 'fortnight'")),
    # a quota changed mid-period keeps the count: lowered, it refuses; raised, it admits again
    ("rl_spend", ("qc", "month", 10, 8, 0), spend(True, 8, 10, ms(1970, 2, 1), 0)),
    ("rl_spend", ("qc", "month", 5, 1, 1000), spend(False, 8, 5, ms(1970, 2, 1), 2_678_399)),
    ("rl_budget", ("qc", "month", 5, 0, 1000), spend(False, 8, 5, ms(1970, 2, 1), 2_678_399)),
    ("rl_budgets_near", (1.5, 10, 1000), {"fraction": 1.5, "budgets": [
        {"key": "qc", "period": "month", "used": 8, "quota": 5, "resets_at": 2_678_400}]}),  # the new share at once
    ("rl_spend", ("qc", "month", 20, 1, 2000), spend(True, 9, 20, ms(1970, 2, 1), 0)),
    # the ended periods of a budget are kept for invoicing: rl_usage by end, exact decimals
    ("rl_spend", ("inv", "day", 10, 2.5, 1000), spend(True, 2.5, 10, ms(1970, 1, 2), 0)),
    ("rl_spend", ("inv", "day", 10, 0.000001, 2000), spend(True, 2.500001, 10, ms(1970, 1, 2), 0)),
    ("rl_usage", ("inv", 0, 86_400_000), {"key": "inv", "from_ms": 0, "to_ms": 86_400_000, "periods": []}),
    ("rl_spend", ("inv", "day", 12, 1, 86_400_005), spend(True, 1, 12, ms(1970, 1, 3), 0)),
    ("rl_take_all", ('[{"key":"inv","period":"day","quota":12,"cost":4}]', 172_800_000),
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0, "items": [spend(True, 4, 12, ms(1970, 1, 4), 0)]}),
    ("rl_usage", ("inv", 0, 172_800_000),
     {"key": "inv", "from_ms": 0, "to_ms": 172_800_000, "periods": [
         {"period": "day", "starts_at": 0, "ends_at": 86_400, "used": 2.500001, "quota": 10},
         {"period": "day", "starts_at": 86_400, "ends_at": 172_800, "used": 1, "quota": 12}]}),
    ("rl_usage", ("inv", 86_400_000, 172_799_999), {"key": "inv", "from_ms": 86_400_000, "to_ms": 172_799_999, "periods": []}),
    ("rl_usage", ("nobody", 0, MAX_NOW), {"key": "nobody", "from_ms": 0, "to_ms": int(MAX_NOW), "periods": []}),
    ("rl_usage", ("inv", 5, 4), ("error", "rl_usage: to_ms must not be before from_ms, got from_ms 5 and to_ms 4")),
    ("rl_usage", ("inv", None, 4),
     ("error", "rl_usage: from_ms must be an integer number of epoch milliseconds from 0 to 253402300799999, got NULL")),
    ("rl_usage", ("inv", 0, 1.5),
     ("error", "rl_usage: to_ms must be an integer number of epoch milliseconds from 0 to 253402300799999, got 1.5")),
    ("rl_usage", ("", 0, 4), ("error", "rl_usage: key must not be empty")),
    # every key's kept periods, a page at a time, by end, key and period: next is where a page stopped
    ("rl_usage_all", (0, 172_800_000, None, 1), {"from_ms": 0, "to_ms": 172_800_000, "periods": [
        {"key": "inv", "period": "day", "starts_at": 0, "ends_at": 86_400, "used": 2.500001, "quota": 10}],
        "next": [86_400_000, "inv", "day"]}),
    ("rl_usage_all", (0, 172_800_000, '[86400000, "inv", "day"]', 1), {"from_ms": 0, "to_ms": 172_800_000, "periods": [
        {"key": "inv", "period": "day", "starts_at": 86_400, "ends_at": 172_800, "used": 1, "quota": 12}], "next": None}),
    ("rl_usage_all", (0, 172_800_000, '[172800000, "inv", "day"]', 10_000),
     {"from_ms": 0, "to_ms": 172_800_000, "periods": [], "next": None}),
    ("rl_usage_all", (ms(2026, 1, 1), ms(2027, 6, 1), None, 2), {"from_ms": ms(2026, 1, 1), "to_ms": ms(2027, 6, 1), "periods": [
        {"key": "a", "period": "day", "starts_at": ms(2026, 11, 29) // 1000, "ends_at": ms(2026, 11, 30) // 1000, "used": 2, "quota": 2},
        {"key": "ph", "period": "hour", "starts_at": ms(2026, 12, 6) // 1000, "ends_at": ms(2026, 12, 6, 1) // 1000, "used": 1, "quota": 2}],
        "next": [ms(2026, 12, 6, 1), "ph", "hour"]}),
    ("rl_usage_all", (ms(2026, 1, 1), ms(2027, 6, 1), f'[{ms(2026, 12, 6, 1)}, "ph", "hour"]'),
     {"from_ms": ms(2026, 1, 1), "to_ms": ms(2027, 6, 1), "periods": [
        {"key": "edge", "period": "day", "starts_at": ms(2026, 12, 31) // 1000, "ends_at": ms(2027, 1, 1) // 1000, "used": 1, "quota": 1}],
        "next": None}),
    ("rl_usage_all", (5, 4), ("error", "rl_usage_all: to_ms must not be before from_ms, got from_ms 5 and to_ms 4")),
    ("rl_usage_all", (0, 4, "null"),
     ("error", "rl_usage_all: after must be the next of an earlier answer, an array [ends_at_ms, key, period], got null")),
    ("rl_usage_all", (0, 4, '"inv"'),
     ("error", "rl_usage_all: after must be the next of an earlier answer, an array [ends_at_ms, key, period], got a string")),
    ("rl_usage_all", (0, 4, '[1, "inv"]'),
     ("error", "rl_usage_all: after must be the next of an earlier answer, an array [ends_at_ms, key, period], got an array of 2 values")),
    ("rl_usage_all", (0, 4, '[1.5, "inv", "day"]'), ("error", "rl_usage_all: after must be [ends_at_ms, key, period] as an "
                                                              "earlier answer's next: an integer from 0 to 253402300799999 and two strings")),
    ("rl_usage_all", (0, 4, '[1, "inv", 2]'), ("error", "rl_usage_all: after must be [ends_at_ms, key, period] as an "
                                                        "earlier answer's next: an integer from 0 to 253402300799999 and two strings")),
    ("rl_usage_all", (0, 4, None, 0), ("error", "rl_usage_all: n must be an integer from 1 to 10000, got 0")),
    ("rl_usage_all", (0, 4, None, 10_001), ("error", "rl_usage_all: n must be an integer from 1 to 10000, got 10001")),
    # periods anchored to a billing date and in a customer's time zone (docs/guides/billing-periods.md):
    # a month from the 31st at 09:00 runs to the 28th of February at 09:00, then to the 31st of March
    ("rl_spend", ("bill", "month from 31 09:00", 10, 4, ms(2027, 2, 10)),
     zspend(True, 4, 10, ms(2027, 1, 31, 9), ms(2027, 2, 28, 9), 0)),
    ("rl_spend", ("bill", "month from 31 09:00", 10, 7, ms(2027, 2, 28, 8, 59, 59)),
     zspend(False, 4, 10, ms(2027, 1, 31, 9), ms(2027, 2, 28, 9), 1)),
    ("rl_spend", ("bill", "month  from 31 09:00 in UTC", 10, 7, ms(2027, 2, 28, 9)),
     zspend(True, 7, 10, ms(2027, 2, 28, 9), ms(2027, 3, 31, 9), 0)),
    ("rl_usage", ("bill", 0, ms(2027, 3, 1)),
     {"key": "bill", "from_ms": 0, "to_ms": ms(2027, 3, 1), "periods": [
         {"period": "month from 31 09:00", "starts_at": ms(2027, 1, 31, 9) // 1000, "ends_at": ms(2027, 2, 28, 9) // 1000,
          "used": 4, "quota": 10}]}),
    # a local day of 23 hours (New York springs forward on 2026-03-08) and of 25 (2026-11-01)
    ("rl_spend", ("ny", "day in america/new_york", 5, 1, ms(2026, 3, 8, 12)),
     zspend(True, 1, 5, ms(2026, 3, 8, 5), ms(2026, 3, 9, 4), 0)),
    ("rl_budget", ("ny", "day in America/New_York", 5, 0, ms(2026, 3, 8, 12)),
     zspend(True, 1, 5, ms(2026, 3, 8, 5), ms(2026, 3, 9, 4), 0)),
    ("rl_spend", ("ny", "day in America/New_York", 5, 1, ms(2026, 11, 1, 12)),
     zspend(True, 1, 5, ms(2026, 11, 1, 4), ms(2026, 11, 2, 5), 0)),
    # a current row asked with its period's canonical text (the SQL edition's hot path, its
    # bounds kept by the session): a 25-hour day, then another period between, then the
    # next day (bounds worked out again)
    ("rl_spend", ("ny2", "day in America/New_York", 5, 1, ms(2026, 11, 1, 12)),
     zspend(True, 1, 5, ms(2026, 11, 1, 4), ms(2026, 11, 2, 5), 0)),
    ("rl_spend", ("ny2", "day in America/New_York", 5, 2, ms(2026, 11, 1, 13)),
     zspend(True, 3, 5, ms(2026, 11, 1, 4), ms(2026, 11, 2, 5), 0)),
    ("rl_spend", ("ny3", "day from 02:30 in America/New_York", 5, 1, ms(2026, 11, 1, 13)),
     zspend(True, 1, 5, ms(2026, 11, 1, 7, 30), ms(2026, 11, 2, 7, 30), 0)),
    ("rl_spend", ("ny2", "day in America/New_York", 5, 3, ms(2026, 11, 1, 14)),
     zspend(False, 3, 5, ms(2026, 11, 1, 4), ms(2026, 11, 2, 5), 15 * 3600)),
    ("rl_spend", ("ny2", "day in America/New_York", 5, 2, ms(2026, 11, 2, 4, 59, 59)),
     zspend(True, 5, 5, ms(2026, 11, 1, 4), ms(2026, 11, 2, 5), 0)),
    ("rl_spend", ("ny2", "day in America/New_York", 5, 1, ms(2026, 11, 2, 5)),
     zspend(True, 1, 5, ms(2026, 11, 2, 5), ms(2026, 11, 3, 5), 0)),
    # an anchor at 02:30 on the night that skips it starts at 03:30 EDT; 01:30 twice is the later
    ("rl_spend", ("ny", "day from 02:30 in America/New_York", 5, 1, ms(2026, 3, 8, 7)),
     zspend(True, 1, 5, ms(2026, 3, 7, 7, 30), ms(2026, 3, 8, 7, 30), 0)),
    ("rl_spend", ("ny", "day from 02:30 in America/New_York", 5, 1, ms(2026, 3, 8, 7, 30)),
     zspend(True, 1, 5, ms(2026, 3, 8, 7, 30), ms(2026, 3, 9, 6, 30), 0)),
    ("rl_spend", ("ny", "day from 01:30 in America/New_York", 5, 1, ms(2026, 11, 1, 6)),
     zspend(True, 1, 5, ms(2026, 10, 31, 5, 30), ms(2026, 11, 1, 6, 30), 0)),
    # a week from Wednesday noon that contains Paris's change; Samoa's skipped 2011-12-30; a leap-day year
    ("rl_spend", ("wk", "week from wed 12:00 in Europe/Paris", 5, 1, ms(2026, 3, 27)),
     zspend(True, 1, 5, ms(2026, 3, 25, 11), ms(2026, 4, 1, 10), 0)),
    ("rl_spend", ("ws", "day in Pacific/Apia", 5, 1, ms(2011, 12, 30, 12)),
     zspend(True, 1, 5, ms(2011, 12, 30, 10), ms(2011, 12, 31, 10), 0)),
    ("rl_spend", ("ly", "year from 02-29", 1, 1, ms(2027, 6, 1)), zspend(True, 1, 1, ms(2027, 2, 28), ms(2028, 2, 29), 0)),
    ("rl_refund_budget", ("ly", "year from 02-29 00:00", 1, ms(2027, 6, 2)), {"used": 0, "resets_at": ms(2028, 2, 29) // 1000}),
    ("rl_charge_budget", ("ly", "year from 02-29", 2, ms(2027, 6, 3)), {"admitted": True, "used": 2, "resets_at": ms(2028, 2, 29) // 1000}),
    ("rl_take_all", ('[{"key":"ta","period":"month from 15 in Asia/Tokyo","quota":3,"cost":1}]', ms(2026, 12, 6)),
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0,
      "items": [zspend(True, 1, 3, ms(2026, 11, 14, 15), ms(2026, 12, 14, 15), 0)]}),
    ("rl_spend", ("e", "month from 32", 1, 1), ("error", "rl_spend: period: the anchor of a month must be a day of the month (1 to 31), then optionally 'HH:MM', got '32'")),
    ("rl_budget", ("e", "day from 24:00", 1), ("error", "rl_budget: period: the anchor of a day must be 'HH:MM', a time of day (00:00 to 23:59), got '24:00'")),
    ("rl_spend", ("e", "year from 02-30 in Europe/Paris", 1, 1), ("error", "rl_spend: period: the anchor of a year must be a date 'MM-DD' (01-01 to 12-31), then optionally 'HH:MM', got '02-30'")),
    ("rl_charge_budget", ("e", "week from wednesday", 1), ("error", "rl_charge_budget: period: the anchor of a week must be a weekday (mon to sun), then optionally 'HH:MM', got 'wednesday'")),
    ("rl_refund_budget", ("e", "hour from 30", 1), ("error", "rl_refund_budget: period: the anchor of an hour must be ':MM', a minute past the hour (:00 to :59), got '30'")),
    ("rl_spend", ("e", "day in Mars/Olympus_Mons", 1, 1), ("error", "rl_spend: period: unknown time zone 'Mars/Olympus_Mons' (an IANA name such as 'Europe/Paris' or 'America/New_York')")),
    ("rl_spend", ("e", "month in", 1, 1), ("error", "rl_spend: period must be a unit, then optionally 'from' and an anchor, then optionally 'in' and a time zone (such as 'month from 15 09:00 in Europe/Paris'), got 'month in'")),
    ("rl_spend", ("e", "month in Europe/Paris from 3", 1, 1), ("error", "rl_spend: period must be a unit, then optionally 'from' and an anchor, then optionally 'in' and a time zone (such as 'month from 15 09:00 in Europe/Paris'), got 'month in Europe/Paris from 3'")),
    ("rl_take_all", ('[{"key":"e","period":"month in Nowhere","quota":1}]',), ("error", "rl_take_all: item 1: period: unknown time zone 'Nowhere' (an IANA name such as 'Europe/Paris' or 'America/New_York')")),
    # rl_take_all takes window items; all or nothing across kinds
    ("rl_take_all", ('[{"key":"tw","limit":2,"window_seconds":60},{"key":"tw","burst":5,"refill_per_minute":60}]', 0),
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0,
      "items": [window(True, 1, 2, 0, 60, 60), take(True, 4, 5, 0, 1)]}),
    ("rl_take_all", ('[{"key":"tw","limit":2,"window_seconds":60},{"key":"tw","burst":5,"refill_per_minute":60}]', 0),
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0,
      "items": [window(True, 0, 2, 0, 60, 60), take(True, 3, 5, 0, 2)]}),
    ("rl_take_all", ('[{"key":"tw","limit":2,"window_seconds":60},{"key":"tw","burst":5,"refill_per_minute":60}]', 0),
     {"admitted": False, "retry_after_ms": 60_000, "retry_after_seconds": 60,
      "items": [window(False, 0, 2, 60_000, 60, 60), take(True, 3, 5, 0, 2)]}),  # the bucket: as it is now
    ("rl_take", ("tw", 5, 60, 1, 0), take(True, 2, 5, 0, 3)),  # the refused call charged nothing
    # rl_refund_all: the inverse of rl_take_all over the same items, each kind as its own
    # refund (a bucket never above its burst, a budget never below 0, a window forgets its
    # newest admissions), answered in the order given; twice gives back no more than once
    ("rl_take_all", ('[{"key":"ra","period":"day","quota":10,"cost":3},{"key":"ra","limit":2,"window_seconds":60},'
                     '{"key":"ra","burst":5,"refill_per_minute":60,"cost":2}]', 0),
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0,
      "items": [spend(True, 3, 10, ms(1970, 1, 2), 0), window(True, 1, 2, 0, 60, 60), take(True, 3, 5, 0, 2)]}),
    *[("rl_refund_all", ('[{"key":"ra","period":"day","quota":10,"cost":3},{"key":"ra","limit":2,"window_seconds":60},'
                         '{"key":"ra","burst":5,"refill_per_minute":60,"cost":2}]', 0),
       {"items": [{"used": 0, "resets_at": 86400},
                  {**window(True, 2, 2, 0, 0, 60), "exceeds_limit": False},
                  {"remaining": 5, "limit": 5, "reset_after_seconds": 0}]})] * 2,
    ("rl_take_all", ('[{"key":"ra","limit":2,"window_seconds":60},{"key":"ra","limit":2,"window_seconds":60,"cost":2}]', 0),
     ("error", "rl_take_all: items 1 and 2 are the same limit (one key may appear once per kind and period)")),
    ("rl_refund_all", ('[{"key":"ra","limit":2,"window_seconds":60},{"key":"ra","limit":2,"window_seconds":60}]', 0),
     ("error", "rl_refund_all: items 1 and 2 are the same limit (one key may appear once per kind and period)")),
    ("rl_refund_all", ('[]', 0), ("error", "rl_refund_all: limits must hold 1 to 64 items, got 0")),
    ("rl_refund_all", ('{"key":"ra"}', 0), ("error", "rl_refund_all: limits must be a JSON array of limit objects")),
    ("rl_refund_all", ('[{"key":"ra","burst":0,"refill_per_minute":1}]', 0),
     ("error", "rl_refund_all: item 1: burst must be a finite number greater than 0, got 0")),
    # rl_charge_all: a cost known after the work, charged whatever each limit holds, in one
    # unit: a bucket into debt, a budget past its quota, a window past its limit; later takes
    # wait until the debt is paid back
    ("rl_charge_all", ('[{"key":"ca","burst":2,"refill_per_minute":60,"cost":3},{"key":"ca","period":"day","quota":10,"cost":12},'
                       '{"key":"ca","limit":2,"window_seconds":60,"cost":3}]', 0),
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0,
      "items": [{**take(True, -1, 2, 0, 3), "exceeds_limit": False, "refill_seconds": 2},
                {**spend(True, 12, 10, ms(1970, 1, 2), 0), "exceeds_limit": False, "period_seconds": 86400},
                {**window(True, -1, 2, 0, 60, 60), "exceeds_limit": False}]}),
    ("rl_take_all", ('[{"key":"ca","burst":2,"refill_per_minute":60}]', 1000),
     {"admitted": False, "retry_after_ms": 1000, "retry_after_seconds": 1, "items": [take(False, 0, 2, 1000, 2)]}),
    ("rl_take_all", ('[{"key":"ca","burst":2,"refill_per_minute":60}]', 2000),
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0, "items": [take(True, 0, 2, 0, 2)]}),
    ("rl_take_all", ('[{"key":"ca","limit":2,"window_seconds":60}]', 2000),
     {"admitted": False, "retry_after_ms": 58_000, "retry_after_seconds": 58, "items": [window(False, 0, 2, 58_000, 58, 60)]}),
    ("rl_spend", ("ca", "day", 10, 1, 2000), spend(False, 12, 10, ms(1970, 1, 2), 86398)),
    ("rl_charge_all", ('[{"key":"cb","burst":2,"refill_per_minute":60,"cost":1e300}]', 0),
     ("error", "rl_charge_all: item 1: cost must be at most 1000000000000000, got 1e300")),
    ("rl_charge_all", ('[]', 0), ("error", "rl_charge_all: limits must hold 1 to 64 items, got 0")),
    ("rl_take_all", ('[{"key":"cb","burst":2,"refill_per_minute":60}]', 0),  # the refused charge wrote nothing
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0, "items": [take(True, 1, 2, 0, 1)]}),
    # fixed windows: at most limit per window [k * T, (k + 1) * T) of epoch time, every wait
    # the time to the window's end; counted apart from a sliding window on the same key
    ("rl_take_all", ('[{"key":"fw","limit":2,"fixed_window_seconds":60}]', 59_000),
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0, "items": [window(True, 1, 2, 0, 1, 60)]}),
    ("rl_take_all", ('[{"key":"fw","limit":2,"fixed_window_seconds":60}]', 59_500),
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0, "items": [window(True, 0, 2, 0, 1, 60)]}),
    ("rl_take_all", ('[{"key":"fw","limit":2,"fixed_window_seconds":60}]', 59_999),
     {"admitted": False, "retry_after_ms": 1, "retry_after_seconds": 1, "items": [window(False, 0, 2, 1, 1, 60)]}),
    ("rl_take_all", ('[{"key":"fw","limit":2,"fixed_window_seconds":60},{"key":"fw","limit":2,"window_seconds":60}]', 60_000),
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0,
      "items": [window(True, 1, 2, 0, 60, 60), window(True, 1, 2, 0, 60, 60)]}),
    ("rl_refund_all", ('[{"key":"fw","limit":2,"fixed_window_seconds":60}]', 60_000),
     {"items": [{**window(True, 2, 2, 0, 0, 60), "exceeds_limit": False}]}),
    ("rl_charge_all", ('[{"key":"fw","limit":2,"fixed_window_seconds":60,"cost":3}]', 61_000),
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0,
      "items": [{**window(True, -1, 2, 0, 59, 60), "exceeds_limit": False}]}),
    ("rl_take_all", ('[{"key":"fw","limit":2,"fixed_window_seconds":60}]', 119_999),
     {"admitted": False, "retry_after_ms": 1, "retry_after_seconds": 1, "items": [window(False, 0, 2, 1, 1, 60)]}),
    ("rl_take_all", ('[{"key":"fw","limit":2,"fixed_window_seconds":60,"multiplier":2}]', 119_999),
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0, "items": [window(True, 0, 4, 0, 1, 60)]}),
    ("rl_take_all", ('[{"key":"fw","limit":2,"fixed_window_seconds":60}]', 120_000),
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0, "items": [window(True, 1, 2, 0, 60, 60)]}),
    ("rl_window_peek", ("fw", 2, 60, 1, 119_000), window(True, 0, 2, 0, 60, 60)),  # the sliding window's own one
    # rl_fixed_window: the same rows as the fixed window items, on its own
    ("rl_fixed_window", ("fw", 2, 60, 1, 121_000), window(True, 0, 2, 0, 59, 60)),
    ("rl_fixed_window", ("fw", 2, 60, 1, 179_999), window(False, 0, 2, 1, 1, 60)),
    ("rl_fixed_window_peek", ("fw", 2, 60, 0, 179_999), window(True, 0, 2, 0, 1, 60)),
    ("rl_fixed_window_peek", ("fw", 2, 60, 2, 180_000), window(True, 0, 2, 0, 60, 60)),
    ("rl_fixed_window", ("fw", 2, 60, 3, 180_000), {**window(False, 2, 2, 1, 0, 60), "exceeds_limit": True}),
    ("rl_fixed_window", ("fw2", 1.5, 0.25, 1, 1_000_100), window(True, 0, 1.5, 0, 1, 0.25)),
    ("rl_fixed_window", ("fw2", 1.5, 0.25, 1, 1_000_249), window(False, 0, 1.5, 1, 1, 0.25)),
    ("rl_fixed_window", ("fw2", 1.5, 0.25, 0.5, 1_000_249), window(True, 0, 1.5, 0, 1, 0.25)),
    ("rl_fixed_window", ("x", 1, 0, 1, 0), ("error", "rl_fixed_window: window_seconds must be a finite number greater than 0, got 0")),
    ("rl_fixed_window_peek", ("x", 1, None), ("error", "rl_fixed_window_peek: window_seconds must be a finite number greater than 0, got NULL")),
    ("rl_fixed_window", ("x", 1, 60, 0), ("error", "rl_fixed_window: cost must be a finite number greater than 0, got 0")),
    ("rl_take_all", ('[{"key":"x","limit":1,"fixed_window_seconds":0}]', 0),
     ("error", "rl_take_all: item 1: fixed_window_seconds must be a finite number greater than 0, got 0")),
    ("rl_take_all", ('[{"key":"x","limit":1,"fixed_window_seconds":1,"window_seconds":1}]', 0),
     ("error", 'rl_take_all: item 1: unknown field "window_seconds" (a bucket has key, burst, refill_per_minute, cost, multiplier; a budget key, period, quota, cost, multiplier; a window key, limit, window_seconds, cost, multiplier; a fixed window key, limit, fixed_window_seconds, cost, multiplier)')),
    ("rl_take_all", ('[{"key":"x","limit":1,"fixed_window_seconds":1},{"key":"x","limit":2,"fixed_window_seconds":2}]', 0),
     ("error", "rl_take_all: items 1 and 2 are the same limit (one key may appear once per kind and period)")),
    ("rl_take_all", ('[{"key":"x","limit":1,"window_seconds":0}]', 0),
     ("error", "rl_take_all: item 1: window_seconds must be a finite number greater than 0, got 0")),
    ("rl_take_all", ('[{"key":"x","limit":1,"window_seconds":1},{"key":"x","limit":2,"window_seconds":1}]', 0),
     ("error", "rl_take_all: items 1 and 2 are the same limit (one key may appear once per kind and period)")),
    ("rl_take_all", ('[{"key":"x","limit":1,"window_seconds":1,"burst":1}]', 0),
     ("error", 'rl_take_all: item 1: unknown field "burst" (a bucket has key, burst, refill_per_minute, cost, multiplier; a budget key, period, quota, cost, multiplier; a window key, limit, window_seconds, cost, multiplier; a fixed window key, limit, fixed_window_seconds, cost, multiplier)')),
    # an item's multiplier scales its limit as a policy's tier does (so a caller passes
    # limits through whatever their kind): the same answers as the scaled limits
    ("rl_take_all", ('[{"key":"mu","burst":2,"refill_per_minute":60,"multiplier":2.5},'
                     '{"key":"mu","period":"day","quota":2,"multiplier":2.5},'
                     '{"key":"mu","limit":1,"window_seconds":60,"multiplier":2.5}]', 0),
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0,
      "items": [take(True, 4, 5, 0, 1), spend(True, 1, 5, ms(1970, 1, 2), 0), window(True, 1, 2.5, 0, 60, 60)]}),
    ("rl_refund_all", ('[{"key":"mu","burst":2,"refill_per_minute":60,"multiplier":2.5}]', 0),
     {"items": [{"remaining": 5, "limit": 5, "reset_after_seconds": 0}]}),
    ("rl_check_limits", ("mu", "ann", '[{"key":"mu","period":"day","quota":2,"multiplier":0.5,"cost":2}]', 0),
     {"admitted": False, "retry_after_ms": 86_400_000, "retry_after_seconds": 86_400,
      "items": [spend(False, 1, 1, ms(1970, 1, 2), 86_400)]}),
    ("rl_take_all", ('[{"key":"mu","burst":2,"refill_per_minute":60,"multiplier":0}]', 0),
     ("error", "rl_take_all: item 1: multiplier must be a finite number greater than 0, got 0")),
    ("rl_charge_all", ('[{"key":"mu","limit":1,"window_seconds":60,"multiplier":null}]', 0),
     ("error", "rl_charge_all: item 1: multiplier must be a finite number greater than 0, got NULL")),
    ("rl_take_all", ('[{"key":"mu","period":"month","quota":1,"multiplier":1e-7}]', 0),
     ("error", "rl_take_all: item 1: multiplier takes this limit out of range (a bucket's burst and refill "
               "must stay above 0 and at most 1000000000000000, a quota or window limit from 0.000001 to 1000000000)")),
    # headers for windows and leases (the draft's concurrent-requests quota unit)
    ("rl_headers", ('{"admitted":false,"remaining":0,"limit":3,"retry_after_ms":1,"retry_after_seconds":1,"reset_after_seconds":7,"window_seconds":10}',),
     {"RateLimit-Policy": '"window";q=3;w=10', "RateLimit": '"window";r=0;t=7', "X-RateLimit-Limit": "3",
      "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "7", "Retry-After": "1"}),
    ("rl_headers", ('{"admitted":false,"lease":null,"in_flight":2,"limit":2,"expires_at":null,"retry_after_ms":28000,"retry_after_seconds":28}',),
     {"RateLimit-Policy": '"concurrency";q=2;qu="concurrent-requests"', "RateLimit": '"concurrency";r=0;t=28',
      "X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "0", "Retry-After": "28"}),
    ("rl_headers", ('{"admitted":true,"lease":"0-1","in_flight":1,"limit":2,"expires_at":30000,"retry_after_ms":0,"retry_after_seconds":0}',),
     {"RateLimit-Policy": '"concurrency";q=2;qu="concurrent-requests"', "RateLimit": '"concurrency";r=1',
      "X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "1"}),
    # a bucket in debt shows no negative remaining in headers
    ("rl_headers", ('{"admitted":false,"remaining":-15,"limit":10,"retry_after_ms":16000,"retry_after_seconds":16,"reset_after_seconds":25}',),
     {"RateLimit-Policy": '"bucket";q=10', "RateLimit": '"bucket";r=0;t=25', "X-RateLimit-Limit": "10",
      "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "25", "Retry-After": "16"}),
    # what answers report: a cost above the limit is marked, and rl_headers gives it no Retry-After
    ("rl_spend", ("big", "day", 2, 3, NOV_29),
     {**spend(False, 0, 2, ms(2026, 11, 30), 43200), "exceeds_limit": True, "period_seconds": 86400}),
    ("rl_window", ("bigw", 2, 10, 3, 0), {**window(False, 2, 2, 1, 0, 10), "exceeds_limit": True}),
    ("rl_budget", ("leap", "month", 1, 1, ms(2028, 2, 10)),
     {**spend(False, 1, 1, ms(2028, 3, 1), 1_728_000), "exceeds_limit": False, "period_seconds": 29 * 86400}),
    ("rl_headers", (json.dumps({**take(False, 3, 3, 3000, 0), "exceeds_limit": True, "refill_seconds": 3}),),
     {"RateLimit-Policy": '"bucket";q=3;w=3', "RateLimit": '"bucket";r=3;t=0', "X-RateLimit-Limit": "3",
      "X-RateLimit-Remaining": "3", "X-RateLimit-Reset": "0"}),
    ("rl_headers", (json.dumps({**take(False, 0, 10, 16_000, 25), "exceeds_limit": False, "refill_seconds": 8.5}),),
     {"RateLimit-Policy": '"bucket";q=10;w=9', "RateLimit": '"bucket";r=0;t=25', "X-RateLimit-Limit": "10",
      "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "25", "Retry-After": "16"}),
    # peeks with cost 0 report what is left, as it is
    ("rl_take", ("p0", 3, 60, 2, 0), take(True, 1, 3, 0, 2)),
    ("rl_peek", ("p0", 3, 60, 0, 0), take(True, 1, 3, 0, 2)),
    ("rl_peek", ("p0", 3, 60, 0, 1500), take(True, 2, 3, 0, 1)),
    ("rl_budget", ("chb", "day", 10, 0, 0), spend(True, 10, 10, ms(1970, 1, 2), 0)),
    ("rl_window_peek", ("tw", 2, 60, 0, 0), window(True, 0, 2, 0, 60, 60)),
    ("rl_peek", ("p0", 3, 60, -1), ("error", "rl_peek: cost must be a finite number of at least 0, got -1")),
    ("rl_budget", ("p0", "day", 3, None), ("error", "rl_budget: cost must be a finite number of at least 0, got NULL")),
    ("rl_take", ("p0", 3, 60, 0), ("error", "rl_take: cost must be a finite number greater than 0, got 0")),
    # a refused call charges nothing, and every item says so: the budget reports 5 used, not 6
    *[("rl_spend", ("rr", "day", 1000, 1, 0), spend(True, i, 1000, ms(1970, 1, 2), 0)) for i in range(1, 6)],
    ("rl_take", ("rr", 1, 1, 1, 0), take(True, 0, 1, 0, 60)),
    ("rl_take_all", ('[{"key":"rr","burst":1,"refill_per_minute":1},{"key":"rr","period":"day","quota":1000}]', 0),
     {"admitted": False, "retry_after_ms": 60_000, "retry_after_seconds": 60,
      "items": [take(False, 0, 1, 60_000, 60), spend(True, 5, 1000, ms(1970, 1, 2), 0)]}),
    ("rl_take_all", ('[{"key":"rr","burst":1,"refill_per_minute":1,"cost":2},{"key":"rr","period":"day","quota":1000}]', 0),
     {"admitted": False, "retry_after_ms": 60_000, "retry_after_seconds": 60,
      "items": [{**take(False, 0, 1, 60_000, 60), "exceeds_limit": True, "refill_seconds": 60},
                spend(True, 5, 1000, ms(1970, 1, 2), 0)]}),
    # policies: limits as rows, applied per subject, scaled per tier
    ("rl_policy_set", ("login", json.dumps({k: v for k, v in LOGIN.items() if k != "shadow"})), LOGIN),
    *[("rl_check", ("login", "ann", 1, None, 0),
       checked([bucket_item(True, 5 - i, 5, 0, 12 * i, 60), day_budget_item(True, i, 100)], "login")) for i in range(1, 6)],
    # refused: nothing is charged, and the budget says so (5 used, not 6)
    ("rl_check", ("login", "ann", 1, None, 0),
     checked([bucket_item(False, 0, 5, 12_000, 60, 60), day_budget_item(True, 5, 100)], "login", retry_ms=12_000,
             would_refuse=True)),
    ("rl_check", ("login", "bea", 1, "pro", 0),
     checked([bucket_item(True, 24, 25, 0, 3, 60), day_budget_item(True, 1, 500)], "login", tier="pro")),
    # a check whose work failed is given back, at the tier's scale (never above the burst,
    # never below 0): twice gives back no more than once
    *[("rl_refund_check", ("login", "bea", 1, "pro", 0),
       {"policy": "login", "tier": "pro",
        "items": [{"remaining": 25, "limit": 25, "reset_after_seconds": 0}, {"used": 0, "resets_at": 86400}]})] * 2,
    # rl_peek_check: rl_check's answer, charging nothing (cost 0 reads what is left);
    # rl_charge_check: the cost of work done, charged at the tier's scale whatever is left
    ("rl_peek_check", ("login", "ann", 0, None, 0),
     checked([bucket_item(True, 0, 5, 0, 60, 60), day_budget_item(True, 5, 100)], "login")),
    ("rl_peek_check", ("login", "ann", 1, None, 0),
     checked([bucket_item(False, 0, 5, 12_000, 60, 60), day_budget_item(True, 5, 100)], "login", retry_ms=12_000,
             would_refuse=True)),
    ("rl_charge_check", ("login", "ann", 3, None, 0),
     {"admitted": True, "retry_after_ms": 0, "retry_after_seconds": 0, "policy": "login", "tier": None,
      "items": [{**take(True, -3, 5, 0, 96), "exceeds_limit": False, "refill_seconds": 60},
                {**spend(True, 8, 100, ms(1970, 1, 2), 0), "exceeds_limit": False, "period_seconds": 86400}]}),
    ("rl_check", ("login", "ann", 1, None, 47_999),
     checked([bucket_item(False, 0, 5, 1, 49, 60), day_budget_item(True, 8, 100)], "login", retry_ms=1,
             would_refuse=True)),
    ("rl_charge_check", ("login", "ann", 0, None, 0), ("error", "rl_charge_check: amount must be a finite number greater than 0, got 0")),
    ("rl_charge_check", ("nope", "ann", 1), ("error", "rl_charge_check: there is no policy named 'nope'", "42704")),
    ("rl_peek_check", ("login", "ann", -1), ("error", "rl_peek_check: cost must be a finite number of at least 0, got -1")),
    ("rl_refund_check", ("login", "bea", 1, "gold", 0),
     ("error", "rl_refund_check: tier 'gold' is not one of this policy's tiers (pro)")),
    ("rl_refund_check", ("nope", "bea"), ("error", "rl_refund_check: there is no policy named 'nope'", "42704")),
    ("rl_check", ("login", "ann", 1, "gold", 0), ("error", "rl_check: tier 'gold' is not one of this policy's tiers (pro)")),
    ("rl_check", ("nope", "ann"), ("error", "rl_check: there is no policy named 'nope'", "42704")),
    ("rl_check", ("login", None), ("error", "rl_check: subject must be text, got NULL")),
    ("rl_check", ("login", "ann", 0), ("error", "rl_check: cost must be a finite number greater than 0, got 0")),
    # two policies never share state, and neither meets a raw key
    ("rl_policy_set", ("generate", '{"limits": [{"burst": 5, "refill_per_minute": 5}]}'),
     {"limits": [{"burst": 5, "refill_per_minute": 5}], "tiers": {}, "shadow": False}),
    ("rl_check", ("generate", "ann", 1, None, 0), checked([bucket_item(True, 4, 5, 0, 12, 60)], "generate")),
    ("rl_take", ("ann", 5, 5, 1, 0), take(True, 4, 5, 0, 12)),
    ("rl_take", ("\x01anything", 5, 5), ("error", "rl_take: key must not start with U+0001, which marks the keys of policies")),
    # a changed policy applies from the next call; stored state is capped by the new limits
    ("rl_policy_set", ("login", '{"limits": [{"burst": 2, "refill_per_minute": 5}]}'),
     {"limits": [{"burst": 2, "refill_per_minute": 5}], "tiers": {}, "shadow": False}),
    ("rl_check", ("login", "bea", 1, None, 0), checked([bucket_item(True, 1, 2, 0, 12, 24)], "login")),
    # shadow: never refuses, changes state exactly as enforcement would
    ("rl_policy_set", ("trial", '{"limits": [{"limit": 1, "window_seconds": 10}], "shadow": true}'),
     {"limits": [{"limit": 1, "window_seconds": 10}], "tiers": {}, "shadow": True}),
    ("rl_check", ("trial", "cy", 1, None, 0),
     checked([{**window(True, 0, 1, 0, 10, 10), "exceeds_limit": False}], "trial", shadow=True)),
    ("rl_check", ("trial", "cy", 1, None, 1000),
     checked([{**window(False, 0, 1, 9000, 9, 10), "exceeds_limit": False}], "trial", shadow=True, would_refuse=True)),
    ("rl_policy_set", ("trial", '{"limits": [{"limit": 1, "window_seconds": 10}]}'),
     {"limits": [{"limit": 1, "window_seconds": 10}], "tiers": {}, "shadow": False}),
    ("rl_check", ("trial", "cy", 1, None, 10_000),  # the would-be refusal at 1 s charged nothing
     checked([{**window(True, 0, 1, 0, 10, 10), "exceeds_limit": False}], "trial")),
    # a window forgets the newest admission given back: the next check is admitted again
    ("rl_refund_check", ("trial", "cy", 1, None, 10_000),
     {"policy": "trial", "tier": None, "items": [{**window(True, 1, 1, 0, 0, 10), "exceeds_limit": False}]}),
    ("rl_check", ("trial", "cy", 1, None, 10_000), checked([{**window(True, 0, 1, 0, 10, 10), "exceeds_limit": False}], "trial")),
    # a policy's fixed window, scaled by its tier; refunded as a window forgets its newest
    ("rl_policy_set", ("hourly", '{"limits": [{"limit": 2, "fixed_window_seconds": 3600}], "tiers": {"pro": 1.5}}'),
     {"limits": [{"limit": 2, "fixed_window_seconds": 3600}], "tiers": {"pro": 1.5}, "shadow": False}),
    ("rl_check", ("hourly", "dee", 2, None, 3_599_000),
     checked([{**window(True, 0, 2, 0, 1, 3600), "exceeds_limit": False}], "hourly")),
    ("rl_check", ("hourly", "dee", 1, "pro", 3_599_500),
     checked([{**window(True, 0, 3, 0, 1, 3600), "exceeds_limit": False}], "hourly", tier="pro")),
    ("rl_check", ("hourly", "dee", 1, "pro", 3_599_999),
     checked([{**window(False, 0, 3, 1, 1, 3600), "exceeds_limit": False}], "hourly", tier="pro", retry_ms=1,
             would_refuse=True)),
    ("rl_refund_check", ("hourly", "dee", 1, None, 3_599_999),
     {"policy": "hourly", "tier": None, "items": [{**window(True, 0, 2, 0, 1, 3600), "exceeds_limit": False}]}),
    ("rl_check", ("hourly", "dee", 2, None, 3_600_000),
     checked([{**window(True, 0, 2, 0, 3600, 3600), "exceeds_limit": False}], "hourly")),
    # a definition is validated whole; a bad one writes nothing
    # rl_policy_validate: rl_policy_set's validation, storing nothing (the web packages check
    # a route's explicit limits with it at startup)
    ("rl_policy_validate", ('{"limits": [{"burst": 5, "refill_per_minute": 5}, {"limit": 3, "window_seconds": 60}], '
                            '"tiers": {"pro": 2}}',),
     {"limits": [{"burst": 5, "refill_per_minute": 5}, {"limit": 3, "window_seconds": 60}], "tiers": {"pro": 2},
      "shadow": False}),
    ("rl_policy_validate", ('{"limits": [{"burst": 0, "refill_per_minute": 5}]}',),
     ("error", "rl_policy_validate: definition.limits item 1: burst must be a finite number greater than 0, got 0")),
    ("rl_policy_validate", ('{"limits": [{"burst": 3, "refill": 5}]}',),
     ("error", 'rl_policy_validate: definition.limits item 1: unknown field "refill" (a bucket has burst, refill_per_minute; a budget period, quota; a window limit, window_seconds; a fixed window limit, fixed_window_seconds)')),
    # a number written as text is read as the number, as every argument is; the answer has it as one
    ("rl_policy_validate", ('{"limits": [{"burst": "3", "refill_per_minute": 5}]}',),
     {"limits": [{"burst": 3, "refill_per_minute": 5}], "tiers": {}, "shadow": False}),
    ("rl_policy_validate", ('{"limits": [{"period": "fortnight", "quota": 5}]}',),
     ("error", "rl_policy_validate: definition.limits item 1: period must be 'hour', 'day', 'week', 'month' or 'year', got 'fortnight'")),
    ("rl_policy_validate", ("[]",), ("error", "rl_policy_validate: definition must be a JSON object with limits, and optionally tiers and shadow")),
    ("rl_policy_validate", (None,), ("error", "rl_policy_validate: definition must be JSON, got NULL")),
    # rl_top_refused: n from 1 to the summary's 64 entries; the policy is a name
    ("rl_top_refused", ("p", 0), ("error", "rl_top_refused: n must be an integer from 1 to 64, got 0")),
    ("rl_top_refused", ("p", 65), ("error", "rl_top_refused: n must be an integer from 1 to 64, got 65")),
    ("rl_top_refused", ("p", None), ("error", "rl_top_refused: n must be an integer from 1 to 64, got NULL")),
    ("rl_top_refused", ("",), ("error", "rl_top_refused: policy must not be empty")),
    # rl_budgets_near: fraction from 0 to 1000000, n from 1 to 10000
    ("rl_budgets_near", (-1,), ("error", "rl_budgets_near: fraction must be a number from 0 to 1000000, got -1")),
    ("rl_budgets_near", (0.5, 0), ("error", "rl_budgets_near: n must be an integer from 1 to 10000, got 0")),
    ("rl_budgets_near", (0.5, None), ("error", "rl_budgets_near: n must be an integer from 1 to 10000, got NULL")),
    ("rl_check", ("x", "ann"), ("error", "rl_check: there is no policy named 'x'", "42704")),
    ("rl_policy_set", ("x", '{"limits": []}'), ("error", "rl_policy_set: definition.limits must hold 1 to 16 items, got 0")),
    ("rl_policy_set", ("x", '{"limits": [{"burst": 5, "refill_per_minute": 60}], "tiers": {"gold": {"limits": []}}}'),
     ("error", "rl_policy_set: definition.tiers.gold must be a finite number greater than 0, got a JSON object")),
    ("rl_policy_set", ("x", '{"limits": [{"burst": 0, "refill_per_minute": 5}]}'),
     ("error", "rl_policy_set: definition.limits item 1: burst must be a finite number greater than 0, got 0")),
    ("rl_policy_set", ("x", '{"limits": [{"period": "fortnight", "quota": 5}]}'),
     ("error", "rl_policy_set: definition.limits item 1: period must be 'hour', 'day', 'week', 'month' or 'year', got 'fortnight'")),
    ("rl_policy_set", ("x", '{"limits": [{"burst": 1, "refill_per_minute": 1, "key": "k"}]}'),
     ("error", 'rl_policy_set: definition.limits item 1: unknown field "key" (a bucket has burst, refill_per_minute; a budget period, quota; a window limit, window_seconds; a fixed window limit, fixed_window_seconds)')),
    ("rl_policy_set", ("x", '{"limits": [{"burst": 1, "refill_per_minute": 1}], "tiers": {"pro": 0}}'),
     ("error", "rl_policy_set: definition.tiers.pro must be a finite number greater than 0, got 0")),
    ("rl_policy_set", ("x", '{"limits": [{"burst": 1e300, "refill_per_minute": 1}]}'),
     ("error", "rl_policy_set: definition.limits item 1: burst must be at most 1000000000000000, got 1e300")),
    ("rl_policy_set", ("x", '{"limits": [{"burst": 1e400, "refill_per_minute": 1}]}'),
     ("error", "rl_policy_set: definition.limits item 1: burst must be a finite number greater than 0, got Infinity")),
    ("rl_policy_set", ("x", '{"limits": [{"burst": 1e10, "refill_per_minute": 1}, {"period": "day", "quota": 5}], "tiers": {"pro": 1e10}}'),
     ("error", "rl_policy_set: definition.tiers.pro: a multiplier of 10000000000 takes limits item 1 out of range (a bucket's burst and refill must stay above 0 and at most 1000000000000000, a quota or window limit from 0.000001 to 1000000000)")),
    ("rl_policy_set", ("x", '{"limits": [{"period": "day", "quota": 5}], "tiers": {"pro": 1e9}}'),
     ("error", "rl_policy_set: definition.tiers.pro: a multiplier of 1000000000 takes limits item 1 out of range (a bucket's burst and refill must stay above 0 and at most 1000000000000000, a quota or window limit from 0.000001 to 1000000000)")),
    ("rl_policy_set", ("x", '{"limits": [{"burst": 1, "refill_per_minute": 1}], "shadow": 1}'),
     ("error", "rl_policy_set: definition.shadow must be true or false, got 1")),
    ("rl_policy_set", ("x", '{"limits": [{"burst": 1, "refill_per_minute": 1}], "shadow": [true, 1]}'),
     ("error", "rl_policy_set: definition.shadow must be true or false, got an array of 2 values")),
    ("rl_policy_set", ("x", '{"limits": [{"burst": 1, "refill_per_minute": 1}], "shadow": {"on": true}}'),
     ("error", "rl_policy_set: definition.shadow must be true or false, got an object")),
    ("rl_policy_set", ("x", '{"limits": [{"burst": 1, "refill_per_minute": 1}], "tier": {}}'),
     ("error", 'rl_policy_set: definition: unknown field "tier" (a policy has limits, tiers, shadow)')),
    ("rl_policy_set", ("x", "nope"), ("error", "rl_policy_set: definition must be valid JSON: expected ident at line 1 column 2"), "sqlite"),
    ("rl_policy_set", ("", "{}"), ("error", "rl_policy_set: name must not be empty")),
    ("rl_check", ("x", "ann"), ("error", "rl_check: there is no policy named 'x'", "42704")),
    ("rl_policy_drop", ("generate",), True),
    ("rl_policy_drop", ("generate",), False),
    ("rl_check", ("generate", "ann"), ("error", "rl_check: there is no policy named 'generate'", "42704")),
    # penalties: three free strikes, then 120 s, 240 s, ... (the seed's formula)
    *[("rl_penalize", ("eve", 3, 60, 3600, 3600, t), strikes(i + 1)) for i, t in enumerate((0, 1000, 2000))],
    ("rl_penalize", ("eve", 3, 60, 3600, 3600, 3000), strikes(4, 123, 120)),
    ("rl_penalize", ("eve", 3, 60, 3600, 3600, 4000), strikes(5, 244, 240)),
    ("rl_policy_set", ("api", '{"limits": [{"burst": 5, "refill_per_minute": 5}]}'),
     {"limits": [{"burst": 5, "refill_per_minute": 5}], "tiers": {}, "shadow": False}),
    ("rl_policy_set", ("watch", '{"limits": [{"burst": 5, "refill_per_minute": 5}], "shadow": true}'),
     {"limits": [{"burst": 5, "refill_per_minute": 5}], "tiers": {}, "shadow": True}),
    # blocked: refused for every enforced policy, charging nothing; shadow policies say would_refuse
    ("rl_check", ("api", "eve", 1, None, 5000),
     checked([bucket_item(True, 5, 5, 0, 0, 60)], "api", retry_ms=239_000, would_refuse=True, blocked=True)),
    ("rl_check", ("watch", "eve", 1, None, 5000),
     checked([bucket_item(True, 5, 5, 0, 0, 60)], "watch", shadow=True, would_refuse=True, blocked=True)),
    ("rl_check", ("api", "eve", 1, None, 244_000), checked([bucket_item(True, 4, 5, 0, 12, 60)], "api")),
    # strikes are forgotten an hour after the last one
    ("rl_penalize", ("eve", 3, 60, 3600, 3600, 4000 + 3_600_000), strikes(1)),
    ("rl_block", ("fay", None, 0), strikes(0, None, None, blocked=True)),
    ("rl_check", ("api", "fay", 1, None, 0),
     checked([bucket_item(True, 5, 5, 0, 0, 60)], "api", retry_ms=None, would_refuse=True, blocked=True)),
    # blocked until rl_unblock: refused, and no wait ends it
    ("rl_check_compact", ("api", "fay", 1, None, 0), "0 5 5 0 0"),
    ("rl_unblock", ("fay", 0), True),
    ("rl_unblock", ("fay", 0), False),
    ("rl_check", ("api", "fay", 1, None, 0), checked([bucket_item(True, 4, 5, 0, 12, 60)], "api")),
    # the compact answers: 'admitted limit remaining reset retry_after', the X- headers' values
    ("rl_check_compact", ("api", "fay", 1, None, 0), "1 5 3 24 0"),
    ("rl_check_compact", ("api", "fay", 5, None, 0), "0 5 3 24 24"),
    ("rl_check_compact", ("api", "fay", 6, None, 0), "0 5 3 24 0"),
    ("rl_check_compact", ("generate", "ann"), ("error", "rl_check_compact: there is no policy named 'generate'", "42704")),
    ("rl_check_compact", ("api", ""), ("error", "rl_check_compact: subject must not be empty")),
    ("rl_take_compact", ("compact", 3, 60, 1, 0), "1 3 2 1 0"),
    ("rl_take_compact", ("compact", 3, 60, 3, 0), "0 3 2 1 1"),
    ("rl_take_compact", ("compact", 3, 60, 4, 0), "0 3 2 1 0"),
    ("rl_take_compact", ("compact", 3, 60, 1, 10_000), "1 3 2 1 0"),
    ("rl_take_compact", ("", 3, 60), ("error", "rl_take_compact: key must not be empty")),
    ("rl_take_compact", ("compact", 0, 60), ("error", "rl_take_compact: burst must be a finite number greater than 0, got 0")),
    ("rl_take_all_compact", ('[{"key": "compact-b", "burst": 5, "refill_per_minute": 60},'
                             ' {"key": "compact-d", "period": "day", "quota": 2.5}]', 0), "1 2.5 1.5 86400 0"),
    ("rl_take_all_compact", ('[{"key": "compact-b", "burst": 5, "refill_per_minute": 60},'
                             ' {"key": "compact-d", "period": "day", "quota": 2.5, "cost": 1.5}]', 0), "1 2.5 0 86400 0"),
    ("rl_take_all_compact", ('[{"key": "compact-b", "burst": 5, "refill_per_minute": 60},'
                             ' {"key": "compact-d", "period": "day", "quota": 2.5}]', 0), "0 2.5 0 86400 86400"),
    ("rl_take_all_compact", ('[{"key": "compact-w", "limit": 2, "window_seconds": 10}]', 0), "1 2 1 10 0"),
    ("rl_take_all_compact", ("[]", 0), ("error", "rl_take_all_compact: limits must hold 1 to 64 items, got 0")),
    ("rl_block", ("gus", 1.5, 1000), strikes(0, 3, 2)),
    ("rl_check_compact", ("api", "gus", 1, None, 1000), "0 5 5 0 2"),
    ("rl_check_compact", ("watch", "gus", 1, None, 1000), "1 5 5 0 0"),
    ("rl_penalize", (None,), ("error", "rl_penalize: subject must be text, got NULL")),
    ("rl_penalize", ("x", -1), ("error", "rl_penalize: free_strikes must be an integer from 0 to 1000000, got -1")),
    ("rl_penalize", ("x", 3, 0), ("error", "rl_penalize: base_seconds must be a finite number greater than 0, got 0")),
    ("rl_block", ("x", 0), ("error", "rl_block: seconds must be a finite number greater than 0, got 0")),
    ("rl_sweep", (), None),
    # how long rl_sweep keeps ended periods: an administrator's setting of the database
    ("rl_usage_retention", (), 400),
    ("rl_usage_retention", (30,), 30),
    ("rl_usage_retention", (None,), 30),
    ("rl_usage_retention", (0,), ("error", "rl_usage_retention: days must be an integer from 1 to 36500, got 0")),
    ("rl_usage_retention", (36501,), ("error", "rl_usage_retention: days must be an integer from 1 to 36500, got 36501")),
    ("rl_usage_retention", (400,), 400),
]


def run(engine):
    """Runs every step meant for this engine; returns {step index: result}."""
    results = {}
    handed_out = {}  # lease prefix -> the id this engine handed out
    for i, (function, args, expected, *only) in enumerate(STEPS):
        if only and only[0] != engine.engine:
            continue
        args = tuple(handed_out.get(a.prefix, a.prefix) if isinstance(a, Lease) else a for a in args)
        expected = with_derived_keys(function, args, expected)
        if isinstance(expected, (dict, list)) and args and isinstance(args[-1], int):
            expected = with_reset_after(expected, args[-1])
        if function == "rl_version" and not args:
            expected = getattr(engine, "version", expected)  # the SQL edition says which it is
        if isinstance(expected, tuple):
            message, code = engine.error_of(function, *args)
            results[i] = ("error", message)
            assert message == expected[1], f"{engine.name} {function}{args}"
            if engine.engine == "postgres":
                wanted = expected[2] if len(expected) > 2 else "22023"
                assert code == wanted, f"{function}{args}: SQLSTATE {code}"
        else:
            got = engine.call(function, *args)
            if isinstance(got, dict) and isinstance(got.get("lease"), str):
                handed_out[lease_prefix(got["lease"])] = got["lease"]
                # engines agree on everything but the random secret
                results[i] = {**got, "lease": lease_prefix(got["lease"])}
            else:
                results[i] = got
            if expected is not None:
                assert got == expected, f"{engine.name} {function}{args}"
    return results


def test_sqlite_follows_the_contract(sqlite_engine):
    run(sqlite_engine)


def test_postgres_follows_the_contract(pg_engine):
    run(pg_engine)


def test_postgres_memory_store_follows_the_contract(pg_memory_engine):
    run(pg_memory_engine)


def test_engines_and_stores_agree(sqlite_db, pg_db, pg_memory_db):
    sqlite_results = run(SqliteEngine(sqlite_db[0]))
    for engine in (PgEngine(pg_db[0]), PgEngine(pg_memory_db[0], "postgres-memory")):
        pg_results = run(engine)
        shared = [i for i, step in enumerate(STEPS) if len(step) == 3]
        assert len(shared) > 100
        for i in shared:
            assert sqlite_results[i] == pg_results[i], \
                f"{engine.name} differs on {STEPS[i][0]}{STEPS[i][1]}: sqlite {sqlite_results[i]} {engine.name} {pg_results[i]}"


def test_sweep_with_any_clock_keeps_a_refilling_bucket(engine):
    # taken now, on the real clock: refilling for about 100 years
    assert engine.call("rl_take", "slow", 10, 1e-4, 10)["admitted"] is True
    assert engine.call("rl_spend", "budget", "month", 1, 1)["admitted"] is True
    for clock in (0, 1, int(MAX_NOW), None):
        removed = engine.call("rl_sweep", clock) if clock is not None else engine.call("rl_sweep")
        assert removed == 0, f"sweep at {clock} removed {removed}"
    assert engine.call("rl_take", "slow", 10, 1e-4, 1)["admitted"] is False
    kept = engine.call("rl_budget", "budget", "month", 1, 1)
    assert (kept["admitted"], kept["used"]) == (False, 1)


def test_clock_behind_never_moves_stored_times_back(engine):
    first = engine.call("rl_take", "skew", 5, 60, 5, 50_000)
    assert first["admitted"] is True
    for behind in (0, 10_000, 49_999):
        r = engine.call("rl_take", "skew", 5, 60, 1, behind)
        assert r["admitted"] is False, "no refill for a clock behind the row"
        assert r["retry_after_ms"] == 50_000 - behind + 1000
    # the row still refills from 50 000 ms: one token is back at 51 000, not earlier
    assert engine.call("rl_take", "skew", 5, 60, 1, 50_999)["admitted"] is False
    assert engine.call("rl_take", "skew", 5, 60, 1, 51_000)["admitted"] is True


def compact_of(engine, answer):
    """The compact answer the contract gives a JSON answer: its decision, then the values of
    the X- headers and Retry-After that rl_headers gives it, 0 for a header it leaves out."""
    headers = engine.call("rl_headers", json.dumps(answer))
    headers = json.loads(headers) if isinstance(headers, str) else headers
    return " ".join(["1" if answer["admitted"] else "0", headers["X-RateLimit-Limit"], headers["X-RateLimit-Remaining"],
                     headers.get("X-RateLimit-Reset", "0"), headers.get("Retry-After", "0")])


def test_compact_answers_are_the_headers_of_the_json_answers(engine):
    """rl_take_compact, rl_check_compact and rl_take_all_compact on keys of their own answer
    what rl_headers makes of rl_take's, rl_check's and rl_take_all's answers on twin keys
    given the same calls: every kind, refusals, costs above the limit, debts, tiers, shadow."""
    import random
    rng = random.Random(56)
    engine.call("rl_policy_set", "compact-mix", json.dumps({
        "limits": [{"burst": 4, "refill_per_minute": 30}, {"period": "hour", "quota": 6.5},
                   {"limit": 3, "fixed_window_seconds": 20}],
        "tiers": {"pro": 2.5}}))
    engine.call("rl_policy_set", "compact-shadow", json.dumps({"limits": [{"limit": 2, "window_seconds": 30}],
                                                               "shadow": True}))
    now = 1_700_000_000_000
    seen = set()
    for _ in range(300):
        now += rng.choice([0, 0, 250, 1000, 7000, 61_000])
        which = rng.choice(["take", "take", "check", "all"])
        cost = rng.choice([1, 1, 2, 0.5, 9])
        if which == "take":
            burst, rate = rng.choice([(3, 60), (2.5, 7), (10, 0.5)])
            args = lambda side: (f"{side}-bucket-{burst}", burst, rate, cost, now)
            pair = ("rl_take", "rl_take_compact")
        elif which == "check":
            policy, tier = rng.choice([("compact-mix", None), ("compact-mix", "pro"), ("compact-shadow", None)])
            args = lambda side: (policy, f"{side}-subject", cost, tier, now)
            pair = ("rl_check", "rl_check_compact")
        else:
            items = [{"burst": 5, "refill_per_minute": 20, "cost": cost}, {"period": "day", "quota": 4.5, "cost": cost},
                     {"limit": 3, "window_seconds": 15, "cost": cost}, {"limit": 4, "fixed_window_seconds": 30}]
            chosen = rng.sample(range(len(items)), rng.randint(1, 3))
            args = lambda side: (json.dumps([{**items[i], "key": f"{side}-item-{i}"} for i in chosen]), now)
            pair = ("rl_take_all", "rl_take_all_compact")
        answer = engine.call(pair[0], *args("json"))
        compact = engine.call(pair[1], *args("compact"))
        assert compact == compact_of(engine, answer), f"{engine.name} {pair[1]}{args('compact')}: {answer}"
        seen.add((pair[1], compact.split()[0], compact.split()[-1] != "0"))
    # the run saw admissions and refusals that wait on every function, and refusals no
    # wait ends (a cost above the limit)
    for function in ("rl_take_compact", "rl_check_compact", "rl_take_all_compact"):
        assert {(function, "1", False), (function, "0", True)} <= seen, seen
        assert (function, "0", False) in seen, seen
