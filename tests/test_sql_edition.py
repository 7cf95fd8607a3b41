"""The SQL edition for managed PostgreSQL (pg_ratelimit_sql): installed by a database owner
that is no superuser, from the plain script scripts/package.sh --sql writes, it declares
every function the native extension offers but the memory store's, and answers the
conformance list exactly as the native extension does, call for call."""
import pytest

from conftest import FUNCTIONS, PgEngine, sql_edition_script
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
