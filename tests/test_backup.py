"""pg_dump keeps the state: the extension's tables are marked for dumping, so a plain or
custom-format dump restored into a new database (or one where the extension was already
created) answers exactly as the original did."""
import os
import subprocess

import pytest

psycopg2 = pytest.importorskip("psycopg2")

from conftest import EDITION, admin, pg_connect, pg_database

BIN = os.environ.get("RL_PG_BIN", "/usr/lib/postgresql/15/bin")
# (sql, what it answers): read with explicit clocks, so the answers do not move
READS = [
    "SELECT rl_peek('user:1', 10, 0.001, 1, 1000)",
    "SELECT rl_peek('user:2', 3, 0.001, 1, 1000)",
    "SELECT rl_budget('team:7', 'month', 100, 0.5, 1000)",
    "SELECT rl_budget('team:7', 'day', 10, 1, 1000)",
]


def answers(name):
    conn = pg_connect(name)
    with conn.cursor() as cur:
        cur.execute("SET pg_ratelimit.allow_explicit_clock = on")
        result = []
        for sql in READS:
            cur.execute(sql)
            result.append(cur.fetchone()[0])
    conn.close()
    return result


def with_state(name):
    conn = pg_connect(name)
    with conn.cursor() as cur:
        cur.execute("SET pg_ratelimit.allow_explicit_clock = on")
        cur.execute("SELECT rl_take('user:1', 10, 0.001, 4, 0), rl_take('user:2', 3, 0.001, 3, 0)")
        cur.execute("SELECT rl_spend('team:7', 'month', 100, 42, 0), rl_spend('team:7', 'day', 10, 2.5, 0)")
    conn.close()


@pytest.mark.parametrize("form", ["plain", "custom"])
@pytest.mark.parametrize("target", ["new database", "extension already created"])
def test_a_restored_dump_answers_like_the_original(tmp_path, form, target):
    if EDITION == "sql" and target != "new database":
        pytest.skip("the SQL edition's objects are in the dump: restore it into an empty database, or its state "
                    "tables' rows alone into an install (tests/test_sql_edition.py)")
    with pg_database("rl_dump") as source, pg_database("rl_restore", extension=(target != "new database")) as copy:
        with_state(source)
        before = answers(source)
        assert before[2]["used"] == 42.5 and before[1]["admitted"] is False  # the state is really there
        dump = str(tmp_path / "dump")
        if form == "plain":
            subprocess.run([f"{BIN}/pg_dump", "-Fp", "-f", dump, source], check=True)
            subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", copy, "-f", dump], check=True,
                           capture_output=True)
        else:
            subprocess.run([f"{BIN}/pg_dump", "-Fc", "-f", dump, source], check=True)
            subprocess.run([f"{BIN}/pg_restore", "--exit-on-error", "-d", copy, dump], check=True, capture_output=True)
        assert answers(copy) == before
