"""The SQL edition for managed PostgreSQL (pg_ratelimit_sql): installed by a database owner
that is no superuser, from the plain script scripts/package.sh --sql writes, it declares
every function the native extension offers but the memory store's, and answers the
conformance list exactly as the native extension does, call for call."""
import os
import subprocess

import pytest

from conftest import (CARGO_VERSION, EDITION, FUNCTIONS, INSTALL, PgEngine, admin, install_sql_edition, pg_connect, pg_database, pg_tle_preloaded,
                      run_plain_script, sql_edition_script)
from test_conformance import STEPS, run

psycopg2 = pytest.importorskip("psycopg2")
BIN = os.environ.get("RL_PG_BIN", "/usr/lib/postgresql/15/bin")


def test_the_edition_declares_every_function_but_the_memory_stores():
    script = sql_edition_script()
    offered = [f["name"] for f in FUNCTIONS if f["kind"] not in ("internal", "server")]
    assert [name for name in offered if f"CREATE OR REPLACE FUNCTION {name}(" not in script] == []
    assert "rl_memory_stats" not in script


def test_the_edition_follows_the_contract(pg_sql_engine):
    run(pg_sql_engine)


@pytest.mark.skipif(EDITION == "sql", reason="compares the SQL edition with the native extension (pg_db is the edition here)")
def test_the_edition_answers_as_the_native_extension(pg_sql_engine, pg_db):
    ours = run(pg_sql_engine)
    native = run(PgEngine(pg_db[0]))
    compared = [i for i, step in enumerate(STEPS) if len(step) == 3 and step[0] != "rl_version"]
    assert len(compared) > 200
    for i in compared:
        assert ours[i] == native[i], f"{STEPS[i][0]}{STEPS[i][1]}: sql {ours[i]} native {native[i]}"


NOW = 1796000000000
# (level, refilled_at, burst, refill_per_minute, cost) of a row, and the take on it at NOW
TAKES_ON_ROWS = [
    (5, NOW - 1000, 10, 6, 1),                  # rl_take's one statement
    (14, NOW - 1090, 35, 800, 2),               # its first estimate of full_at 1 ms past the edge
    (1e15, NOW - 5, 1e15, 1, 1e-9),             # a take the level's precision cannot show: full now
    (3, NOW + 5000, 10, 6, 1),                  # refilled_at ahead of the clock
    (5, NOW, 10, 1e-300, 1),                    # a rate near the smallest double: the wait at its cap
    (float("nan"), NOW - 5, 10, 6, 1),          # rows the statement leaves to the general path
    (2e16, NOW, 10, 6, 1),
    (0.5, NOW, 10, 6, 1),                       # refused
    (5, NOW - 1000, 2.5, 7, 1),                 # a limit and refill seconds (21.428571428571427) not whole
    (5, NOW - 1000, 123456789012345.5, 1e15, 1),  # a limit of 16 digits
    (5, NOW - 1000, 1e15, 6e5, 1),              # a whole limit float8out writes as 1e+15
    (5, NOW - 1000, 10, 3e-280, 1),             # the smallest rates the statement takes
]


@pytest.mark.skipif(EDITION == "sql", reason="compares the SQL edition with the native extension (pg_db is the edition here)")
@pytest.mark.parametrize("extra_float_digits", [1, 0, 3])
def test_rl_take_writes_and_answers_as_the_native_extension_on_every_kind_of_row(pg_sql_db, pg_db, extra_float_digits):
    """rl_take's hot path (one UPDATE whose SQL helpers PostgreSQL inlines), its correction
    when float rounding puts the first estimate of full_at off the edge, and the general
    path it leaves other rows to: from the same row, the same answer and the same row
    written as the native extension's. Whatever extra_float_digits the caller set: the hot
    path's answer writes its numbers as float8out does, which is the core's form only
    above 0, so a caller who set 0 gets the general path."""
    native, ours = pg_db[0], pg_sql_db[0]
    with native.cursor() as cur:
        cur.execute("SET pg_ratelimit.allow_explicit_clock = on")
    for conn in (native, ours):
        with conn.cursor() as cur:
            cur.execute("SET extra_float_digits = %s", (extra_float_digits,))
    for i, (level, refilled_at, burst, rate, cost) in enumerate(TAKES_ON_ROWS):
        seen = []
        for conn in (native, ours):
            with conn.cursor() as cur:
                cur.execute("INSERT INTO ratelimit.rl_bucket VALUES (%s, %s, %s, 0)", (f"row{i}", level, refilled_at))
                cur.execute("SELECT rl_take(%s, %s, %s, %s, %s)", (f"row{i}", burst, rate, cost, NOW))
                answer = cur.fetchone()[0]
                cur.execute("SELECT level::text, refilled_at, full_at FROM ratelimit.rl_bucket WHERE key = %s", (f"row{i}",))
                seen.append((answer, cur.fetchone()))
        assert seen[0] == seen[1], TAKES_ON_ROWS[i]


POLICIES = {"one": '{"limits": [{"burst": 35, "refill_per_minute": 800}]}',
            "tiered": '{"limits": [{"burst": 35, "refill_per_minute": 800}], "tiers": {"pro": 2}}',
            "shadowed": '{"limits": [{"burst": 35, "refill_per_minute": 800}], "shadow": true}',
            "two": '{"limits": [{"burst": 35, "refill_per_minute": 800}, {"period": "day", "quota": 10}]}',
            "sevenths": '{"limits": [{"burst": 10, "refill_per_minute": 7}]}'}
# (policy, subject, cost, tier, the bucket row's level and refilled_at or None, blocked until)
CHECKS = [
    ("one", "bob", 1, None, (5, NOW - 1000), None),         # rl_check's one statement
    ("one", "alice", 2, None, (14, NOW - 1090), None),      # its first estimate of full_at off the edge
    ("one", "carol", 1, None, None, None),                  # no row yet: the general path from here on
    ("one", "dave", 1, None, (5, NOW - 1000), NOW - 9000),  # a block that has ended
    ("one", "erin", 1, None, (5, NOW - 1000), NOW + 9000),  # blocked
    ("one", "frank", 1, None, (0.5, NOW), None),            # refused
    ("tiered", "grace", 1, None, (5, NOW - 1000), None),    # tiers, none asked for
    ("tiered", "heidi", 1, "pro", (5, NOW - 1000), None),
    ("shadowed", "ivan", 1, None, (0.5, NOW), None),
    ("two", "judy", 1, None, (5, NOW - 1000), None),
    ("sevenths", "mallory", 1, None, (5, NOW - 1000), None),  # refill seconds 85.71428571428571, extra_float_digits 0
]


@pytest.mark.skipif(EDITION == "sql", reason="compares the SQL edition with the native extension (pg_db is the edition here)")
def test_rl_check_writes_and_answers_as_the_native_extension_on_every_kind_of_call(pg_sql_db, pg_db):
    """rl_check's hot path (a policy of one bucket, no tier, a subject never blocked, a row
    that admits: one UPDATE, as rl_take's) and the general path it leaves the other calls
    to: the same answers and the same bucket rows as the native extension's, and the
    session's counts of the edition."""
    native, ours = pg_db[0], pg_sql_db[0]
    with native.cursor() as cur:
        cur.execute("SET pg_ratelimit.allow_explicit_clock = on")
    for conn in (native, ours):
        with conn.cursor() as cur:
            for name, definition in POLICIES.items():
                cur.execute("SELECT rl_policy_set(%s, %s)", (name, definition))
    admitted = {}
    for policy, subject, cost, tier, row, blocked_until in CHECKS:
        key = f"\x01{len(policy)}:{policy}:0:{subject}"
        seen = []
        for conn in (native, ours):
            with conn.cursor() as cur:
                # the hot path's answer writes refill seconds as float8out does, so it runs only above 0
                cur.execute("SET extra_float_digits = %s", (0 if subject == "mallory" else 1,))
                if row:
                    cur.execute("INSERT INTO ratelimit.rl_bucket VALUES (%s, %s, %s, 0)", (key, *row))
                if blocked_until:
                    cur.execute("SELECT rl_block(%s, 10, %s)", (subject, blocked_until - 10000))
                cur.execute("SELECT rl_check(%s, %s, %s, %s, %s)", (policy, subject, cost, tier, NOW))
                answer = cur.fetchone()[0]
                cur.execute("SELECT level::text, refilled_at, full_at FROM ratelimit.rl_bucket WHERE key = %s", (key,))
                seen.append((answer, cur.fetchone()))
        assert seen[0] == seen[1], (policy, subject)
        admitted[policy] = admitted.get(policy, 0) + (seen[1][0]["admitted"] is True)
    with ours.cursor() as cur:
        cur.execute("SELECT rl_policy_stats() -> 'policies'")
        counts = cur.fetchone()[0]
    assert {p: c["admitted"] for p, c in counts.items()} == admitted


def test_rl_takes_first_estimate_is_taken_only_where_it_is_the_exact_wait(pg_sql_db):
    """Over 50,000 drawn rows and takes, wide and narrow (down to rates and bursts near the
    smallest doubles): the level the hot path writes is rl__level_at's less the cost, and
    where rl__full_at_is_edge accepts its full_at, that is now + rl__wait_for's (the
    counterpart of bucket::wait_for, which the differential run checks against the native
    library)."""
    conn, _ = pg_sql_db
    with conn.cursor() as cur:
        cur.execute("SELECT setseed(0.39)")
        cur.execute("""
            WITH drawn AS (
                SELECT (ARRAY[random() * 10, random() * 1e15, -random() * 1e15, round(random() * 100), random() * 1e-300,
                              0])[1 + (random() * 5)::int] AS level,
                       %(now)s + (random() * 200000 - 100000)::bigint AS refilled_at,
                       (ARRAY[1 + round(random() * 1000), random() * 1e15, 1e15, random() * 5 + 0.001, random() * 1e-295,
                              1e-300])[1 + (random() * 5)::int] AS burst,
                       (ARRAY[random() * 60, random() * 1e-6, 1e15, 1 + round(random() * 10000) / 10, random() * 1e-290,
                              1e-300])[1 + (random() * 5)::int] AS rate,
                       (ARRAY[1, random() * 3, 1e-9, 0.5, 1e-301, random() * 1e-296])[1 + (random() * 5)::int] AS cost,
                       %(now)s::bigint AS now
                FROM generate_series(1, 50000)
            ), taken AS (
                SELECT *, ratelimit.rl__taken_level(level, refilled_at, burst, rate, cost, now) AS new_level,
                       greatest(refilled_at, now) AS new_refilled_at,
                       ratelimit.rl__taken_full_at(level, refilled_at, burst, rate, cost, now) AS estimate
                FROM drawn WHERE cost <= ratelimit.rl__level_at(true, level, refilled_at, burst, rate, now)
            ), judged AS (
                SELECT *, ratelimit.rl__full_at_is_edge(new_level, new_refilled_at, estimate, burst, rate, now) AS edge,
                       now + ratelimit.rl__wait_for(true, new_level, new_refilled_at, burst, rate, now, burst) AS exact
                FROM taken
            )
            SELECT count(*), count(*) FILTER (WHERE edge), count(*) FILTER (WHERE edge AND estimate <> exact),
                   count(*) FILTER (WHERE new_level IS DISTINCT FROM
                                    ratelimit.rl__level_at(true, level, refilled_at, burst, rate, now) - cost)
            FROM judged""", {"now": NOW})
        takes, accepted, wrong, levels = cur.fetchone()
    assert takes > 20000 and accepted > takes / 4, (takes, accepted)
    assert (wrong, levels) == (0, 0)


def test_every_function_and_view_has_a_comment_and_the_native_privileges(pg_sql_db):
    conn, _ = pg_sql_db
    with conn.cursor() as cur:
        cur.execute("""SELECT p.proname, obj_description(p.oid, 'pg_proc'), p.prosecdef, p.provolatile,
                              has_function_privilege('public', p.oid, 'EXECUTE')
                       FROM pg_proc p WHERE p.proname LIKE 'rl\\_%' AND p.pronamespace = 'public'::regnamespace""")
        declared = {name: (comment, definer, volatile, public) for name, comment, definer, volatile, public in cur.fetchall()}
        for f in FUNCTIONS:
            if f["kind"] in ("internal", "server"):
                continue
            comment, definer, volatile, public = declared.pop(f["name"])
            assert comment == f["comment"], f["name"]
            assert definer, f["name"]
            assert volatile == ("i" if f["kind"] == "pure" else "v"), f["name"]
            assert public == (not f["admin_only"]), f["name"]
        assert declared == {}, "no function beyond the native extension's"
        for view in ("rl_policies", "rl_blocks", "rl_stats", "rl_refused"):
            cur.execute("SELECT obj_description(%s::regclass, 'pg_class'), has_table_privilege('public', %s, 'SELECT')",
                        (view, view))
            comment, public = cur.fetchone()
            assert comment and not public, view


def test_the_explicit_clock_is_the_owners_and_rl_admins_only(pg_sql_db):
    owner_conn, name = pg_sql_db
    app, ops = f"app_{name}", f"ops_{name}"
    admin(f"CREATE ROLE {app} NOLOGIN")
    admin(f"CREATE ROLE {ops} NOLOGIN IN ROLE rl_admin")
    conn = pg_connect(name)
    try:
        with owner_conn.cursor() as cur:
            assert json_of(cur, "SELECT rl_take('k', 3, 60, 1, 0)")["admitted"] is True
        with conn.cursor() as cur:
            cur.execute(f"SET ROLE {ops}")
            assert json_of(cur, "SELECT rl_take('k', 3, 60, 1, 0)")["admitted"] is True
            cur.execute(f"SET ROLE {app}")
            # a setting cannot let it through: the edition has no library to guard one (where
            # the native library is loaded too, as in the test cluster, the role may not even set it)
            try:
                cur.execute("SET pg_ratelimit.allow_explicit_clock = on")
            except psycopg2.errors.InsufficientPrivilege:
                pass
            with pytest.raises(psycopg2.errors.InsufficientPrivilege) as e:
                cur.execute("SELECT rl_take('k', 3, 60, 1, 0)")
            assert e.value.diag.message_primary == (
                "rl_take: an explicit now_ms is allowed only for the owner of pg_ratelimit_sql and members of rl_admin")
            assert json_of(cur, "SELECT rl_take('k', 3, 60)")["admitted"] is True
            # the state tables and helpers are out of reach
            for sql in ("SELECT * FROM ratelimit.rl_bucket", "SELECT ratelimit.rl__number(1)"):
                with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                    cur.execute(sql)
    finally:
        conn.close()
        admin(f"DROP ROLE {app}")
        admin(f"DROP ROLE {ops}")


def json_of(cur, sql):
    cur.execute(sql)
    return cur.fetchone()[0]


# State of every kind, made at 0 ms and read back at 1000 ms with explicit clocks.
MAKE_STATE = [
    "SELECT rl_take('user:1', 10, 0.001, 4, 0)",
    "SELECT rl_take('drained', 3, 0.001, 3, 0)",
    "SELECT rl_spend('team:7', 'month', 100, 42.5, 0)",
    "SELECT rl_window('win', 5, 3600, 2, 0)",
    "SELECT rl_acquire('jobs', 3, 3600, 0)",
    """SELECT rl_policy_set('api', '{"limits": [{"burst": 5, "refill_per_minute": 1}, {"period": "day", "quota": 9}],
                                     "tiers": {"pro": 2}}')""",
    "SELECT rl_check('api', 'ann', 2, 'pro', 0)",
    "SELECT rl_penalize('ip:1', 0, 60, 3600, 3600, 0)",
]
READ_STATE = [
    "SELECT rl_peek('user:1', 10, 0.001, 0, 1000)",
    "SELECT rl_peek('drained', 3, 0.001, 1, 1000)",
    "SELECT rl_budget('team:7', 'month', 100, 0, 1000)",
    "SELECT rl_window_peek('win', 5, 3600, 0, 1000)",
    "SELECT rl_in_flight('jobs', 1000)",
    "SELECT definition FROM rl_policies WHERE name = 'api'",
    "SELECT rl_check('api', 'ann', 1, 'pro', 1000)",
    "SELECT subject, strikes FROM rl_blocks",
]


def run_all(conn, statements):
    with conn.cursor() as cur:
        out = []
        for sql in statements:
            cur.execute(sql)
            out.append(cur.fetchall())
        return out


@pytest.mark.parametrize("direction", ["native to sql", "sql to native"])
def test_a_dump_of_the_state_restores_into_the_other_edition(tmp_path, pg_db, pg_sql_db, direction):
    native, ours = pg_connect(pg_db[1]), pg_connect(pg_sql_db[1])
    source, target = (native, ours) if direction == "native to sql" else (ours, native)
    for conn in (source, target):
        with conn.cursor() as cur:
            cur.execute("SET pg_ratelimit.allow_explicit_clock = on")  # the native one asks for it
    run_all(source, MAKE_STATE)
    # the rows of the state tables (named one by one: pg_dump leaves an extension's
    # tables out of a schema-wide dump), restored before either side reads (rl_check charges)
    dump = str(tmp_path / "state.sql")
    database = lambda conn: conn.get_dsn_parameters()["dbname"]  # noqa: E731
    tables = [arg for t in ("rl_bucket", "rl_budget", "rl_entries", "rl_policy") for arg in ("-t", f"ratelimit.{t}")]
    subprocess.run([f"{BIN}/pg_dump", "--data-only", *tables, "-f", dump, database(source)], check=True)
    subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", database(target), "-f", dump],
                   check=True, capture_output=True)
    before = run_all(source, READ_STATE)
    assert before[1][0][0]["admitted"] is False and before[4][0][0] == 1, "the state is really there"
    assert run_all(target, READ_STATE) == before
    native.close()
    ours.close()


def test_a_pg_tle_install_dumps_and_restores_whole(tmp_path):
    """Supabase's dbdev warns that restoring a logical backup of a database with a TLE can
    fail. Restored by a role that may create pg_tle (here a superuser; on RDS rds_superuser)
    into an empty database on a server that preloads pg_tle, the dump brings pg_tle, the
    registered edition, the extension and its state back (owned by the restoring role)."""
    if not pg_tle_preloaded():
        pytest.skip("the cluster does not preload pg_tle (scripts/test.sh runs this on one that does)")
    with pg_database("rl_tle", extension=False) as source, pg_database("rl_tle_copy", extension=False) as copy:
        owner = f"owner_{source}"
        install_sql_edition(source, owner, through="pg_tle")
        try:
            conn = pg_connect(source)
            run_all(conn, MAKE_STATE)
            dump = str(tmp_path / "whole.sql")
            subprocess.run([f"{BIN}/pg_dump", "-Fp", "-f", dump, source], check=True)
            before = run_all(conn, READ_STATE)
            conn.close()
            subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", copy, "-f", dump],
                           check=True, capture_output=True)
            restored = pg_connect(copy)
            with restored.cursor() as cur:
                cur.execute("SELECT extname, extowner::regrole::text FROM pg_extension WHERE extname LIKE 'pg\\_%'")
                # a whole restore creates the extensions as the restoring role: to keep the
                # owner, restore the state tables' rows into the owner's own install instead
                assert sorted(cur.fetchall()) == [("pg_ratelimit_sql", "postgres"), ("pg_tle", "postgres")]
            assert run_all(restored, READ_STATE) == before
            restored.close()
        finally:
            admin(f"DROP DATABASE IF EXISTS {copy} WITH (FORCE)")
            admin(f"DROP DATABASE IF EXISTS {source} WITH (FORCE)")
            admin(f"DROP ROLE IF EXISTS {owner}")


def next_release(script):
    """This release's script as the next release's would be: the same text under a newer
    version (the edition's scripts are idempotent, so the next one is written alike)."""
    return script.replace(f"{CARGO_VERSION}-sql", "9.9.9-sql")


def test_a_newer_plain_script_run_over_an_install_keeps_its_state(pg_sql_db, tmp_path):
    if INSTALL == "pg_tle":
        pytest.skip("a pg_tle install updates along its update path (the next test)")
    conn, name = pg_sql_db
    run_all(conn, MAKE_STATE)
    newer = tmp_path / "next.sql"
    newer.write_text(next_release(sql_edition_script()))
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM ratelimit.rl_bucket")
        rows = cur.fetchone()
        run_plain_script(name, conn.get_dsn_parameters()["user"], script=str(newer))
        cur.execute("SELECT rl_version(), count(*) FROM ratelimit.rl_bucket")
        assert cur.fetchone() == ("9.9.9-sql", rows[0])
    assert run_all(conn, READ_STATE)[1][0][0]["admitted"] is False, "the drained bucket stays drained"


def test_a_pg_tle_install_updates_along_its_update_path():
    if not pg_tle_preloaded():
        pytest.skip("the cluster does not preload pg_tle (scripts/test.sh runs this on one that does)")
    with pg_database("rl_tle_update", extension=False) as name:
        owner = f"owner_{name}"
        install_sql_edition(name, owner, through="pg_tle")
        try:
            conn = psycopg2.connect(dbname=name, user=owner)
            conn.autocommit = True
            run_all(conn, MAKE_STATE)
            before = run_all(conn, READ_STATE[:5])
            with conn.cursor() as cur:
                # the next release's file over this one: it registers the update path
                cur.execute(sql_edition_script("pg_tle.sql").replace(CARGO_VERSION, "9.9.9"))
                cur.execute("ALTER EXTENSION pg_ratelimit_sql UPDATE")
                cur.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_ratelimit_sql'")
                assert cur.fetchone() == ("9.9.9",)
                cur.execute("SELECT rl_version()")
                assert cur.fetchone() == ("9.9.9-sql",)
            assert run_all(conn, READ_STATE[:5]) == before
            conn.close()
        finally:
            admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin(f"DROP ROLE IF EXISTS {owner}")
