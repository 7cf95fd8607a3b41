"""pg_ratelimit on a Citus cluster (a coordinator and two workers, scripts/citus.sh), run
by scripts/test_citus.sh: the README's distribution block, the conformance list through
the coordinator equal to the same node undistributed, delegation to the worker that owns
the key, exact totals under concurrency, rl_take_all all or nothing across workers, a
worker restart, and the one-node privilege and search_path tests through the coordinator.
Skipped unless RL_CITUS=1 (with PGHOST/PGPORT/PGDATABASE naming the coordinator)."""
import json
import os
import re
import subprocess

import pytest

from conftest import ROOT, PgEngine, one, pg_connect, run_sessions

psycopg2 = pytest.importorskip("psycopg2")
pytestmark = pytest.mark.skipif(os.environ.get("RL_CITUS") != "1", reason="needs the Citus cluster (scripts/test_citus.sh)")

DB = os.environ.get("PGDATABASE", "rl")
PG_BIN = os.environ.get("RL_PG_BIN", "/usr/lib/postgresql/15/bin")
TABLES = "ratelimit.rl_bucket, ratelimit.rl_budget, ratelimit.rl_entries, ratelimit.rl_policy, ratelimit.rl_usage, ratelimit.rl_setting"


def distribution_block():
    """The SQL block under "More than one server" of docs/guides/operations.md."""
    with open(os.path.join(ROOT, "docs", "guides", "operations.md")) as f:
        readme = f.read()
    section = readme[readme.index("## More than one server"):]
    return re.search(r"```plpgsql\n(.*?)```", section, re.S).group(1)


def distributed(conn):
    return one(conn, "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'ratelimit.%%'")


@pytest.fixture(scope="module")
def coordinator():
    """The coordinator of a fresh cluster with pg_ratelimit, its state on the coordinator alone."""
    conn = pg_connect(DB)
    with conn.cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS pg_ratelimit")
    if distributed(conn):
        pytest.fail("tests/test_citus.py starts from an undistributed cluster: run bash scripts/test_citus.sh")
    yield conn
    conn.close()


@pytest.fixture(scope="module")
def cluster(coordinator):
    """The coordinator after the README's block: tables sharded, calls delegated."""
    if not distributed(coordinator):
        with coordinator.cursor() as cur:
            cur.execute(distribution_block())
    assert distributed(coordinator) == 3
    return coordinator


def port_of(conn, key):
    """The port of the worker that holds `key`'s bucket."""
    return one(conn, "SELECT nodeport FROM pg_dist_shard_placement "
                     "WHERE shardid = get_shard_id_for_distribution_column('ratelimit.rl_bucket', %s)", (key,))


def fresh(conn):
    with conn.cursor() as cur:
        cur.execute(f"TRUNCATE {TABLES}")


DELEGATED = ("rl_take", "rl_peek", "rl_refund", "rl_charge", "rl_spend", "rl_budget", "rl_refund_budget",
             "rl_charge_budget")


def test_the_conformance_list_answers_alike_on_one_node_and_sharded(coordinator):
    import test_conformance

    steps = test_conformance.STEPS
    fresh(coordinator)
    single = test_conformance.run(PgEngine(coordinator, "one node"))
    with coordinator.cursor() as cur:
        cur.execute(distribution_block())
    fresh(coordinator)
    # every step, NULL keys included (citus_guard.rs and the patch keep them from crashing Citus)
    sharded = test_conformance.run(PgEngine(coordinator, "citus"))
    for i, step in enumerate(steps):
        if len(step) == 3 or step[3] == "postgres":
            assert sharded[i] == single[i], f"{step[0]}{step[1]}: one node {single[i]}, citus {sharded[i]}"


def notices_of(conn, sql, args=()):
    conn.notices.clear()
    with conn.cursor() as cur:
        cur.execute("SET client_min_messages TO debug1")
        cur.execute(sql, args)
        result = cur.fetchone()[0]
        cur.execute("RESET client_min_messages")
    return result, [n for n in conn.notices if "pushing down" in n]


def test_single_key_calls_run_on_the_worker_that_owns_the_key(cluster):
    fresh(cluster)
    for sql in ("SELECT rl_take('user:1', 10, 60)", "SELECT rl_take_compact('user:1', 10, 60)",
                "SELECT rl_spend('user:1', 'day', 10)",
                "SELECT rl_peek('user:1', 10, 60)", "SELECT rl_budget('user:1', 'day', 10)",
                "SELECT rl_refund('user:1', 10, 60, 1)", "SELECT rl_refund_budget('user:1', 'day', 1)"):
        _, pushed = notices_of(cluster, sql)
        assert pushed, f"{sql} was not delegated"
    # where the shard is, and that the worker holding it has the row
    node = port_of(cluster, "user:1")
    worker = psycopg2.connect(dbname=DB, port=node)
    worker.autocommit = True
    with worker.cursor() as cur:
        cur.execute("SET citus.override_table_visibility = off")
        cur.execute("SELECT count(*) FROM pg_stat_user_tables WHERE relname LIKE 'rl_bucket\\_%%' AND n_tup_upd > 0")
        assert cur.fetchone()[0] >= 1
    worker.close()


def test_calls_that_are_not_delegated_are_exact_too(cluster):
    fresh(cluster)
    tx = pg_connect(DB, autocommit=False)
    with tx.cursor() as cur:
        answers = []
        for _ in range(4):  # inside a transaction block: run from the coordinator
            cur.execute("SELECT (rl_take('tx', 3, 0.000001) ->> 'admitted')::bool")
            answers.append(cur.fetchone()[0])
    tx.commit()
    assert answers == [True, True, True, False]
    key = "k"
    assert one(cluster, "SELECT (rl_take(%s || '', 1, 0.000001) ->> 'admitted')::bool", (key,)) is True
    assert one(cluster, "SELECT (rl_take(%s || '', 1, 0.000001) ->> 'admitted')::bool", (key,)) is False
    tx.close()


def test_sixteen_sessions_on_one_key_admit_exactly_the_burst(cluster):
    fresh(cluster)
    admitted = []

    def work(i, conn):
        with conn.cursor() as cur:
            for _ in range(20):
                cur.execute("SELECT (rl_take('hot', 100, 0.000001) ->> 'admitted')::bool")
                admitted.append(cur.fetchone()[0])

    run_sessions(DB, 16, work)
    assert admitted.count(True) == 100


def test_thirty_two_sessions_on_mixed_keys_admit_exactly_each_burst(cluster):
    fresh(cluster)
    admitted = {}

    def work(i, conn):
        with conn.cursor() as cur:
            for n in range(30):
                key = f"mixed:{(i + n) % 8}"
                cur.execute("SELECT (rl_take(%s, 25, 0.000001) ->> 'admitted')::bool", (key,))
                if cur.fetchone()[0]:
                    admitted[key] = admitted.get(key, 0) + 1
                cur.execute("SELECT (rl_spend(%s, 'day', 40) ->> 'admitted')::bool", (key,))
                if cur.fetchone()[0]:
                    admitted["day " + key] = admitted.get("day " + key, 0) + 1

    run_sessions(DB, 32, work)
    # 32 sessions x 30 calls spread evenly over 8 keys: 120 tries each
    assert admitted == {**{f"mixed:{k}": 25 for k in range(8)}, **{f"day mixed:{k}": 40 for k in range(8)}}


def keys_on_two_workers(conn):
    """Two keys whose shards live on different workers."""
    ports = {}
    for n in range(200):
        key = f"spread:{n}"
        port = port_of(conn, key)
        ports.setdefault(port, key)
        if len(ports) == 2:
            return list(ports.values())
    raise AssertionError("every key landed on one worker")


def test_take_all_across_workers_is_all_or_nothing(cluster):
    import json

    fresh(cluster)
    a, b = keys_on_two_workers(cluster)
    limits = json.dumps([{"key": a, "burst": 5, "refill_per_minute": 0.000001},
                         {"key": b, "period": "day", "quota": 2}])
    admitted = [one(cluster, "SELECT (rl_take_all(%s) ->> 'admitted')::bool", (limits,)) for _ in range(3)]
    assert admitted == [True, True, False]
    # the refusal charged neither worker: a's bucket still has 3 of 5
    assert one(cluster, "SELECT (rl_peek(%s, 5, 0.000001, 0) ->> 'remaining')::int", (a,)) == 3
    assert one(cluster, "SELECT (rl_budget(%s, 'day', 2, 0) ->> 'used')::int", (b,)) == 2


def test_ended_periods_are_kept_on_the_worker_and_read_through_the_coordinator(cluster):
    """A delegated rl_spend that starts a key's next period keeps the ended one in rl_usage,
    colocated with the budget; rl_usage (on the coordinator) and rl_sweep find it."""
    fresh(cluster)
    a, b = keys_on_two_workers(cluster)
    day = 86_400_000
    for key in (a, b):
        one(cluster, f"SELECT rl_spend('{key}', 'day', 10, 3, 1000)")  # constant arguments: delegated
        one(cluster, f"SELECT rl_spend('{key}', 'day', 10, 1, {day + 1000})")
    for key in (a, b):
        periods = one(cluster, "SELECT rl_usage(%s, 0, %s) -> 'periods'", (key, 2 * day))
        assert periods == [{"period": "day", "starts_at": 0, "ends_at": 86_400, "used": 3, "quota": 10}]
    # the sweep keeps the second day before it removes the row
    assert one(cluster, "SELECT rl_sweep(%s)", (3 * day,)) == 2
    assert one(cluster, "SELECT jsonb_array_length(rl_usage(%s, 0, %s) -> 'periods')", (a, 3 * day)) == 2
    # an invoicing run pages through both workers' periods, by end, then key, then period
    first = one(cluster, "SELECT rl_usage_all(0, %s, NULL, 3)", (3 * day,))
    rest = one(cluster, "SELECT rl_usage_all(0, %s, %s, 3)", (3 * day, json.dumps(first["next"])))
    places = [(p["ends_at"], p["key"]) for p in first["periods"] + rest["periods"]]
    assert places == sorted([(e, k) for e in (86_400, 172_800) for k in (a, b)], key=lambda p: (p[0], p[1].encode()))
    assert len(first["periods"]) == 3 and rest["next"] is None


def test_a_restarted_worker_loses_no_committed_admission(cluster):
    import threading
    import time

    fresh(cluster)
    a, b = keys_on_two_workers(cluster)
    committed, failed = [], []
    restarted, stop = threading.Event(), threading.Event()

    def work(i, conn):
        key = (a, b)[i % 2]
        with conn.cursor() as cur:
            while not stop.is_set():
                try:
                    cur.execute("SELECT (rl_take(%s, 100000, 0.000001) ->> 'admitted')::bool", (key,))
                    if cur.fetchone()[0]:
                        committed.append((key, restarted.is_set()))
                except psycopg2.Error:
                    failed.append(key)  # the worker went away mid-call: nothing committed
                    time.sleep(0.05)

    def restart():
        time.sleep(0.5)
        name = f"worker{port_of(pg_connect(DB), a) - int(os.environ['PGPORT'])}"
        # the log file keeps the new postmaster off our pipes (else run() waits for it to exit)
        folder = os.environ["RL_CITUS_DIR"]
        subprocess.run(["runuser", "-u", "postgres", "--", os.path.join(PG_BIN, "pg_ctl"), "-D",
                        os.path.join(folder, name), "-l", os.path.join(folder, f"{name}.log"),
                        "-m", "immediate", "-w", "restart"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        restarted.set()
        time.sleep(2)
        stop.set()

    restarter = threading.Thread(target=restart)
    restarter.start()
    run_sessions(DB, 8, work, timeout=300)
    restarter.join()
    # calls failed while the worker was down, and admissions went on after it came back
    assert failed and any(after for key, after in committed if key == a)
    for key in (a, b):
        remaining = one(cluster, "SELECT (rl_peek(%s, 100000, 0.000001, 0) ->> 'remaining')::int", (key,))
        # every admission a client saw is kept; a call cut off may have committed unseen
        unseen = (100000 - sum(1 for k, _ in committed if k == key)) - remaining
        assert 0 <= unseen <= failed.count(key), (key, unseen)


@pytest.fixture
def app_role(cluster):
    """An application role (LOGIN: Citus opens the worker connections of a delegated call as
    the current role), used via SET ROLE; Citus creates it on the workers too."""
    role = "rl_citus_app"
    with cluster.cursor() as cur:
        cur.execute(f"CREATE ROLE {role} LOGIN")
        cur.execute(f"GRANT CREATE ON SCHEMA public TO {role}")
    yield role
    with cluster.cursor() as cur:
        cur.execute("RESET ROLE")
        cur.execute("RESET search_path")
        cur.execute(f"DROP OWNED BY {role}")
        cur.execute(f"DROP ROLE {role}")


def test_an_application_role_calls_functions_but_cannot_touch_state(cluster, app_role):
    import test_postgres

    fresh(cluster)
    test_postgres.test_ordinary_role_calls_functions_but_cannot_touch_state((cluster, DB), app_role)


def test_a_search_path_hijack_is_ignored(cluster, app_role):
    import test_postgres

    fresh(cluster)
    test_postgres.test_search_path_hijack_is_ignored((cluster, DB), app_role)


# What crashed a coordinator backend in Citus 13.2.2's and 14.0.1's function call delegation
# (and so restarted every session): a NULL distribution argument, and arguments the planner
# pulled up out of FROM. (name, statements; the last one's answer or error is the outcome)
NULL_KEY_SHAPES = [
    ("a NULL literal", ["SELECT rl_take(NULL, 5, 60)"]),
    ("a NULL bound parameter", ["PREPARE shape(text) AS SELECT rl_take($1, 5, 60)", "EXECUTE shape(NULL)"]),
    ("an expression folded to NULL", ["SELECT rl_take(NULLIF('a', 'a'), 5, 60)"]),
    ("a NULL passed to FROM", ["SELECT * FROM rl_take(NULL, 5, 60)"]),
    ("a NULL through an inlined SQL function",
     ["CREATE FUNCTION pg_temp.wrapped(k text) RETURNS jsonb LANGUAGE sql AS 'SELECT rl_take(k, 5, 60)'",
      "SELECT pg_temp.wrapped(NULL)"]),
]
PULLED_UP_SHAPES = [
    ("a key from VALUES in FROM", ["SELECT rl_take(k, 5, 60) FROM (VALUES ('shape:values')) v(k)"]),
    ("a key from a subquery in FROM", ["SELECT rl_take(k, 5, 60) FROM (SELECT 'shape:subquery') s(k)"]),
]


def outcome_of(conn, statements):
    """The last statement's answer, or its error as (SQLSTATE, message)."""
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
            return cur.fetchone()[0]
    except psycopg2.Error as e:
        return (e.pgcode, e.diag.message_primary)
    finally:
        with conn.cursor() as cur:
            cur.execute("DEALLOCATE ALL")


def app_session(role, guard):
    """A session of the application role, with the guard on or (set by a superuser for the
    role: the role cannot) off."""
    admin = pg_connect(DB)
    with admin.cursor() as cur:
        cur.execute(f"ALTER ROLE {role} SET pg_ratelimit.citus_guard = {'on' if guard else 'off'}")
    admin.close()
    conn = psycopg2.connect(dbname=DB, user=role)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SHOW pg_ratelimit.citus_guard")
        assert cur.fetchone()[0] == ("on" if guard else "off")
    return conn


@pytest.mark.parametrize("guard", [True, False], ids=["guard on", "patched Citus, guard off"])
def test_no_call_restarts_the_coordinator(cluster, app_role, guard):
    """The guard (pg_ratelimit.citus_guard, on by default) refuses both shapes with a clear
    error before Citus sees them; with it off, the patched Citus runs them on the
    coordinator. Either way the postmaster and the other sessions live on."""
    fresh(cluster)
    started = one(cluster, "SELECT pg_postmaster_start_time()")
    bystander = pg_connect(DB)
    conn = app_session(app_role, guard)
    try:
        for name, statements in NULL_KEY_SHAPES:
            # the function's own error for a NULL key, with or without the guard
            assert outcome_of(conn, statements) == ("22023", "rl_take: key must be text, got NULL"), name
        for name, statements in PULLED_UP_SHAPES:
            outcome = outcome_of(conn, statements)
            if guard:
                assert outcome[0] == "0A000" and outcome[1].startswith(
                    "rl_take: Citus cannot delegate a call whose arguments come from a subquery or VALUES list"), name
            else:
                assert outcome["admitted"] is True and outcome["remaining"] == 4, (name, outcome)
        assert outcome_of(conn, ["SELECT rl_take('shape:plain', 5, 60)"])["remaining"] == 4
        assert one(bystander, "SELECT 1") == 1, "another session survives"
        assert one(pg_connect(DB), "SELECT pg_postmaster_start_time()") == started
    finally:
        conn.close()
        bystander.close()
        with cluster.cursor() as cur:
            cur.execute(f"ALTER ROLE {app_role} RESET pg_ratelimit.citus_guard")


def test_only_a_superuser_turns_the_guard_off(cluster, app_role):
    conn = psycopg2.connect(dbname=DB, user=app_role)
    try:
        with conn.cursor() as cur, pytest.raises(psycopg2.errors.InsufficientPrivilege):
            cur.execute("SET pg_ratelimit.citus_guard = off")
    finally:
        conn.close()
