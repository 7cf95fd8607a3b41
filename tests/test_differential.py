"""The differential run (issue 24): one random sequence of calls, every function with hostile
arguments included and an explicit clock, against the native extension and the SQL edition
in two databases; every answer and every error (SQLSTATE and message) must be the same.

RL_DIFF_CALLS sets the number of calls (default 100000)."""
import contextlib
import datetime
import os
import random
import uuid

import pytest

from conftest import EDITION, FUNCTIONS, PgEngine, pg_test_database, sql_edition_database
from test_fuzz import CLOCKS, pg_value, random_call

psycopg2 = pytest.importorskip("psycopg2")

CALLS = int(os.environ.get("RL_DIFF_CALLS", "100000"))
# Counters differ by design (the native ones count for the whole server, the edition's per
# session), the memory store is the native extension's alone, and rl_version says which.
LEFT_OUT = {"rl_policy_stats", "rl_stats_reset", "rl_top_refused", "rl_memory_stats", "rl_version"}
PARAMS = {f["name"]: f["params"] for f in FUNCTIONS}
LAST_LEASE = "(the last lease this engine handed out on the key)"


KEYS, SUBJECTS, POLICIES = ["a", "b", "c"], ["s1", "s2"], ["p1", "p2"]
DEFINITIONS = [
    '{"limits": [{"burst": 5, "refill_per_minute": 30}]}',
    '{"limits": [{"burst": 3, "refill_per_minute": 6}, {"period": "day", "quota": 10.5}], "tiers": {"pro": 2.5}}',
    '{"limits": [{"limit": 4, "window_seconds": 90}, {"period": "month", "quota": 100}], "tiers": {"pro": 3}, "shadow": true}',
    '{"limits": [{"limit": 3, "fixed_window_seconds": 60}, {"limit": 5, "window_seconds": 60}], "tiers": {"pro": 1.5}}',
    '{"limits": [{"period": "week  from WED 12:00 in europe/berlin", "quota": 5}], "tiers": {"pro": 2}}',
    '{"limits": [{"period": "week from wed 12:00 in europe/berlin", "quota": 5}, {"burst": 4, "refill_per_minute": 2}]}',
]


PERIODS = ["hour", "day", "day", "week", "month", "month", "year", "month from 31 09:00 in America/New_York",
           "day from 02:30 in Europe/Berlin", "week from wed 12:00 in Australia/Sydney", "year from 02-29 in Asia/Kolkata"]
# Zones whose rules the core's database (IANA 2026f) and Debian 12's (2025b) give alike from
# 1970 to 2100, with daylight-saving changes of every kind: an hour, half an hour (Lord Howe),
# 45-minute offsets (Chatham), abolished (Sao Paulo), a skipped day (Apia), south and north.
ZONES = ["America/New_York", "America/Chicago", "Europe/Berlin", "Europe/London", "Australia/Sydney",
         "Australia/Lord_Howe", "Pacific/Chatham", "America/Sao_Paulo", "Pacific/Apia", "Asia/Kolkata", "Asia/Tokyo"]
ANCHORS = {"hour": ["", " from :30", " from :45"], "day": ["", " from 02:30", " from 01:30", " from 06:00"],
           "week": ["", " from wed 12:00", " from sun 02:30"], "month": ["", " from 31 09:00", " from 15", " from 29 02:30"],
           "year": ["", " from 02-29", " from 03-31 02:30", " from 11-01 01:30"]}


def valid_call(rng):
    """A well-formed call on a few keys, subjects and policies, so that calls meet state."""
    key, subject, policy = rng.choice(KEYS), rng.choice(SUBJECTS), rng.choice(POLICIES)
    cost = rng.choice([1, 1, 2, 0.5, 2.5, 7])
    function = rng.choice(["rl_take", "rl_take", "rl_peek", "rl_refund", "rl_charge", "rl_spend", "rl_spend", "rl_budget",
                           "rl_refund_budget", "rl_charge_budget", "rl_window", "rl_window", "rl_window_peek",
                           "rl_fixed_window", "rl_fixed_window", "rl_fixed_window_peek",
                           "rl_acquire", "rl_release", "rl_renew", "rl_in_flight", "rl_take_all", "rl_refund_all", "rl_charge_all", "rl_check_limits", "rl_check", "rl_check",
                           "rl_charge_check", "rl_peek_check",
                           "rl_refund_check", "rl_policy_set", "rl_penalize", "rl_block", "rl_unblock", "rl_sweep",
                           "rl_headers", "rl_reset", "rl_policy_drop", "rl_budgets_near", "rl_usage",
                           "rl_take_compact", "rl_check_compact", "rl_take_all_compact"])
    burst, rate = rng.choice([(5, 30), (3, 6), (10, 0.5)])
    m = rng.choice([1, 1, 2.5, 0.3, 1e-7, 7])  # an item's multiplier (1e-7: out of range for some)
    args = {
        "rl_take": [key, burst, rate, cost], "rl_peek": [key, burst, rate, rng.choice([0, cost])],
        "rl_refund": [key, burst, rate, cost], "rl_charge": [key, burst, rate, cost],
        "rl_spend": [key, rng.choice(PERIODS), rng.choice([10, 2.5]), cost],
        "rl_budget": [key, rng.choice(PERIODS), 10, rng.choice([0, cost])],
        "rl_refund_budget": [key, rng.choice(PERIODS), cost], "rl_charge_budget": [key, rng.choice(PERIODS), cost],
        "rl_window": [key, rng.choice([4, 10]), rng.choice([1, 90]), cost],
        "rl_window_peek": [key, 4, 90, rng.choice([0, cost])],
        "rl_fixed_window": [key, rng.choice([4, 10]), rng.choice([1, 60, 86400]), cost],
        "rl_fixed_window_peek": [key, 4, 60, rng.choice([0, cost])],
        "rl_acquire": [key, rng.choice([1, 2, 3]), rng.choice([1, 30])], "rl_release": [key, LAST_LEASE],
        "rl_renew": [key, LAST_LEASE, 30], "rl_in_flight": [key],
        "rl_take_all": ['[{"key": "%s", "burst": %s, "refill_per_minute": %s, "cost": %s, "multiplier": %s}, '
                        '{"key": "%s", "period": "%s", "quota": 10, "cost": %s, "multiplier": %s}, '
                        '{"key": "%s", "limit": 4, "window_seconds": 90, "multiplier": %s}, '
                        '{"key": "%s", "limit": 3, "fixed_window_seconds": %s, "cost": %s, "multiplier": %s}]'
                        % (key, burst, rate, cost, m, key, rng.choice(PERIODS), cost, m, key, m,
                           rng.choice(KEYS), rng.choice([1, 60, 3600]), cost, m)],
        "rl_check_limits": ["POST /x", subject, '[{"key": "%s", "burst": %s, "refill_per_minute": %s, "cost": %s}, '
                            '{"key": "%s", "limit": 4, "window_seconds": 90}]' % (key, burst, rate, cost, key)],
        "rl_refund_all": ['[{"key": "%s", "limit": 4, "window_seconds": 90, "cost": %s}, '
                          '{"key": "%s", "period": "day", "quota": 10, "cost": %s}, '
                          '{"key": "%s", "limit": 3, "fixed_window_seconds": 60, "cost": %s}, '
                          '{"key": "%s", "burst": %s, "refill_per_minute": %s, "cost": %s}]'
                          % (key, cost, key, cost, key, cost, key, burst, rate, cost)],
        "rl_charge_all": ['[{"key": "%s", "period": "day", "quota": 10, "cost": %s}, '
                          '{"key": "%s", "burst": %s, "refill_per_minute": %s, "cost": %s}, '
                          '{"key": "%s", "limit": 4, "window_seconds": 90, "cost": %s}, '
                          '{"key": "%s", "limit": 3, "fixed_window_seconds": 60, "cost": %s}]'
                          % (key, cost, key, burst, rate, cost, key, cost, rng.choice(KEYS), cost)],
        "rl_check": [policy, subject, cost, rng.choice([None, None, "pro"])],
        "rl_charge_check": [policy, subject, cost, rng.choice([None, "pro"])],
        "rl_peek_check": [policy, subject, rng.choice([0, cost]), rng.choice([None, "pro"])],
        "rl_refund_check": [policy, subject, cost, rng.choice([None, "pro"])],
        "rl_policy_set": [policy, rng.choice(DEFINITIONS)], "rl_policy_drop": [policy],
        "rl_penalize": [subject, rng.choice([0, 1, 3]), 60, 3600, rng.choice([1, 3600])],
        "rl_block": [subject, rng.choice([None, 1, 120])], "rl_unblock": [subject],
        "rl_sweep": [], "rl_reset": [key], "rl_budgets_near": [rng.choice([0, 0.5, 0.9, 1])],
        "rl_usage": [key, rng.choice([0, 1_000_000_000_000]), rng.choice([1_000_100_000_000, 253402300799999])],
        "rl_headers": ['{"admitted": false, "remaining": 0, "limit": 5, "retry_after_ms": 1500, '
                       '"retry_after_seconds": 2, "reset_after_seconds": 9, "refill_seconds": 10}'],
    }
    # a compact answer's call is its JSON twin's
    args["rl_take_compact"], args["rl_check_compact"] = args["rl_take"], args["rl_check"]
    args["rl_take_all_compact"] = args["rl_take_all"]
    return function, args[function]


def with_clock(function, args, clock, rng):
    """The call with an explicit now_ms: the run's own clock, unless the call was given a
    hostile one (kept a fifth of the time). Arguments before it take their defaults."""
    params = PARAMS[function]
    names = [p["name"] for p in params]
    if "now_ms" not in names or function == "rl_sweep":
        return args
    at = names.index("now_ms")
    given = args[at] if len(args) > at else None
    if given is not None and given in CLOCKS and rng.random() < 0.2:
        return args
    args = list(args[:at])
    for p in params[len(args):at]:
        default = p["default"]
        if default is None:  # a required argument left out: the call is refused as it is
            return args
        args.append(None if default == "NULL" else float(default) if p["type"] == "double precision" else int(default))
    return args + [clock]


def answer_of(engine, function, args):
    try:
        return "answer", engine.call(function, *args)
    except ValueError:  # the driver refuses NUL in text before sending anything
        return "refused by the driver", None
    except psycopg2.Error as e:
        return "error", (e.pgcode, e.diag.message_primary)


def without_secret(answer):
    if isinstance(answer, dict) and isinstance(answer.get("lease"), str):
        return {**answer, "lease": answer["lease"].rsplit("-", 1)[0]}
    return answer


@contextlib.contextmanager
def native_database():
    """A database with the native extension and the explicit clock allowed: on this cluster,
    or (RL_DIFF_NATIVE_HOST and RL_DIFF_NATIVE_PORT, for the SQL edition on PostgreSQL 13 and
    14, where there is no native extension) on another cluster's. Yields a connection."""
    host = os.environ.get("RL_DIFF_NATIVE_HOST")
    if not host:
        with pg_test_database() as (conn, _):
            yield conn
        return
    where = dict(host=host, port=os.environ["RL_DIFF_NATIVE_PORT"], user="postgres")
    name = f"rl_diff_{uuid.uuid4().hex[:12]}"
    server = psycopg2.connect(dbname="postgres", **where)
    server.autocommit = True
    server.cursor().execute(f"CREATE DATABASE {name}")
    try:
        conn = psycopg2.connect(dbname=name, **where)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("CREATE EXTENSION pg_ratelimit")
            cur.execute("SET pg_ratelimit.allow_explicit_clock = on")
        yield conn
        conn.close()
    finally:
        server.cursor().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        server.close()


@pytest.mark.skipif(EDITION == "sql", reason="compares the SQL edition with the native extension")
def test_the_editions_answer_every_call_alike():
    with native_database() as native_conn, sql_edition_database() as (sql_conn, _):
        compare(PgEngine(native_conn), PgEngine(sql_conn, "postgres-sql"))


def compare(native, ours):
    functions = [f["name"] for f in FUNCTIONS if f["kind"] not in ("internal", "server") and f["name"] not in LEFT_OUT]
    rng = random.Random(20261201)
    clock = 1_000_000_000_000
    leases = {id(native): {}, id(ours): {}}
    kinds, differences = {}, []
    for n in range(CALLS):
        clock += rng.choice([0, 0, 1, 7, 250, 1000, 60_000, 3_600_000])
        function, args = valid_call(rng) if rng.random() < 0.6 else random_call(rng, functions)
        args = [pg_value(a) for a in with_clock(function, args, clock, rng)]
        if function in ("rl_release", "rl_renew") and rng.random() < 0.3:
            args[1] = LAST_LEASE
        answers = []
        for engine in (native, ours):
            call_args = list(args)
            if call_args[1:2] == [LAST_LEASE]:
                call_args[1] = leases[id(engine)].get(call_args[0], "none")
            kind, value = answer_of(engine, function, call_args)
            if kind == "answer" and isinstance(value, dict) and isinstance(value.get("lease"), str):
                leases[id(engine)][call_args[0]] = value["lease"]
            answers.append((kind, without_secret(value)))
        if function == "rl_sweep" and args[1:2] not in ([], [None]) and answers[0] == answers[1]:
            # max_rows lets a sweep remove any of the rows no longer needed, in the order each
            # engine's table gives them; an unbounded sweep after it leaves both alike again.
            function = "rl_sweep() after rl_sweep"
            answers = [answer_of(engine, "rl_sweep", []) for engine in (native, ours)]
        kinds[answers[0][0]] = kinds.get(answers[0][0], 0) + 1
        if answers[0] != answers[1]:
            differences.append((n, function, args, answers[0], answers[1]))
            if len(differences) >= 20:
                break
    print(f"\n{CALLS} calls: {kinds}; {len(differences)} differences")
    assert differences == [], "\n".join(f"call {n}: {f}{tuple(a)}\n  native {x}\n  sql    {y}"
                                        for n, f, a, x, y in differences)
    assert kinds.get("answer", 0) > CALLS // 10 and kinds.get("error", 0) > CALLS // 10


@pytest.mark.skipif(EDITION == "sql", reason="compares the SQL edition with the native extension")
def test_periods_in_time_zones_are_bounded_alike_from_1970_to_2100():
    """Anchored and zoned periods, most of them around daylight-saving changes, from 1970 to
    2100: the native extension (the core, and its own time zone database) and the SQL edition
    (the server's) give the same bounds, read through rl_budget's resets_at and period_seconds."""
    rng = random.Random(20261206)
    with native_database() as native_conn, sql_edition_database() as (sql_conn, _):
        native, ours = PgEngine(native_conn), PgEngine(sql_conn, "postgres-sql")
        differences, calls = [], max(CALLS // 10, 2000)
        for _ in range(calls):
            unit = rng.choice(list(ANCHORS))
            period = unit + rng.choice(ANCHORS[unit]) + " in " + rng.choice(ZONES)
            year = rng.randint(1970, 2100)
            # the months of the changes north and south, else any day; any minute
            month = rng.choice([3, 4, 9, 10, 11, rng.randint(1, 12)])
            day = rng.randint(1, 28)
            now = (datetime.datetime(year, month, day, tzinfo=datetime.timezone.utc)
                   + datetime.timedelta(minutes=rng.randint(-2 * 1440, 3 * 1440)))
            now_ms = max(int(now.timestamp() * 1000) + rng.choice([0, 0, 1, 999, -1]), 0)
            answers = [answer_of(e, "rl_budget", ["z", period, 10, 0, now_ms]) for e in (native, ours)]
            if answers[0] != answers[1]:
                differences.append((period, now_ms, *answers))
        assert differences == [], "\n".join(f"{p} at {t}:\n  native {x}\n  sql    {y}" for p, t, x, y in differences[:20])
