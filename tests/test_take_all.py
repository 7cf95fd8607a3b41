"""rl_take_all under concurrency: 16 sessions (PostgreSQL) or processes (SQLite) run
overlapping multi-limit calls on shared keys, listed in different orders. No deadlock,
no error, and no item is ever charged when its call was refused: every limit's stored
use equals the number of admitted calls that named it."""
import json
import multiprocessing
import random

import pytest

from conftest import run_sessions, sqlite_connect

LIMITS = {
    "bucket:a": {"key": "a", "burst": 150, "refill_per_minute": 0.000001},
    "bucket:b": {"key": "b", "burst": 200, "refill_per_minute": 0.000001},
    "bucket:c": {"key": "c", "burst": 250, "refill_per_minute": 0.000001},
    "budget:a": {"key": "a", "period": "month", "quota": 180},
    "budget:d": {"key": "d", "period": "day", "quota": 220},
}
CALLS = 60


def plan(seed):
    """The calls one worker makes: 2 to 4 limits each, in a random order."""
    rng = random.Random(seed)
    calls = []
    for _ in range(CALLS):
        names = rng.sample(sorted(LIMITS), rng.randint(2, 4))
        calls.append((names, json.dumps([LIMITS[n] for n in names])))
    return calls


def tally(results):
    admitted = {name: 0 for name in LIMITS}
    refused_calls = 0
    for names, ok in results:
        if ok:
            for n in names:
                admitted[n] += 1
        else:
            refused_calls += 1
    return admitted, refused_calls


def check_state(admitted, bucket_level, budget_used):
    for name, spec in LIMITS.items():
        if name.startswith("bucket"):
            used = spec["burst"] - bucket_level(spec["key"])
        else:
            used = budget_used(spec["key"], spec["period"])
        assert round(used, 6) == admitted[name], f"{name}: stored {used}, admitted calls {admitted[name]}"
        cap = spec.get("burst", spec.get("quota"))
        assert admitted[name] <= cap


def _sqlite_worker(args):
    path, seed = args
    conn = sqlite_connect(path, timeout=60)
    out = []
    for names, limits in plan(seed):
        result = json.loads(conn.execute("SELECT rl_take_all(?)", (limits,)).fetchone()[0])
        out.append((names, result["admitted"]))
    return out


def test_sqlite_processes_overlapping_take_all(tmp_path):
    path = str(tmp_path / "multi.db")
    sqlite_connect(path).execute("PRAGMA journal_mode=wal")
    with multiprocessing.get_context("fork").Pool(16) as pool:
        results = [r for rs in pool.map(_sqlite_worker, [(path, s) for s in range(16)]) for r in rs]
    admitted, refused = tally(results)
    print(f"\nsqlite rl_take_all: {len(results)} calls, {refused} refused, admitted per limit {admitted}")
    assert refused > 0, "the limits ran out during the run"
    conn = sqlite_connect(path)
    check_state(
        admitted,
        lambda key: conn.execute("SELECT level FROM rl_bucket WHERE key = ?", (key,)).fetchone()[0],
        lambda key, period: conn.execute("SELECT used FROM rl_budget WHERE key = ? AND period = ?",
                                         (key, period)).fetchone()[0] / 1e6,
    )


def test_postgres_sessions_overlapping_take_all(pg_db):
    conn, name = pg_db
    results = []

    def work(seed, c):
        cur = c.cursor()
        for names, limits in plan(seed):
            cur.execute("SELECT rl_take_all(%s)", (limits,))
            results.append((names, cur.fetchone()[0]["admitted"]))

    run_sessions(name, 16, work)
    admitted, refused = tally(results)
    print(f"\npostgres rl_take_all: {len(results)} calls, {refused} refused, admitted per limit {admitted}")
    assert refused > 0
    cur = conn.cursor()

    def level(key):
        cur.execute("SELECT level FROM ratelimit.rl_bucket WHERE key = %s", (key,))
        return cur.fetchone()[0]

    def used(key, period):
        cur.execute("SELECT used FROM ratelimit.rl_budget WHERE key = %s AND period = %s", (key, period))
        return cur.fetchone()[0] / 1e6

    check_state(admitted, level, used)
