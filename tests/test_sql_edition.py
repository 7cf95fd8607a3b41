"""The SQL edition for managed PostgreSQL (pg_ratelimit_sql): installed by a database owner
that is no superuser, from the plain script scripts/package.sh --sql writes, it declares
every function the native extension offers but the memory store's, and answers the
conformance list exactly as the native extension does, call for call."""
import pytest

from conftest import FUNCTIONS, PgEngine, admin, pg_connect, sql_edition_script
from test_conformance import STEPS, run

psycopg2 = pytest.importorskip("psycopg2")


def test_the_edition_declares_every_function_but_the_memory_stores():
    script = sql_edition_script()
    offered = [f["name"] for f in FUNCTIONS if f["kind"] not in ("internal", "server")]
    assert [name for name in offered if f"CREATE OR REPLACE FUNCTION {name}(" not in script] == []
    assert "rl_memory_stats" not in script


def test_the_edition_follows_the_contract(pg_sql_engine):
    run(pg_sql_engine)


def test_the_edition_answers_as_the_native_extension(pg_sql_engine, pg_db):
    ours = run(pg_sql_engine)
    native = run(PgEngine(pg_db[0]))
    compared = [i for i, step in enumerate(STEPS) if len(step) == 3 and step[0] != "rl_version"]
    assert len(compared) > 200
    for i in compared:
        assert ours[i] == native[i], f"{STEPS[i][0]}{STEPS[i][1]}: sql {ours[i]} native {native[i]}"


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
        for view in ("rl_policies", "rl_blocks", "rl_stats"):
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
            # a setting cannot let it through: the edition has no library to guard one
            cur.execute("SET pg_ratelimit.allow_explicit_clock = on")
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
