"""PostgreSQL-specific behaviour of pg_ratelimit through a real client (psycopg2)."""
import os
import shutil
import subprocess
import threading

import pytest

psycopg2 = pytest.importorskip("psycopg2")

from conftest import EDITION, FUNCTIONS, INTERNAL, PUBLIC, assert_refused_read_only, native_only, one, pg_connect, run_sessions



@pytest.fixture
def app_role(pg_db):
    """A NOLOGIN role with no privileges beyond the default EXECUTE, used via SET ROLE."""
    conn, name = pg_db
    role = f"app_{name}"
    with conn.cursor() as cur:
        cur.execute(f"CREATE ROLE {role} NOLOGIN")
        cur.execute(f"GRANT CREATE ON SCHEMA public TO {role}")
    yield role
    with conn.cursor() as cur:
        cur.execute("RESET ROLE")
        cur.execute(f"DROP OWNED BY {role}")
        cur.execute(f"DROP ROLE {role}")


def test_default_search_path_and_jsonb(pg_db):
    conn, _ = pg_db
    with conn.cursor() as cur:
        cur.execute("SELECT pg_typeof(rl_take('k', 10, 60)), rl_take('k', 10, 60) ->> 'remaining'")
        assert cur.fetchone() == ("jsonb", "8")


def test_ordinary_role_calls_functions_but_cannot_touch_state(pg_db, app_role):
    conn, _ = pg_db
    with conn.cursor() as cur:
        cur.execute("SET pg_ratelimit.allow_explicit_clock = off")
        cur.execute(f"SET ROLE {app_role}")
        cur.execute("SELECT rl_take('k', 3, 60) ->> 'admitted', rl_spend('k', 'day', 3) ->> 'admitted'")
        assert cur.fetchone() == ("true", "true")
        for sql in [
            "SELECT * FROM ratelimit.rl_bucket",
            "INSERT INTO ratelimit.rl_bucket VALUES ('x', 1, 0, 0)",
            "UPDATE ratelimit.rl_budget SET used = 0",
            "DELETE FROM ratelimit.rl_bucket",
        ]:
            with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                cur.execute(sql)


@native_only
def test_explicit_clock_is_off_by_default_and_superuser_only(pg_db, app_role):
    conn, _ = pg_db
    with conn.cursor() as cur:
        cur.execute("SELECT reset_val FROM pg_settings WHERE name = 'pg_ratelimit.allow_explicit_clock'")
        cur.execute("SELECT boot_val, context FROM pg_settings WHERE name = 'pg_ratelimit.allow_explicit_clock'")
        assert cur.fetchone() == ("off", "superuser")
        cur.execute("SET pg_ratelimit.allow_explicit_clock = off")
        with pytest.raises(psycopg2.errors.InsufficientPrivilege) as e:
            cur.execute("SELECT rl_take('k', 3, 60, 1, 0)")
        assert e.value.diag.message_primary == (
            "rl_take: an explicit now_ms is not allowed unless pg_ratelimit.allow_explicit_clock is on")
        cur.execute("SELECT rl_take('k', 3, 60, 1, NULL) ->> 'admitted'")
        assert cur.fetchone() == ("true",)
        cur.execute(f"SET ROLE {app_role}")
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            cur.execute("SET pg_ratelimit.allow_explicit_clock = on")
        cur.execute("RESET ROLE")
        cur.execute("SHOW pg_ratelimit.allow_explicit_clock")
        assert cur.fetchone() == ("off",)


def test_search_path_hijack_is_ignored(pg_db, app_role):
    conn, _ = pg_db
    with conn.cursor() as cur:
        cur.execute(f"SET ROLE {app_role}")
        # shadow a catalog function, an operator and the state table in schemas the role controls
        cur.execute("CREATE FUNCTION public.least(double precision, double precision) RETURNS double precision "
                    "LANGUAGE sql AS 'SELECT 1e9::float8'")
        cur.execute("CREATE FUNCTION public.rl_evil_eq(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true'")
        cur.execute("CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.rl_evil_eq)")
        cur.execute("CREATE TEMP TABLE rl_bucket (key text PRIMARY KEY, level float8, refilled_at int8, full_at int8)")
        cur.execute("SET search_path = pg_temp, public, pg_catalog")
        results = []
        for _ in range(4):
            cur.execute("SELECT rl_take('hijack', 3, 0.001) ->> 'admitted', rl_spend('hijack', 'day', 3) ->> 'admitted'")
            results.append(cur.fetchone())
        assert results == [("true", "true")] * 3 + [("false", "false")]
        cur.execute("""SELECT rl_take_all('[{"key": "hijack", "burst": 3, "refill_per_minute": 0.001}]') ->> 'admitted'""")
        assert cur.fetchone() == ("false",)
        cur.execute("SELECT count(*) FROM pg_temp.rl_bucket")
        assert cur.fetchone() == (0,)
        # the internal functions the statements call are out of reach
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            cur.execute("SELECT ratelimit.rl_bucket_guard(1, 0, 0)")


@native_only
def test_internal_functions_refuse_calls_outside_their_statements(pg_db):
    conn, _ = pg_db
    with conn.cursor() as cur:
        for sql in ["SELECT ratelimit.rl_bucket_guard(1, 0, 0)", "SELECT ratelimit.rl_budget_new_used()"]:
            with pytest.raises(psycopg2.errors.ObjectNotInPrerequisiteState) as e:
                cur.execute(sql)
            assert "callable only from its own statements" in e.value.diag.message_primary


def catalog(cur):
    """What a user can observe of the installed extension: every function with its
    signature, properties, settings, privileges and comment; every table column."""
    cur.execute("""
        SELECT n.nspname, p.proname, pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid),
               p.prosecdef, p.proconfig, p.provolatile, p.proparallel, p.procost, p.proisstrict, p.proacl::text,
               obj_description(p.oid, 'pg_proc')
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
        JOIN pg_extension e ON e.oid = d.refobjid WHERE e.extname = 'pg_ratelimit' ORDER BY 1, 2, 3""")
    functions = cur.fetchall()
    cur.execute("""
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, c.relacl::text,
               obj_description(c.oid, 'pg_class')
        FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
        WHERE c.relnamespace = 'ratelimit'::regnamespace ORDER BY 1, a.attnum""")
    tables = cur.fetchall()
    # the tables pg_dump saves the rows of
    cur.execute("SELECT extconfig::regclass[]::text, extcondition FROM pg_extension WHERE extname = 'pg_ratelimit'")
    return functions, tables, cur.fetchall()


RELEASED = os.path.join(os.path.dirname(__file__), "..", "sql", "released", "extension")


@native_only
def test_an_upgrade_script_run_by_hand_only_says_how_to_run_it(pg_db):
    """From 0.3.0 on, each upgrade script starts with pgvector's guard: run with psql -f it
    prints how to load it and stops before any statement (0.1.0 -> 0.2.0, released
    without it, is never edited)."""
    conn, name = pg_db
    folder = os.path.join(os.path.dirname(__file__), "..", "pg_ext", "sql")
    scripts = sorted(f for f in os.listdir(folder) if f != "pg_ratelimit--0.1.0--0.2.0.sql")
    assert scripts, "the upgrade scripts of this release"
    with conn.cursor() as cur:
        before = catalog(cur)
    for script in scripts:
        target = script.removesuffix(".sql").rsplit("--", 1)[1]
        out = subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", name, "-f", os.path.join(folder, script)],
                             capture_output=True, text=True)
        assert out.returncode == 0 and out.stderr == "", (script, out.stderr)
        assert out.stdout.strip() == f"Use \"ALTER EXTENSION pg_ratelimit UPDATE TO '{target}'\" to load this file.", script
    with conn.cursor() as cur:
        assert catalog(cur) == before


@native_only
@pytest.mark.parametrize("old", ["0.1.0", "0.2.0", "0.3.0"])
def test_upgrade_keeps_state_and_equals_a_fresh_install(pg_db, old):
    conn, name = pg_db
    pg_config = os.environ.get("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
    sharedir = subprocess.run([pg_config, "--sharedir"], capture_output=True, text=True, check=True).stdout.strip()
    old_script = os.path.join(sharedir, "extension", f"pg_ratelimit--{old}.sql")
    added = not os.path.exists(old_script)
    # the released script, also over a stale one a development build left behind
    shutil.copy(os.path.join(RELEASED, f"pg_ratelimit--{old}.sql"), old_script)
    try:
        with conn.cursor() as cur:
            fresh = catalog(cur)
            cur.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_ratelimit'")
            current = cur.fetchone()[0]
            cur.execute("DROP EXTENSION pg_ratelimit")
            cur.execute(f"CREATE EXTENSION pg_ratelimit VERSION '{old}'")
            # a bucket and a budget as the old version stored them
            cur.execute("INSERT INTO ratelimit.rl_bucket VALUES ('kept', 1, 0, 120000)")
            cur.execute("INSERT INTO ratelimit.rl_budget VALUES ('kept', 'day', 2000000, 86400000)")
        # the new library on the old objects: a clear error until the update
        stale = pg_connect(name)
        with stale.cursor() as cur, pytest.raises(psycopg2.errors.ObjectNotInPrerequisiteState) as e:
            cur.execute("SELECT rl_take('k', 3, 60)")
        assert e.value.diag.message_primary == (
            f"pg_ratelimit: the library is version {current} but the extension in this database is version {old}")
        assert e.value.diag.message_hint == "Run ALTER EXTENSION pg_ratelimit UPDATE in this database."
        stale.close()
        with conn.cursor() as cur:
            cur.execute("ALTER EXTENSION pg_ratelimit UPDATE")
            assert catalog(cur) == fresh
        updated = pg_connect(name)
        with updated.cursor() as cur:
            cur.execute("SET pg_ratelimit.allow_explicit_clock = on")
            cur.execute("SELECT rl_take('kept', 3, 60, 1, 0) ->> 'remaining', rl_spend('kept', 'day', 3, 1, 0) ->> 'remaining'")
            assert cur.fetchone() == ("0", "0")
        updated.close()
    finally:
        if added:
            os.remove(old_script)


def test_rollback_undoes_a_take(pg_db):
    conn, name = pg_db
    tx = pg_connect(name, autocommit=False)
    assert one(tx, "SELECT rl_take('tx', 1, 0.001) ->> 'admitted'") == "true"
    tx.rollback()
    assert one(tx, "SELECT rl_take('tx', 1, 0.001) ->> 'admitted'") == "true"
    tx.commit()
    assert one(tx, "SELECT rl_take('tx', 1, 0.001) ->> 'admitted'") == "false"
    tx.close()


def test_read_only_transaction_refuses_changes_and_answers_peeks(pg_db):
    conn, _ = pg_db
    with conn.cursor() as cur:
        cur.execute("SELECT rl_take('k', 3, 0.001, 2, 0), rl_spend('k', 'day', 5, 2, 0)")
        cur.execute("BEGIN READ ONLY")
        for sql, function in (("SELECT rl_take('k', 3, 60)", "rl_take"), ("SELECT rl_spend('k', 'day', 5)", "rl_spend")):
            assert_refused_read_only(cur, sql, function)
        cur.execute("SELECT rl_peek('k', 3, 0.001, 1, 0) ->> 'remaining', rl_budget('k', 'day', 5, 1, 0) ->> 'used'")
        assert cur.fetchone() == ("0", "3")
        cur.execute("ROLLBACK")


def test_clock_is_the_real_time(pg_db):
    conn, _ = pg_db
    with conn.cursor() as cur:
        cur.execute("SELECT rl_spend('clock', 'day', 5) ->> 'resets_at', "
                    "extract(epoch FROM date_trunc('day', clock_timestamp() AT TIME ZONE 'UTC') + interval '1 day')::bigint")
        resets_at, expected = cur.fetchone()
        assert int(resets_at) == expected


@native_only
def test_every_function_has_a_comment_and_drop_removes_everything(pg_db):
    conn, _ = pg_db
    with conn.cursor() as cur:
        cur.execute("SELECT p.proname, obj_description(p.oid, 'pg_proc') FROM pg_proc p "
                    "JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e' "
                    "JOIN pg_extension e ON e.oid = d.refobjid WHERE e.extname = 'pg_ratelimit'")
        functions = dict(cur.fetchall())
        assert set(functions) == set(PUBLIC) | set(INTERNAL)
        assert all(functions.values())
        cur.execute("SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                    "WHERE n.nspname = 'ratelimit' AND has_function_privilege('public', p.oid, 'EXECUTE')")
        assert cur.fetchall() == [], "internal functions are not executable by PUBLIC"
        cur.execute("SELECT rl_take('k', 3, 60)")
        cur.execute("DROP EXTENSION pg_ratelimit")
        cur.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'ratelimit'")
        assert cur.fetchone() == (0,)
        cur.execute("SELECT count(*) FROM pg_proc WHERE proname LIKE 'rl\\_%'")
        assert cur.fetchone() == (0,)
        cur.execute("CREATE EXTENSION pg_ratelimit")
        cur.execute("SELECT rl_take('k', 3, 60) ->> 'remaining'")
        assert cur.fetchone() == ("2",)


@pytest.mark.parametrize("sql", [
    "SELECT rl_take('hot-{n}', 100, 0.000001)",
    "SELECT rl_spend('hot-{n}', 'month', 100, 1)",
    "SELECT rl_take_all('[{\"key\": \"hot-{n}\", \"burst\": 100, \"refill_per_minute\": 0.000001}]')",
])
def test_sixteen_sessions_admit_exactly_the_limit(pg_store_db, sql):
    conn, name = pg_store_db
    sessions, calls = 16, 40
    key_sql = sql.replace("{n}", name)
    admitted = [0] * sessions

    def work(i, c):
        # all sessions start together: the key's first-ever use is concurrent
        for _ in range(calls):
            if one(c, key_sql)["admitted"]:
                admitted[i] += 1

    run_sessions(name, sessions, work)
    assert sum(admitted) == 100


@native_only
@pytest.mark.parametrize("direct_writes", ["on", "off"])
@pytest.mark.parametrize("outcome", ["COMMIT", "ROLLBACK"])
def test_a_take_that_waited_decides_on_the_row_the_other_transaction_left(pg_db, direct_writes, outcome):
    """The re-check a guarded UPDATE gets from EvalPlanQual, and the heap write
    (pg_ratelimit.direct_writes) does by hand: a take that waits for another transaction's
    take of the last token is refused once that one commits, admitted once it rolls back."""
    conn, name = pg_db
    take = "SELECT rl_take('waited', 2, 0.000001)"
    holder, waiter = pg_connect(name), pg_connect(name)
    try:
        for c in (holder, waiter):
            with c.cursor() as cur:
                cur.execute(f"SET pg_ratelimit.direct_writes = {direct_writes}")
        assert one(conn, take)["remaining"] == 1
        holder.autocommit = False
        assert one(holder, take)["remaining"] == 0  # holds the row until it ends
        with holder.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            holder_pid = cur.fetchone()[0]
        answer = {}
        thread = threading.Thread(target=lambda: answer.update(one(waiter, take)))
        thread.start()
        with conn.cursor() as cur:  # the waiter is blocked on the holder's row
            for _ in range(1500):  # 30 s at most
                cur.execute("SELECT count(*) FROM pg_locks WHERE NOT granted AND pid OPERATOR(pg_catalog.<>) %s",
                            (holder_pid,))
                if cur.fetchone()[0]:
                    break
                threading.Event().wait(0.02)
            else:
                pytest.fail("the second take never waited for the first")
        getattr(holder, outcome.lower())()
        thread.join(10)
        assert answer["admitted"] == (outcome == "ROLLBACK"), answer
        assert answer["remaining"] == 0
        assert one(conn, "SELECT rl_peek('waited', 2, 0.000001, 0)")["remaining"] == 0
    finally:
        holder.close()
        waiter.close()


@native_only
def test_direct_writes_is_for_superusers_only(pg_db, app_role):
    conn, _ = pg_db
    with conn.cursor() as cur:
        cur.execute(f"SET ROLE {app_role}")
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            cur.execute("SET pg_ratelimit.direct_writes = off")
    conn.rollback()


def test_32_sessions_mixed_keys_exact_totals(pg_store_db):
    """Many keys and one hot key, buckets and budgets mixed, every key's first use by all
    sessions at once: exact admitted totals, no deadlock, no unique violation."""
    import random

    conn, name = pg_store_db
    sessions, calls = 32, 60
    lock = threading.Lock()
    admitted, attempted = {}, {}

    def call_for(rng):
        kind = rng.randrange(4)
        if kind == 0:
            return ("hot-bucket", "SELECT rl_take('hot', 100, 0.000001)", 100)
        if kind == 1:
            return ("hot-budget", "SELECT rl_spend('hot', 'month', 100, 1)", 100)
        n = rng.randrange(24)
        if kind == 2 and rng.random() < 0.3:
            # a bucket and a budget all or nothing: each admitted only while both have room
            return (f"pair-{n}", f"SELECT rl_take_all('[{{\"key\": \"k{n}\", \"burst\": 5, \"refill_per_minute\": 0.000001}},"
                                 f" {{\"key\": \"p{n}\", \"period\": \"day\", \"quota\": 5}}]')", 5)
        if kind == 2:
            return (f"bucket-{n}", f"SELECT rl_take('k{n}', 5, 0.000001)", 5)
        return (f"budget-{n}", f"SELECT rl_spend('k{n}', 'day', 5, 1)", 5)

    def work(i, c):
        rng = random.Random(i)
        for _ in range(calls):
            label, sql, _ = call_for(rng)
            ok = one(c, sql)["admitted"]
            with lock:
                attempted[label] = attempted.get(label, 0) + 1
                admitted[label] = admitted.get(label, 0) + ok

    run_sessions(name, sessions, work)
    # bucket k{n} is taken from by rl_take (bucket-n) and by rl_take_all (pair-n), so count
    # them together; the pair's budget p{n} is charged exactly when its call was admitted
    group = lambda label: label.replace("pair-", "bucket-")  # noqa: E731
    totals = {}
    for label, count in attempted.items():
        tried, got = totals.get(group(label), (0, 0))
        totals[group(label)] = (tried + count, got + admitted[label])
    for label, (count, got) in totals.items():
        limit = 100 if label.startswith("hot") else 5
        assert got == min(limit, count), (label, got, count)
    for label in (l for l in attempted if l.startswith("pair-")):
        n = label.split("-")[1]
        used = one(conn, f"SELECT rl_budget('p{n}', 'day', 5, 0.000001) ->> 'used'")  # counts the peek's cost
        assert round(float(used) - 0.000001, 6) == admitted[label], (label, used, admitted[label])
    print(f"\n32 sessions: {sum(attempted.values())} calls, {sum(admitted.values())} admitted over {len(attempted)} limits")


def test_every_function_is_labelled_as_it_behaves(pg_db):
    """Volatility and parallel labels in the catalog are the function table's, in both
    editions, and they hold under a plan that runs what it may in parallel workers: the
    counters are the leader's (rl_stats_reset changes them, the edition through a setting,
    which a worker may not set)."""
    conn, _ = pg_db
    with conn.cursor() as cur:
        cur.execute("SELECT p.proname, p.provolatile, p.proparallel FROM pg_proc p "
                    "WHERE p.proname LIKE 'rl\\_%' AND p.pronamespace IN ('public'::regnamespace, 'ratelimit'::regnamespace)")
        labels = {name: (volatile, parallel) for name, volatile, parallel in cur.fetchall()}
        for f in FUNCTIONS:
            if f["name"] in labels:
                assert labels[f["name"]] == (f["volatility"][0].lower(), f["parallel"][0].lower()), f["name"]
        assert labels["rl_stats_reset"] == ("v", "u") and labels["rl_policy_stats"] == ("v", "r")
        cur.execute("SHOW server_version_num")
        forced = "debug_parallel_query" if int(cur.fetchone()[0]) >= 160000 else "force_parallel_mode"
        cur.execute(f"SET {forced} = on")
        cur.execute("SET max_parallel_workers_per_gather = 2")
        cur.execute("SELECT rl_stats_reset(), rl_policy_stats() ->> 'scope', rl_key('a', 'b'), rl_version() IS NOT NULL")
        assert cur.fetchone()[1:] == (("session" if EDITION == "sql" else "server"), '["a","b"]', True)
        cur.execute(f"RESET {forced}")


@native_only
def test_the_in_server_checks_pass_on_this_server(pg_db, app_role):
    """rl_self_test(): this build's jsonb answers are byte for byte what this server's
    jsonb_in makes of their text, and the catalog is the function table's. For rl_admin
    only."""
    conn, _ = pg_db
    report = one(conn, "SELECT rl_self_test()")
    assert report["failed"] == [] and report["checks"] > len(FUNCTIONS)
    with conn.cursor() as cur:
        cur.execute(f"SET ROLE {app_role}")
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            cur.execute("SELECT rl_self_test()")
    conn.rollback()
