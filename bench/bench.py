"""Benchmarks: pg_ratelimit and the SQLite extension against what users would pick
instead, measured side by side in one run and reported as ratios.

Run through scripts/bench.sh, which installs and starts everything this needs (a
throwaway PostgreSQL 15 cluster, a Redis server on loopback, the built extensions, the
SQLite driver). Writes bench/results/results.md and chart.png, memory_store.md, kinds.md
and targets.md (the speed targets from one interleaved run, with profiles).

Every cell is the median of RL_BENCH_REPS runs (default 3) of RL_BENCH_SECONDS each
(default 3); the runs of all systems are interleaved so that drift affects all alike."""
import calendar
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import call_profile  # noqa: E402  (bench/call_profile.py)
import instructions  # noqa: E402  (bench/instructions.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
SECONDS = float(os.environ.get("RL_BENCH_SECONDS", "3"))
REPS = int(os.environ.get("RL_BENCH_REPS", "3"))
SCALES = [int(x) for x in os.environ.get("RL_BENCH_SCALES", "1000000,10000000").split(",") if x]
KEYS = 100_000
DB = "rl_bench"
REDIS_PORT = int(os.environ.get("RL_REDIS_PORT", "56379"))
SQLITE_EXT = os.path.join(ROOT, "target", "release", "libratelimit")
SQLITE_DRIVER = os.environ.get("RL_SQLITE_DRIVER", "/tmp/rl_sqlite_driver")

# Always-admit limits: a burst no run can drain.
BIG = "1000000000, 600000000"
PG_SCRIPTS = {
    "rl_take": f"SELECT rl_take('k' || :k, {BIG});",
    "rl_spend": "SELECT rl_spend('k' || :k, 'month', 1000000000, 1);",
    "hand-written SQL": f"SELECT hw_take('k' || :k, {BIG});",
    "bare UPDATE": "UPDATE counters SET n = n + 1 WHERE k = 'k' || :k;",
    "SELECT 1": "SELECT 1;",
}
FLOOD_SCRIPTS = {
    "rl_take": "SELECT rl_take('flood', 1, 0.000001);",
    "hand-written SQL": "SELECT hw_take('flood', 1, 0.000001);",
}


def psql(sql, db=DB):
    subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", db, "-c", sql], check=True,
                   stdout=subprocess.DEVNULL)


def psql_value(sql, db=DB):
    out = subprocess.run(["psql", "-X", "-At", "-d", db, "-c", sql], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def redis(*args):
    out = subprocess.run(["redis-cli", "-p", str(REDIS_PORT), *args], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] if values else float("nan")


def pgbench(script, clients, keys, sync, buckets="table", transactions=None, db=DB, seconds=None, options=""):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "script.sql")
        with open(path, "w") as f:
            f.write(f"\\set k random(1, {keys})\n{script}\n")
        env = dict(os.environ, PGOPTIONS=f"-c synchronous_commit={'on' if sync else 'off'} -c pg_ratelimit.buckets={buckets} "
                                         f"{options}")
        length = ["-t", str(transactions)] if transactions else ["-T", str(max(1, round(seconds or SECONDS)))]
        cmd = ["pgbench", "-n", "-M", "prepared", "-f", path, "-c", str(clients), "-j", str(min(clients, 2)),
               *length, "--log", "--sampling-rate=0.2", "--log-prefix", os.path.join(tmp, "log"), db]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=tmp).stdout
        tps = float(re.search(r"tps = ([\d.]+) \(without initial connection time\)", out).group(1))
        latencies = []
        for log in glob.glob(os.path.join(tmp, "log*")):
            with open(log) as f:
                latencies += [int(line.split()[2]) / 1000 for line in f if line.strip()]
    return {"calls_per_s": tps, "p50_ms": percentile(latencies, 0.5), "p99_ms": percentile(latencies, 0.99)}


def redis_bench(sha, clients, keys, flood=False):
    if flood:
        cmd = ["EVALSHA", sha, "1", "flood", "1", "0.000001", "1"]
    elif keys == 1:
        cmd = ["EVALSHA", sha, "1", "k:1", *BIG.replace(" ", "").split(","), "1"]
    else:
        cmd = ["-r", str(keys), "EVALSHA", sha, "1", "k:__rand_int__", *BIG.replace(" ", "").split(","), "1"]
    return redis_benchmark(clients, cmd, expected_rate=50_000)


def redis_benchmark(clients, cmd, seconds=None, expected_rate=100_000):
    """redis-benchmark of one command, about `seconds` long if it runs `expected_rate` calls/s."""
    out = subprocess.run(["redis-benchmark", "-p", str(REDIS_PORT), "-c", str(clients),
                          "-n", str(int(expected_rate * (seconds or SECONDS))),
                          "--csv", *cmd], check=True, capture_output=True, text=True).stdout
    row = [line for line in out.splitlines() if line and not line.startswith('"test"')][-1]
    fields = [x.strip('"') for x in row.split(",")]
    return {"calls_per_s": float(fields[1]), "p50_ms": float(fields[4]), "p99_ms": float(fields[6])}


def redis_cell_bench(clients, keys, seconds=None):
    """redis-cell's CL.THROTTLE (a GCRA bucket in a Redis module, the fastest peer): a burst
    no run drains, 1e9, refilled at 6e7 per 60 s (rl_take's 6e8 overflows its arithmetic:
    it answers a remaining count of 2^63 - 1). Its keys are apart from the Lua bucket's
    hashes (the same name would be a WRONGTYPE error)."""
    return redis_benchmark(clients, ["-r", str(keys), "CL.THROTTLE", "cell:__rand_int__", "1000000000", "60000000",
                                     "60", "1"], seconds)


def sqlite_bench(path, journal, sql, keys, seconds=None, cache_kib=None):
    extra = [str(cache_kib)] if cache_kib else []
    out = subprocess.run([SQLITE_DRIVER, path, SQLITE_EXT, journal, sql, str(keys), str(seconds or SECONDS)] + extra,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def median_cell(runs):
    """The medians of a cell's runs, and each run's calls/s in order (a ratio's range is
    taken run by run: the two cells of one repetition ran side by side)."""
    cell = {k: statistics.median(r[k] for r in runs) for k in ("calls_per_s", "p50_ms", "p99_ms")}
    return {**cell, "each": [r["calls_per_s"] for r in runs]}


def setup_postgres(keys):
    psql(f"DROP DATABASE IF EXISTS {DB}", db="postgres")
    psql(f"CREATE DATABASE {DB}", db="postgres")
    psql("CREATE EXTENSION pg_ratelimit")
    with open(os.path.join(ROOT, "bench", "pg_baseline.sql")) as f:
        psql(f.read())
    populate_postgres(keys)


def populate_postgres(keys):
    """Every key already has a row, as in steady state (a full bucket: same answers)."""
    psql("TRUNCATE ratelimit.rl_bucket, ratelimit.rl_budget, hw_bucket, counters")
    psql(f"INSERT INTO ratelimit.rl_bucket SELECT 'k' || g, 1000000000, 0, 0 FROM generate_series(1, {keys}) g")
    psql(f"INSERT INTO hw_bucket SELECT 'k' || g, 1000000000, 0 FROM generate_series(1, {keys}) g")
    psql(f"INSERT INTO counters SELECT 'k' || g, 0 FROM generate_series(1, {keys}) g")
    psql("VACUUM ANALYZE")
    psql("SELECT rl_take('flood', 1, 0.000001), hw_take('flood', 1, 0.000001)")  # drain the flood buckets


def run_matrix(cells):
    """cells: {name: thunk}; runs every thunk REPS times, interleaved; returns medians."""
    runs = {name: [] for name in cells}
    for rep in range(REPS):
        for name, thunk in cells.items():
            runs[name].append(thunk())
            print(f"  rep {rep + 1}/{REPS} {name}: {runs[name][-1]['calls_per_s']:.0f}/s", file=sys.stderr, flush=True)
    return {name: median_cell(r) for name, r in runs.items()}


MEMORY_KEYS = 1_000_000


def wal_bytes_per_call(script, buckets, calls=100_000, clients=8):
    """WAL written per call, from pg_current_wal_insert_lsn() around `calls` calls."""
    before = psql_value("SELECT pg_current_wal_insert_lsn()")
    pgbench(script, clients, KEYS, False, buckets, transactions=calls // clients)
    return float(psql_value(f"SELECT (pg_current_wal_insert_lsn() - '{before}'::pg_lsn) / {calls}"))


def backend_wal_bytes_per_call(buckets, calls=100_000):
    """WAL written by the calling backend alone (EXPLAIN (ANALYZE, WAL) counts only its own
    records, not the server's background ones) over `calls` takes in one statement."""
    out = subprocess.run(["psql", "-X", "-At", "-d", DB, "-c", f"SET pg_ratelimit.buckets = '{buckets}'", "-c",
                          "EXPLAIN (ANALYZE, WAL, FORMAT JSON) SELECT count(rl_take('k' || (g % 100000 + 1), "
                          f"{BIG})) FROM generate_series(1, {calls}) g"], check=True, capture_output=True, text=True).stdout
    plan = json.loads(out[out.index("["):])[0]["Plan"]
    return plan["WAL Bytes"] / calls


def memory_store_section():
    """The memory store (pg_ratelimit.buckets = 'memory') beside Redis, the table store,
    a bare UPDATE and SELECT 1, in one interleaved run; WAL bytes per call of both stores."""
    print("memory store: setup", file=sys.stderr)
    setup_postgres(KEYS)
    # every key of the largest working set already has a bucket, as in steady state
    subprocess.run(["psql", "-X", "-q", "-d", DB, "-c", "SET pg_ratelimit.buckets = 'memory'", "-c",
                    f"SELECT count(rl_take('k' || g, {BIG})) FROM generate_series(1, {MEMORY_KEYS}) g", "-c",
                    "SELECT rl_take('flood', 1, 0.000001)"], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(ROOT, "bench", "redis_bucket.lua")) as f:
        sha = redis("SCRIPT", "LOAD", f.read())
    redis("FLUSHALL")
    redis("EVALSHA", sha, "1", "flood", "1", "0.000001", "1")
    take = PG_SCRIPTS["rl_take"]
    matrix = {
        ("memory store", 8, "rl_take memory", False): lambda: pgbench(take, 8, KEYS, False, "memory"),
        ("memory store", 8, "rl_take table", False): lambda: pgbench(take, 8, KEYS, False),
        ("memory store", 8, "bare UPDATE", False): lambda: pgbench(PG_SCRIPTS["bare UPDATE"], 8, KEYS, False),
        ("memory store", 8, "SELECT 1", False): lambda: pgbench("SELECT 1;", 8, KEYS, False),
        ("memory store", 8, "rl_key (no statement)", False): lambda: pgbench("SELECT rl_key('u', :k::text);", 8, KEYS, False),
        ("memory store", 8, "Redis Lua", None): lambda: redis_bench(sha, 8, KEYS),
        ("memory store", 8, "redis-cell", None): lambda: redis_cell_bench(8, KEYS),
        ("memory store", 32, "rl_take memory", False): lambda: pgbench(take, 32, KEYS, False, "memory"),
        ("memory store", 32, "SELECT 1", False): lambda: pgbench("SELECT 1;", 32, KEYS, False),
        ("memory store", 32, "redis-cell", None): lambda: redis_cell_bench(32, KEYS),
        ("memory hot key", 8, "rl_take memory", False): lambda: pgbench(take, 8, 1, False, "memory"),
        ("memory refusal flood", 8, "rl_take memory", False):
            lambda: pgbench(FLOOD_SCRIPTS["rl_take"], 8, 1, False, "memory"),
        ("memory 1,000,000 keys", 8, "rl_take memory", False): lambda: pgbench(take, 8, MEMORY_KEYS, False, "memory"),
    }
    print(f"memory store: {len(matrix)} cells x {REPS} runs", file=sys.stderr)
    cells = run_matrix(matrix)
    wal = {"memory": wal_bytes_per_call(take, "memory"), "table": wal_bytes_per_call(take, "table"),
           "bare UPDATE": wal_bytes_per_call(PG_SCRIPTS["bare UPDATE"], "table"),
           "memory, calling backend": backend_wal_bytes_per_call("memory"),
           "table, calling backend": backend_wal_bytes_per_call("table")}
    stats = json.loads(psql_value("SELECT rl_memory_stats()"))
    return cells, wal, stats


# a billing period: a month from a customer's signup, in their zone (issue 57 wants a spend on
# it at no more than 1.1x a UTC month's cost)
ZONED_MONTH = "month from 31 09:00 in America/New_York"
KIND_SCRIPTS = {
    "rl_take": PG_SCRIPTS["rl_take"],
    "rl_window": "SELECT rl_window('k' || :k, 1000000000, 60);",
    "rl_acquire + rl_release": "SELECT rl_release('k' || :k, rl_acquire('k' || :k, 1000, 60) ->> 'lease');",
    "rl_charge": f"SELECT rl_charge('k' || :k, {BIG}, 1);",
    "rl_check (one bucket)": "SELECT rl_check('one', 'k' || :k);",
    "rl_spend (UTC month)": PG_SCRIPTS["rl_spend"],
    f"rl_spend ({ZONED_MONTH})": f"SELECT rl_spend('k' || :k, '{ZONED_MONTH}', 1000000000, 1);",
}
ONE_BUCKET_POLICY = json.dumps({"limits": [{"burst": 1e9, "refill_per_minute": 6e8}]})
# The key rl_check derives for subject 'k' || g and the policy's only limit (policy.rs).
# (U+0001 is chr(1) in PostgreSQL, char(1) in SQLite.)
POLICY_KEY_SQL = "{mark}(1) || '3:one:0:k' || g"
SQLITE_KIND_SQL = {
    "rl_take": f"SELECT rl_take(?1, {BIG})",
    "rl_window": "SELECT rl_window(?1, 1000000000, 60)",
    "rl_acquire + rl_release": "SELECT rl_release(?1, rl_acquire(?1, 1000, 60) ->> 'lease')",
    "rl_charge": f"SELECT rl_charge(?1, {BIG}, 1)",
    "rl_check (one bucket)": "SELECT rl_check('one', ?1)",
    "rl_spend (UTC month)": "SELECT rl_spend(?1, 'month', 1000000000, 1)",
    f"rl_spend ({ZONED_MONTH})": f"SELECT rl_spend(?1, '{ZONED_MONTH}', 1000000000, 1)",
}


def kinds_section():
    """Sliding windows, leases and charges next to rl_take: calls/s on both engines (table
    store, 100,000 keys, 8 PostgreSQL clients, one SQLite connection), and bytes per key
    of a window or a lease list by its number of entries."""
    print("kinds of limit: setup", file=sys.stderr)
    setup_postgres(KEYS)
    psql(f"SELECT rl_policy_set('one', '{ONE_BUCKET_POLICY}')")
    # every subject's bucket already exists, as every rl_take key's does (steady state)
    psql(f"INSERT INTO ratelimit.rl_bucket SELECT {POLICY_KEY_SQL.format(mark='chr')}, 1000000000, 0, 0 "
         f"FROM generate_series(1, {KEYS}) g")
    psql("VACUUM ANALYZE ratelimit.rl_bucket")
    matrix = {("postgres", 8, name, False): (lambda s=script: pgbench(s, 8, KEYS, False))
              for name, script in KIND_SCRIPTS.items()}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kinds.db")
        subprocess.run(["sqlite3", path, ".load " + SQLITE_EXT, "PRAGMA journal_mode=wal",
                        f"SELECT rl_policy_set('one', '{ONE_BUCKET_POLICY}')",
                        "WITH RECURSIVE n(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM n WHERE g < "
                        f"{KEYS}) INSERT INTO rl_bucket SELECT {POLICY_KEY_SQL.format(mark='char')}, 1000000000, 0, 0 FROM n"],
                       check=True, capture_output=True)
        for name, sql in SQLITE_KIND_SQL.items():
            matrix[("sqlite wal", 1, name, None)] = (lambda q=sql: sqlite_bench(path, "wal", q, KEYS))
        cells = run_matrix(matrix)
    sizes = {}
    # one entry (or lease) per ms from a present-day clock
    at = "1764500000000 + g"
    for kind, sql, counts in (("window", f"rl_window('size-{{n}}', 1000000000, 3600, 1, {at})", (1, 100, 10_000)),
                              ("lease", f"rl_acquire('size-{{n}}', 1000, 3600, {at})", (1, 100, 1_000))):
        for n in counts:
            # explicit clocks, which only a superuser may allow
            psql(f"SET pg_ratelimit.allow_explicit_clock = on; SELECT count({sql.format(n=n)}) FROM generate_series(1, {n}) g")
            text, stored = psql_value(f"SELECT octet_length(entries) || ' ' || pg_column_size(entries) FROM "
                                      f"ratelimit.rl_entries WHERE key = 'size-{n}' AND kind = '{kind}'").split()
            sizes[(kind, n)] = (int(text), int(stored))
    return cells, sizes


SQL_DB = "rl_bench_sql"
OWNED_DB, OWNER = "rl_bench_sql_owned", "rl_bench_owner"
EDITION_FUNCTIONS = ["rl_take", "rl_spend", "rl_window", "rl_check (one bucket)"]


def hot_key_section():
    """One key taken by every client (a global limit) beside 100,000 keys, for each store,
    8 and 32 clients, synchronous_commit on and off, in one interleaved run. A table-store
    take holds its row lock until its commit is flushed, so one key admits about one call
    per WAL flush; the memory store writes no WAL."""
    print("hot key: setup", file=sys.stderr)
    setup_postgres(KEYS)
    subprocess.run(["psql", "-X", "-q", "-d", DB, "-c", "SET pg_ratelimit.buckets = 'memory'", "-c",
                    f"SELECT count(rl_take('k' || g, {BIG})) FROM generate_series(1, {KEYS}) g"],
                   check=True, stdout=subprocess.DEVNULL)
    take = PG_SCRIPTS["rl_take"]
    matrix = {}
    for sync in (True, False):
        for store in ("table", "memory"):
            for clients in (8, 32):
                for keys in (1, KEYS):
                    matrix[(store, sync, clients, keys)] = \
                        (lambda b=store, y=sync, c=clients, k=keys: pgbench(take, c, k, y, b))
    return run_matrix(matrix)


def install_sql_edition(db, owner=None):
    """A fresh database with the SQL edition's plain script run in it: by the superuser, or
    by owner, a role that is none, owning the database (docs/managed-postgres.md's advice)."""
    psql(f"DROP DATABASE IF EXISTS {db}", db="postgres")
    if owner:
        psql(f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{owner}') THEN "
             f"CREATE ROLE {owner}; END IF; END $$", db="postgres")
    psql(f"CREATE DATABASE {db}" + (f" OWNER {owner}" if owner else ""), db="postgres")
    script = subprocess.run(["bash", os.path.join(ROOT, "scripts", "package.sh"), "--sql"], check=True,
                            capture_output=True, text=True).stdout.split()[0]
    subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", db, "-f", os.path.join(ROOT, script)],
                   check=True, capture_output=True,
                   env=dict(os.environ, PGOPTIONS=f"-c role={owner}") if owner else None)


def edition_setup(owned=False):
    """The native extension in DB and the SQL edition in SQL_DB, each with the one-bucket
    policy and a full bucket row for every key, theirs and the policy's; with owned, also
    the edition installed by a role that is no superuser, in OWNED_DB."""
    setup_postgres(KEYS)
    install_sql_edition(SQL_DB)
    if owned:
        install_sql_edition(OWNED_DB, OWNER)
    for db in (DB, SQL_DB) + ((OWNED_DB,) if owned else ()):
        psql(f"SELECT rl_policy_set('one', '{ONE_BUCKET_POLICY}')", db=db)
        psql(f"INSERT INTO ratelimit.rl_bucket SELECT 'k' || g, 1000000000, 0, 0 FROM generate_series(1, {KEYS}) g "
             "ON CONFLICT DO NOTHING", db=db)
        psql(f"INSERT INTO ratelimit.rl_bucket SELECT {POLICY_KEY_SQL.format(mark='chr')}, 1000000000, 0, 0 "
             f"FROM generate_series(1, {KEYS}) g", db=db)
        # a refusal flood's keys: buckets of 1 token a million minutes, taken empty; and a
        # policy of such a bucket, each subject's taken empty
        psql(f"SELECT count(rl_take('flood:' || g, 1, 0.000001)) FROM generate_series(1, {KEYS}) g", db=db)
        psql(f"SELECT rl_policy_set('tight', '{TIGHT_POLICY}')", db=db)
        psql(f"SELECT count(rl_check('tight', 'k' || g)) FROM generate_series(1, {KEYS}) g", db=db)
        psql("VACUUM ANALYZE", db=db)


TIGHT_POLICY = json.dumps({"limits": [{"burst": 1, "refill_per_minute": 0.000001}]})
CHECK_REFUSALS = "rl_check (refusal flood)"
FIRST_TOUCH = "rl_take (first touch)"
FIRST_TOUCH_KEYS = 2_000_000_000
REFUSAL_FLOOD = "rl_take (refusal flood)"


def edition_section():
    """The SQL edition (managed PostgreSQL) beside the native table store: the same calls on
    the same rows in databases of one cluster, 8 clients, synchronous_commit on and off; the
    edition installed by the superuser and by a role that is none owning its database (as on
    managed platforms). Steady-state keys (their rows exist), and rl_take on first-touch
    keys: drawn from FIRST_TOUCH_KEYS, so nearly every call is its key's first (each run
    adds its rows, alike in every database), and on keys whose buckets are empty (every call
    refused, nothing written): rl_take's, and rl_check's of a one-bucket policy (each refusal
    also recorded in the refused-subject summary, replacing an entry once it holds 64)."""
    print("SQL edition: setup", file=sys.stderr)
    edition_setup(owned=True)
    scripts = {"rl_spend": PG_SCRIPTS["rl_spend"], **KIND_SCRIPTS,
               FIRST_TOUCH: f"SELECT rl_take('new:' || :k, {BIG});",
               REFUSAL_FLOOD: "SELECT rl_take('flood:' || :k, 1, 0.000001);",
               CHECK_REFUSALS: "SELECT rl_check('tight', 'k' || :k);"}
    matrix = {}
    for sync in (True, False):
        for name in [EDITION_FUNCTIONS[0], FIRST_TOUCH, REFUSAL_FLOOD, *EDITION_FUNCTIONS[1:], CHECK_REFUSALS]:
            keys = FIRST_TOUCH_KEYS if name == FIRST_TOUCH else KEYS
            for edition, db in (("native", DB), ("sql", SQL_DB), ("sql owned", OWNED_DB)):
                matrix[(edition, name, sync)] = (lambda s=scripts[name], d=db, y=sync, k=keys: pgbench(s, 8, k, y, db=d))
    return run_matrix(matrix)


def instructions_section():
    """Instructions per call of the edition's targets, native and SQL edition, counted by
    callgrind on a copy of the cluster (bench/instructions.py): rows as edition_section's."""
    print("instructions: setup", file=sys.stderr)
    edition_setup(owned=True)
    psql("CHECKPOINT")
    pg_bin = os.environ.get("RL_PG_BIN", "/usr/lib/postgresql/15/bin")
    data = os.path.join(os.environ["RL_PG_DIR"], "data")

    def as_postgres(*cmd):
        subprocess.run((["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []) + list(cmd),
                       check=True, stdout=subprocess.DEVNULL)

    cells = {(edition, name): (db, KIND_SCRIPTS[name]) for name in ("rl_take", "rl_check (one bucket)")
             for edition, db in (("native", DB), ("sql", SQL_DB), ("sql owned", OWNED_DB))}
    print(f"instructions: {len(cells)} cells under callgrind", file=sys.stderr)
    return instructions.measure(
        pg_bin, data, lambda: as_postgres(os.path.join(pg_bin, "pg_ctl"), "-D", data, "-w", "stop", "-m", "fast"),
        lambda: subprocess.run(["bash", os.path.join(ROOT, "scripts", "pg_cluster.sh"), "start"], check=True,
                               stdout=subprocess.DEVNULL), cells, KEYS)


REFUSED_SUBJECTS = 256


def refused_section():
    """What the refused-subject summary costs a flood of refusals: rl_check refusing under a
    policy that has a summary slot beside the same flood under a policy that has none (the
    128 slots taken by other policies first), in one interleaved run, for both stores, 8
    clients. 256 subjects, more than the summary's 64 entries, so most refusals replace an
    entry (its dearest path)."""
    print("refused summary: setup", file=sys.stderr)
    setup_postgres(KEYS)
    tight = json.dumps({"limits": [{"burst": 1, "refill_per_minute": 0.000001}]})
    subjects = f"generate_series(1, {REFUSED_SUBJECTS}) s, generate_series(1, 2) twice"
    psql("SELECT rl_stats_reset()")
    for store in ("table", "memory"):
        psql(f"SET pg_ratelimit.buckets = '{store}'; SELECT rl_policy_set('with_{store}', '{tight}'); "
             f"SELECT count(rl_check('with_{store}', 's' || s)) FROM {subjects}")
    psql(f"SELECT rl_policy_set('fill' || p, '{tight}') FROM generate_series(1, 126) p")
    psql("SELECT count(rl_check('fill' || p, 'x')) FROM generate_series(1, 126) p, generate_series(1, 2) twice")
    for store in ("table", "memory"):
        psql(f"SET pg_ratelimit.buckets = '{store}'; SELECT rl_policy_set('without_{store}', '{tight}'); "
             f"SELECT count(rl_check('without_{store}', 's' || s)) FROM {subjects}")
    listed = psql_value("SELECT string_agg(DISTINCT policy, ' ') FROM rl_refused WHERE policy LIKE 'with%'")
    assert listed == "with_memory with_table", f"only the policies with a slot have a summary: {listed}"
    matrix = {}
    for store in ("table", "memory"):
        for summary in ("with", "without"):
            script = f"\\set s random(1, {REFUSED_SUBJECTS})\nSELECT rl_check('{summary}_{store}', 's' || :s);"
            matrix[(store, summary, "8 clients")] = (lambda sc=script, b=store: pgbench(sc, 8, KEYS, True, b))
            matrix[(store, summary, "one statement")] = (lambda p=f"{summary}_{store}", b=store: refusals_in_one_statement(p, b))
    cells = run_matrix(matrix)
    # the summary's own work, apart from the noise of whole calls
    record_ns = float(subprocess.run(["cargo", "run", "--release", "-q", "-p", "ratelimit_core", "--example",
                                      "refused_record"], check=True, capture_output=True, text=True, cwd=ROOT).stdout)
    return cells, record_ns


RLS_CLIENTS = (8, 32)
# ratelimit-rls builds in a target folder of its own (scripts/package.sh says why)
RLS_TARGET = os.path.join(ROOT, "target", "rls")


NEAR_BUDGETS = int(os.environ.get("RL_BENCH_NEAR_BUDGETS", "1000000"))


def sqlite_with_tables(name):
    """A new SQLite file in WAL mode with the extension loaded and its tables made: (path,
    connection in autocommit)."""
    import sqlite3

    path = os.path.join(tempfile.mkdtemp(prefix=f"rl_{name}_"), f"{name}.db")
    lite = sqlite3.connect(path, isolation_level=None)
    lite.enable_load_extension(True)
    lite.load_extension(SQLITE_EXT)
    lite.execute("PRAGMA journal_mode = WAL")
    lite.execute("SELECT rl_spend('made', 'day', 1, 1)")  # the tables
    return path, lite


def budgets_near_section():
    """What rl_budgets_near costs over NEAR_BUDGETS budget rows (a month's, shares of the quota
    spread evenly from 0 to 0.999): its call (the 100 largest shares of the 1 % at 0.99 or
    more) beside a plain count of the same table, the least any read of every row costs, on
    the native extension, the SQL edition and SQLite; one connection each, the calls
    interleaved, medians of RL_BENCH_REPS x 5 calls."""
    import psycopg2

    print(f"budgets near their quota: {NEAR_BUDGETS:,} rows in each engine", file=sys.stderr)
    setup_postgres(KEYS)
    install_sql_edition(SQL_DB)
    fill = ("INSERT INTO ratelimit.rl_budget (key, period, used, resets_at, quota) "
            f"SELECT 'team:' || g, 'month', (g % 1000) * 1000000, 253402300799999, 1000000000 "
            f"FROM generate_series(1, {NEAR_BUDGETS}) AS g")
    for db in (DB, SQL_DB):
        psql(fill, db=db)
        psql("VACUUM ANALYZE ratelimit.rl_budget", db=db)
    path, lite = sqlite_with_tables("near")
    lite.execute("DELETE FROM rl_budget")
    lite.execute("WITH RECURSIVE n(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM n WHERE g < ?) "
                 "INSERT INTO rl_budget (key, period, used, resets_at, quota) "
                 "SELECT 'team:' || g, 'month', (g % 1000) * 1000000, 253402300799999, 1000000000 FROM n",
                 (NEAR_BUDGETS,))
    engines = {"native": psycopg2.connect(dbname=DB), "SQL edition": psycopg2.connect(dbname=SQL_DB), "SQLite": lite}
    queries = {"rl_budgets_near(0.99)": "SELECT rl_budgets_near(0.99)",
               "count(*)": "SELECT count(*) FROM {table}"}
    times = {(engine, query): [] for engine in engines for query in queries}
    for _ in range(REPS * 5):
        for engine, conn in engines.items():
            table = "main.rl_budget" if engine == "SQLite" else "ratelimit.rl_budget"
            for query, sql in queries.items():
                cur = conn.cursor()
                start = time.perf_counter()
                cur.execute(sql.format(table=table))
                answer = cur.fetchone()[0]
                times[(engine, query)].append(time.perf_counter() - start)
                if query != "count(*)":
                    listed = json.loads(answer) if isinstance(answer, str) else answer
                    assert len(listed["budgets"]) == 100, listed
    for conn in engines.values():
        conn.close()
    shutil.rmtree(os.path.dirname(path))
    return {k: statistics.median(v) * 1000 for k, v in times.items()}


USAGE_KEYS = int(os.environ.get("RL_BENCH_USAGE_KEYS", "1000000"))
# twelve ended months of 2025 for every key, as the sweep keeps them
USAGE_MONTHS = [(calendar.timegm((2025, m, 1, 0, 0, 0)) * 1000, calendar.timegm((2025 + m // 12, m % 12 + 1, 1, 0, 0, 0)) * 1000)
                for m in range(1, 13)]


def usage_section():
    """What reading a year of one key's kept usage costs among USAGE_KEYS keys that each have
    twelve ended months (12 rows a key): rl_usage(key, from, to) beside the plain SELECT of
    the same rows by the table's primary key, the least such a read costs, on the native
    extension, the SQL edition and SQLite; a random key a call, one connection each, the
    calls interleaved, medians of RL_BENCH_REPS x 100 calls."""
    import random

    import psycopg2

    print(f"usage kept for invoicing: {USAGE_KEYS:,} keys x 12 months in each engine", file=sys.stderr)
    setup_postgres(KEYS)
    install_sql_edition(SQL_DB)
    months = ", ".join(f"({s}, {e})" for s, e in USAGE_MONTHS)
    fill = ("INSERT INTO ratelimit.rl_usage (key, period, starts_at, ends_at, used, quota) "
            "SELECT 'cust:' || g, 'month', m.s, m.e, (g % 1000) * 1000000, 1000000000 "
            f"FROM generate_series(1, {USAGE_KEYS}) AS g, (VALUES {months}) AS m(s, e)")
    for db in (DB, SQL_DB):
        psql("TRUNCATE ratelimit.rl_usage", db=db)
        psql(fill, db=db)
        psql("VACUUM ANALYZE ratelimit.rl_usage", db=db)
    path, lite = sqlite_with_tables("usage")
    lite.execute("BEGIN")
    lite.executemany("INSERT INTO rl_usage (key, period, starts_at, ends_at, used, quota) "
                     "WITH RECURSIVE n(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM n WHERE g < ?) "
                     "SELECT 'cust:' || g, 'month', ?, ?, (g % 1000) * 1000000, 1000000000 FROM n",
                     [(USAGE_KEYS, s, e) for s, e in USAGE_MONTHS])
    lite.execute("COMMIT")
    lite.execute("ANALYZE")
    year = (USAGE_MONTHS[0][0], USAGE_MONTHS[-1][1])
    engines = {"native": psycopg2.connect(dbname=DB), "SQL edition": psycopg2.connect(dbname=SQL_DB), "SQLite": lite}
    queries = {"rl_usage(key, a year)": "SELECT rl_usage({p}, {p}, {p})",
               "SELECT of its rows": "SELECT count(*) FROM (SELECT period, starts_at, ends_at, used, quota FROM {table} "
                                     "WHERE key = {p} AND ends_at > {p} AND ends_at <= {p} ORDER BY ends_at, period) AS r"}
    times = {(engine, query): [] for engine in engines for query in queries}
    draw = random.Random(58)
    for _ in range(REPS * 100):
        key = f"cust:{draw.randint(1, USAGE_KEYS)}"
        for engine, conn in engines.items():
            table, p = ("main.rl_usage", "?") if engine == "SQLite" else ("ratelimit.rl_usage", "%s")
            for query, sql in queries.items():
                cur = conn.cursor()
                start = time.perf_counter()
                cur.execute(sql.format(table=table, p=p), (key, *year))
                answer = cur.fetchone()[0]
                times[(engine, query)].append(time.perf_counter() - start)
                if query.startswith("rl_usage"):
                    read = json.loads(answer) if isinstance(answer, str) else answer
                    assert len(read["periods"]) == 12, read
                else:
                    assert answer == 12, answer
    for conn in engines.values():
        conn.close()
    shutil.rmtree(os.path.dirname(path))
    for db in (DB, SQL_DB):
        psql("TRUNCATE ratelimit.rl_usage", db=db)
    return {k: statistics.median(v) * 1000 for k, v in times.items()}


def rls_section():
    """ratelimit-rls against the same statement over SQL: one Rust client program
    (rls/examples/rls_load.rs) asks the same decisions both ways, each client its own
    connection, one call at a time; 1 and 3 descriptors (a user's bucket; the user's, the
    tenant's and a global one), 100,000 users, every call admitted. Two servers: counting as
    the reference does (the default: rl_charge_all, concurrent calls' charges in one
    statement) and with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT (rl_take_all a call)."""
    print("ratelimit-rls: build and setup", file=sys.stderr)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "ratelimit-rls", "--example", "rls_load", "--bin",
                    "ratelimit-rls"], check=True, cwd=ROOT, env=dict(os.environ, CARGO_TARGET_DIR=RLS_TARGET))
    setup_postgres(KEYS)
    host, port = os.environ["PGHOST"], os.environ.get("PGPORT", "5432")
    url = f"host={host} port={port} user={os.environ.get('PGUSER', 'postgres')} dbname={DB}"
    servers = {}
    for mode, grpc, http, env in (("reference", "127.0.0.1:58081", "127.0.0.1:58080", {}),
                                  ("stop", "127.0.0.1:58083", "127.0.0.1:58082",
                                   {"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"})):
        # one worker thread: the server shares 2 cores with PostgreSQL and the load
        servers[mode] = (grpc, subprocess.Popen(
            [os.path.join(RLS_TARGET, "release", "ratelimit-rls"), "--config", os.path.join(ROOT, "bench", "rls_bench.yaml"),
             "--database", url, "--grpc", grpc, "--http", http, "--pool", str(max(RLS_CLIENTS)), "--threads", "1",
             # throughput, not the deadline: 32 clients on 2 cores queue past 40 ms
             "--statement-timeout-ms", "5000"], stderr=subprocess.DEVNULL, env=dict(os.environ, **env)))
    try:
        time.sleep(1)
        rls_load("grpc", servers["reference"][0], 3, 4)  # warm: the rows of the tenants and the global bucket made
        rls_load("sql", url, 3, 4)
        matrix = {}
        for clients in RLS_CLIENTS:
            for n in (1, 3):
                for mode, function in (("reference", "rl_charge_all"), ("stop", "rl_take_all")):
                    matrix[(clients, n, f"ShouldRateLimit ({mode})")] = (
                        lambda t=servers[mode][0], c=clients, d=n: rls_load("grpc", t, d, c))
                    matrix[(clients, n, f"{function} over SQL")] = (
                        lambda f=function, c=clients, d=n: rls_load("sql", url, d, c, function=f))
            # the gRPC hop alone: a domain the server does not know, answered without the database
            matrix[(clients, 0, "ShouldRateLimit, no database")] = (
                lambda c=clients: rls_load("grpc", servers["reference"][0], 1, c, "none"))
        return run_matrix(matrix)
    finally:
        for _, server in servers.values():
            server.terminate()
            server.wait(timeout=30)


def rls_load(mode, target, descriptors, clients, domain="bench", function="rl_charge_all"):
    load = os.path.join(RLS_TARGET, "release", "examples", "rls_load")
    return json.loads(subprocess.run([load, mode, target, str(descriptors), str(clients), str(SECONDS)], check=True,
                                     capture_output=True, text=True,
                                     env=dict(os.environ, RLS_LOAD_DOMAIN=domain, RLS_LOAD_FUNCTION=function)).stdout)


def refusals_in_one_statement(policy, buckets, calls=100_000):
    """Refusals per second of one backend calling rl_check `calls` times in one statement (no
    client round trips or scheduling between calls: the steadiest view of a call's own cost)."""
    out = subprocess.run(["psql", "-X", "-At", "-d", DB, "-c", f"SET pg_ratelimit.buckets = '{buckets}'", "-c",
                          f"EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(rl_check('{policy}', 's' || (g % {REFUSED_SUBJECTS} + 1))) "
                          f"FROM generate_series(1, {calls}) g"], check=True, capture_output=True, text=True).stdout
    seconds = json.loads(out[out.index("["):])[0]["Execution Time"] / 1000
    return {"calls_per_s": calls / seconds, "p50_ms": 1000 * seconds / calls, "p99_ms": 1000 * seconds / calls}


BIG_KEYS = int(os.environ.get("RL_BENCH_BIG_KEYS", "10000000"))
BIG_DB = "rl_bench_big"
# rl_take's answer to every admitted call of the runs below, as a constant: what returning
# the same jsonb costs with no call at all (the ceiling of any jsonb-answering function)
CONSTANT_ANSWER = ('SELECT \'{"limit": 1000000000, "admitted": true, "remaining": 999999999, "exceeds_limit": false, '
                   '"refill_seconds": 100, "retry_after_ms": 0, "reset_after_seconds": 1, "retry_after_seconds": 0}\'::jsonb;')
# the heap write, off by default since 0.4.0: the rows named "heap write" measure it; the
# rows named "rl_take table" measure the default, the guarded UPDATE
DIRECT_WRITES = "-c pg_ratelimit.direct_writes=on"
FIRST_TOUCH_UPSERT = "INSERT INTO counters VALUES ('new:' || :k, 1) ON CONFLICT (k) DO UPDATE SET n = counters.n + 1;"


def fill_database(db, keys):
    """rl_bucket and counters with a row for each of `keys` keys, vacuumed and read into
    shared_buffers (which holds every table of the run, so none evicts another)."""
    psql(f"DROP DATABASE IF EXISTS {db}", db="postgres")
    psql(f"CREATE DATABASE {db}", db="postgres")
    psql("CREATE EXTENSION pg_ratelimit; CREATE EXTENSION pg_prewarm", db=db)
    with open(os.path.join(ROOT, "bench", "pg_baseline.sql")) as f:
        psql(f.read(), db=db)
    psql(f"INSERT INTO ratelimit.rl_bucket SELECT 'k' || g, 1000000000, 0, 0 FROM generate_series(1, {keys}) g", db=db)
    psql(f"INSERT INTO counters SELECT 'k' || g, 0 FROM generate_series(1, {keys}) g", db=db)
    psql("VACUUM ANALYZE", db=db)
    psql("SELECT pg_prewarm(c) FROM unnest(ARRAY['ratelimit.rl_bucket', 'ratelimit.rl_bucket_pkey', 'counters', "
         "'counters_pkey']::regclass[]) c", db=db)
    # every key also has a memory-store bucket, as in steady state
    subprocess.run(["psql", "-X", "-q", "-d", db, "-c", "SET pg_ratelimit.buckets = 'memory'", "-c",
                    f"SELECT count(rl_take('k' || g, {BIG})) FROM generate_series(1, {keys}) g"], check=True,
                   stdout=subprocess.DEVNULL)


def targets_section():
    """Every ratio of the speed targets from one interleaved run: the memory store beside
    redis-cell and SELECT 1, the table store (its guarded UPDATE, the default, and its heap
    write) beside a bare UPDATE, and on first-touch keys beside a bare INSERT ... ON
    CONFLICT, SQLite beside a bare UPSERT, and 10,000,000 keys beside 100,000
    (two databases of one cluster whose tables all fit in shared_buffers). Then a profile
    of each system: where the microseconds of a call go."""
    print(f"targets: setup (100,000 and {BIG_KEYS:,} keys)", file=sys.stderr)
    fill_database(DB, KEYS)
    fill_database(BIG_DB, BIG_KEYS)
    psql("CHECKPOINT", db="postgres")
    take, update = PG_SCRIPTS["rl_take"], PG_SCRIPTS["bare UPDATE"]
    # after the checkpoint, the first change of each page writes it whole to the WAL: touch
    # most pages of the big tables before measuring
    for script in (take, update):
        pgbench(script, 8, BIG_KEYS, False, db=BIG_DB, seconds=20)
    tmp = tempfile.mkdtemp()
    sqlite_path = os.path.join(tmp, "targets.db")
    subprocess.run(["sqlite3", sqlite_path, ".load " + SQLITE_EXT, "PRAGMA journal_mode=wal",
                    "CREATE TABLE up(k TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID", "BEGIN IMMEDIATE",
                    f"WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < {KEYS}) "
                    "INSERT INTO up SELECT 'k' || i, 0 FROM g",
                    f"SELECT count(rl_take('k' || value, {BIG})) FROM generate_series(1, {KEYS})", "COMMIT"],
                   check=True, capture_output=True)
    sqlite_take, sqlite_upsert = (f"SELECT rl_take(?1, {BIG})",
                                  "INSERT INTO up(k, n) VALUES (?1, 1) ON CONFLICT(k) DO UPDATE SET n = n + 1")
    loads = {
        ("memory", 8, "rl_take memory"): lambda **kw: pgbench(take, 8, KEYS, False, "memory", **kw),
        ("memory", 32, "rl_take memory"): lambda **kw: pgbench(take, 32, KEYS, False, "memory", **kw),
        ("memory", 8, "redis-cell"): lambda **kw: redis_cell_bench(8, KEYS, **kw),
        ("memory", 32, "redis-cell"): lambda **kw: redis_cell_bench(32, KEYS, **kw),
        ("memory", 8, "SELECT 1"): lambda **kw: pgbench("SELECT 1;", 8, KEYS, False, **kw),
        ("memory", 32, "SELECT 1"): lambda **kw: pgbench("SELECT 1;", 32, KEYS, False, **kw),
        ("memory", 8, "rl_take's answer as a constant"): lambda **kw: pgbench(CONSTANT_ANSWER, 8, KEYS, False, **kw),
        ("memory, big", 8, "rl_take memory"): lambda **kw: pgbench(take, 8, BIG_KEYS, False, "memory", db=BIG_DB, **kw),
        ("table, big", 8, "rl_take table, sync off"): lambda **kw: pgbench(take, 8, BIG_KEYS, False, db=BIG_DB, **kw),
        ("table, big", 8, "bare UPDATE, sync off"): lambda **kw: pgbench(update, 8, BIG_KEYS, False, db=BIG_DB, **kw),
        ("sqlite", 1, "rl_take"): lambda **kw: sqlite_bench(sqlite_path, "wal", sqlite_take, KEYS, **kw),
        ("sqlite", 1, "bare UPSERT"): lambda **kw: sqlite_bench(sqlite_path, "wal", sqlite_upsert, KEYS, **kw),
        # the same with a page cache that holds both tables (rl_bucket's rows are three
        # numbers where the UPSERT's are one: 3.3 MB against 1.3 MB at 100,000 keys, and
        # SQLite's default cache is 2 MB)
        ("sqlite", 1, "rl_take, 16 MB page cache"):
            lambda **kw: sqlite_bench(sqlite_path, "wal", sqlite_take, KEYS, cache_kib=16000, **kw),
        ("sqlite", 1, "bare UPSERT, 16 MB page cache"):
            lambda **kw: sqlite_bench(sqlite_path, "wal", sqlite_upsert, KEYS, cache_kib=16000, **kw),
    }
    for sync in (False, True):
        label = "on" if sync else "off"
        # the table store as installed: the guarded UPDATE (direct_writes off by default)
        loads[("table", 8, f"rl_take table, sync {label}")] = lambda y=sync, **kw: pgbench(take, 8, KEYS, y, **kw)
        loads[("table", 8, f"rl_take table, heap write, sync {label}")] = \
            lambda y=sync, **kw: pgbench(take, 8, KEYS, y, options=DIRECT_WRITES, **kw)
        loads[("table", 8, f"bare UPDATE, sync {label}")] = lambda y=sync, **kw: pgbench(update, 8, KEYS, y, **kw)
    # first touch: keys drawn from FIRST_TOUCH_KEYS, so nearly every call is its key's first
    # (each run adds its rows, as many to either table); the baseline inserts as bare
    loads[("first touch", 8, "rl_take table, sync off")] = \
        lambda **kw: pgbench(f"SELECT rl_take('new:' || :k, {BIG});", 8, FIRST_TOUCH_KEYS, False, **kw)
    loads[("first touch", 8, "bare INSERT ... ON CONFLICT, sync off")] = \
        lambda **kw: pgbench(FIRST_TOUCH_UPSERT, 8, FIRST_TOUCH_KEYS, False, **kw)
    print(f"targets: {len(loads)} cells x {REPS} runs", file=sys.stderr)
    cells = run_matrix({key: load for key, load in loads.items()})
    profiles = {}
    if call_profile.available():
        for key in PROFILED:
            print(f"targets: profile of {key[2]} ({key[1]} clients)", file=sys.stderr)
            shares = call_profile.profile(lambda k=key: loads[k](seconds=4))
            profiles[key] = call_profile.microseconds(shares, cells[key]["calls_per_s"])
    shutil.rmtree(tmp, ignore_errors=True)
    stats = json.loads(psql_value("SELECT rl_memory_stats()"))
    return cells, profiles, stats


def compact_section():
    """The compact answer (rl_take_compact) beside rl_take on the memory store, redis-cell,
    rl_take's answer as a constant jsonb and SELECT 1, in one interleaved run: what a caller
    that needs only the decision and the headers' numbers gains by not taking jsonb."""
    print("compact: setup", file=sys.stderr)
    setup_postgres(KEYS)
    subprocess.run(["psql", "-X", "-q", "-d", DB, "-c", "SET pg_ratelimit.buckets = 'memory'", "-c",
                    f"SELECT count(rl_take('k' || g, {BIG})) FROM generate_series(1, {KEYS}) g"],
                   check=True, stdout=subprocess.DEVNULL)
    matrix = {}
    for clients in (8, 32):
        matrix[(clients, "rl_take (memory)")] = lambda c=clients: pgbench(PG_SCRIPTS["rl_take"], c, KEYS, False, "memory")
        matrix[(clients, "rl_take_compact (memory)")] = lambda c=clients: pgbench(COMPACT_TAKE, c, KEYS, False, "memory")
        matrix[(clients, "redis-cell")] = lambda c=clients: redis_cell_bench(c, KEYS)
        matrix[(clients, "SELECT 1")] = lambda c=clients: pgbench("SELECT 1;", c, KEYS, False)
    matrix[(8, "rl_take's answer as a constant jsonb")] = lambda: pgbench(CONSTANT_ANSWER, 8, KEYS, False)
    matrix[(8, "rl_take_compact's answer as a constant text")] = lambda: pgbench(CONSTANT_COMPACT, 8, KEYS, False)
    print(f"compact: {len(matrix)} cells x {REPS} runs", file=sys.stderr)
    return run_matrix(matrix)


COMPACT_TAKE = f"SELECT rl_take_compact('k' || :k, {BIG});"
CONSTANT_COMPACT = "SELECT '1 1000000000 999999999 1 0'::text;"


# The systems whose microseconds the README breaks down.
PROFILED = [("memory", 8, "SELECT 1"), ("memory", 8, "rl_take's answer as a constant"),
            ("memory", 8, "rl_take memory"), ("memory", 8, "redis-cell"),
            ("table", 8, "rl_take table, sync off"), ("table", 8, "rl_take table, heap write, sync off"),
            ("table", 8, "bare UPDATE, sync off"), ("sqlite", 1, "rl_take"), ("sqlite", 1, "bare UPSERT")]


def main():
    os.makedirs(RESULTS, exist_ok=True)
    import report  # noqa: E402  (bench/report.py)

    if os.environ.get("RL_BENCH_ONLY") == "kinds":
        report.write_kinds(*kinds_section())
        return
    if os.environ.get("RL_BENCH_ONLY") == "hotkey":
        report.write_hot_key(hot_key_section())
        return
    if os.environ.get("RL_BENCH_ONLY") == "refused":
        report.write_refused(*refused_section())
        return
    if os.environ.get("RL_BENCH_ONLY") == "near":
        report.write_budgets_near(budgets_near_section())
        return
    if os.environ.get("RL_BENCH_ONLY") == "usage":
        report.write_usage(usage_section())
        return
    if os.environ.get("RL_BENCH_ONLY") == "rls":
        report.write_rls(rls_section())
        return
    if os.environ.get("RL_BENCH_ONLY") == "edition":
        report.write_edition(edition_section())
        return
    if os.environ.get("RL_BENCH_ONLY") == "instructions":
        report.write_instructions(instructions_section())
        return
    if os.environ.get("RL_BENCH_ONLY") == "compact":
        report.write_compact(compact_section())
        return
    if os.environ.get("RL_BENCH_ONLY") == "targets":
        report.write_targets(*targets_section())
        return
    memory_cells, wal, stats = memory_store_section()
    report.write_memory_store(memory_cells, wal, stats)
    with open(os.path.join(RESULTS, "memory_store.json"), "w") as f:
        json.dump({"cells": [[list(k), v] for k, v in memory_cells.items()], "wal_bytes_per_call": wal,
                   "rl_memory_stats": stats}, f, indent=1)
    if os.environ.get("RL_BENCH_ONLY") == "memory":
        return
    cells = {}
    print("PostgreSQL setup", file=sys.stderr)
    setup_postgres(KEYS)
    with open(os.path.join(ROOT, "bench", "redis_bucket.lua")) as f:
        sha = redis("SCRIPT", "LOAD", f.read())
    redis("FLUSHALL")
    redis("EVALSHA", sha, "1", "flood", "1", "0.000001", "1")

    matrix = {}
    for clients in (1, 8, 32):
        for sync in (True, False):
            for system, script in PG_SCRIPTS.items():
                if system == "SELECT 1" and not sync:
                    continue
                matrix[("uniform", clients, system, sync)] = (lambda s=script, c=clients, y=sync: pgbench(s, c, KEYS, y))
        matrix[("uniform", clients, "Redis Lua", None)] = (lambda c=clients: redis_bench(sha, c, KEYS))
    for clients in (8, 32):
        for sync in (True, False):
            for system in ("rl_take", "hand-written SQL", "bare UPDATE"):
                matrix[("hot key", clients, system, sync)] = (lambda s=PG_SCRIPTS[system], c=clients, y=sync: pgbench(s, c, 1, y))
        matrix[("hot key", clients, "Redis Lua", None)] = (lambda c=clients: redis_bench(sha, c, 1))
    for system, script in FLOOD_SCRIPTS.items():
        matrix[("refusal flood", 8, system, True)] = (lambda s=script: pgbench(s, 8, 1, True))
    matrix[("refusal flood", 8, "Redis Lua", None)] = lambda: redis_bench(sha, 8, 1, flood=True)
    print(f"PostgreSQL and Redis: {len(matrix)} cells x {REPS} runs", file=sys.stderr)
    cells.update(run_matrix(matrix))

    sizes = {}
    sizes["PostgreSQL rl_bucket"] = int(psql_value("SELECT pg_total_relation_size('ratelimit.rl_bucket') / count(*) FROM ratelimit.rl_bucket"))
    sizes["PostgreSQL hand-written hw_bucket"] = int(psql_value("SELECT pg_total_relation_size('hw_bucket') / count(*) FROM hw_bucket"))
    sample = redis("RANDOMKEY")
    sizes["Redis hash (memory, not disk)"] = int(redis("MEMORY", "USAGE", sample) or 0) if sample else 0

    for scale in SCALES:
        print(f"PostgreSQL with {scale:,} keys", file=sys.stderr)
        populate_postgres(scale)
        scaled = {("keys", scale, system, True): (lambda s=PG_SCRIPTS[system], n=scale: pgbench(s, 8, n, True))
                  for system in ("rl_take", "hand-written SQL", "bare UPDATE")}
        cells.update(run_matrix(scaled))

    with tempfile.TemporaryDirectory() as tmp:
        sqlite_cells = {}
        for journal in ("wal", "delete"):
            path = os.path.join(tmp, f"{journal}.db")
            subprocess.run(["sqlite3", path, ".load " + SQLITE_EXT, f"PRAGMA journal_mode={journal}",
                            "CREATE TABLE up(k TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID", "BEGIN IMMEDIATE",
                            f"WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < {KEYS}) "
                            "INSERT INTO up SELECT 'k' || i, 0 FROM g",
                            f"SELECT count(rl_take('k' || value, 1000000000, 600000000)) FROM generate_series(1, {KEYS})",
                            "COMMIT"],
                           check=True, capture_output=True)
            for system, sql in (("rl_take", f"SELECT rl_take(?1, {BIG})"),
                                ("bare UPSERT", "INSERT INTO up(k, n) VALUES (?1, 1) ON CONFLICT(k) DO UPDATE SET n = n + 1"),
                                ("SELECT 1", "SELECT 1")):
                sqlite_cells[("sqlite " + journal, 1, system, None)] = (lambda p=path, j=journal, q=sql: sqlite_bench(p, j, q, KEYS))
        print("SQLite", file=sys.stderr)
        cells.update(run_matrix(sqlite_cells))
        path = os.path.join(tmp, "wal.db")
        out = subprocess.run(["sqlite3", path, "SELECT sum(pgsize), (SELECT count(*) FROM rl_bucket) FROM dbstat WHERE name LIKE 'rl_bucket%'"],
                             capture_output=True, text=True).stdout.strip()
        if "|" in out:
            total, rows = (int(x) for x in out.split("|"))
            sizes["SQLite rl_bucket"] = total // max(rows, 1)

    with open(os.path.join(RESULTS, "results.json"), "w") as f:
        json.dump({"cells": [[list(k), v] for k, v in cells.items()], "sizes": sizes}, f, indent=1)
    report.write(cells, sizes)
    report.write_kinds(*kinds_section())
    report.write_targets(*targets_section())


if __name__ == "__main__":
    main()
