"""SQLite-specific behaviour of the loadable extension, through Python's sqlite3 module
and the sqlite3 shell."""
import json
import multiprocessing
import os
import sqlite3
import subprocess

import pytest

from conftest import SQLITE_EXT, sqlite_connect


def take(conn, sql="SELECT rl_take(?, ?, ?)", args=("k", 3, 60)):
    return json.loads(conn.execute(sql, args).fetchone()[0])


def test_shell_loads_with_default_entry_point(tmp_path):
    db = tmp_path / "shell.db"
    script = f".load {SQLITE_EXT}\nSELECT rl_take('k', 3, 60, 1, 0);\nSELECT rl_key('a', 'b');\n"
    out = subprocess.run(["sqlite3", str(db)], input=script, capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    assert json.loads(lines[0])["remaining"] == 2
    assert lines[1] == '["a","b"]'


def test_state_persists_across_processes(tmp_path):
    db = str(tmp_path / "persist.db")
    script = f".load {SQLITE_EXT}\nSELECT rl_take('k', 3, 0.001, 1, 1000);\n"
    remaining = []
    for _ in range(4):
        out = subprocess.run(["sqlite3", db], input=script, capture_output=True, text=True, check=True)
        remaining.append(json.loads(out.stdout)["admitted"])
    assert remaining == [True, True, True, False]


def test_memory_database_works():
    conn = sqlite_connect(":memory:")
    assert take(conn)["remaining"] == 2
    assert take(conn)["remaining"] == 1


def test_tables_are_created_on_first_use(sqlite_db):
    conn, _ = sqlite_db
    tables = lambda: {r[0] for r in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    assert tables() == set()
    take(conn)
    assert tables() == {"rl_bucket", "rl_budget"}


def test_read_only_database_gets_a_clear_error(tmp_path):
    path = tmp_path / "ro.db"
    sqlite_connect(str(path)).execute("CREATE TABLE t(x)")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.enable_load_extension(True)
    conn.load_extension(SQLITE_EXT)
    with pytest.raises(sqlite3.Error, match="^rl_take: cannot change rate-limit state in a read-only database"):
        conn.execute("SELECT rl_take('k', 3, 60)").fetchone()
    assert conn.execute("SELECT rl_key('a')").fetchone()[0] == '["a"]'


@pytest.mark.parametrize("ddl, use", [
    ("CREATE VIEW v AS SELECT rl_take('x', 1, 1) AS r", "SELECT * FROM v"),
    ("CREATE VIEW v AS SELECT rl_spend('x', 'day', 1) AS r", "SELECT * FROM v"),
    ("CREATE VIEW v AS SELECT rl_sweep() AS r", "SELECT * FROM v"),
    ("CREATE VIEW v AS SELECT rl_peek('x', 1, 1) AS r", "SELECT * FROM v"),
    ("CREATE VIEW v AS SELECT rl_refund('x', 1, 1, 1) AS r", "SELECT * FROM v"),
    ("CREATE VIEW v AS SELECT rl_refund_budget('x', 'day', 1) AS r", "SELECT * FROM v"),
    ("CREATE VIEW v AS SELECT rl_reset('x') AS r", "SELECT * FROM v"),
    ("CREATE VIEW v AS SELECT rl_take_all('[]') AS r", "SELECT * FROM v"),
    ("CREATE TABLE t(x); CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT rl_take('x', 1, 1); END",
     "INSERT INTO t VALUES (1)"),
])
def test_state_functions_are_direct_only(sqlite_db, ddl, use):
    conn, _ = sqlite_db
    conn.executescript(ddl)
    with pytest.raises(sqlite3.Error, match="unsafe use of rl_"):
        conn.execute(use).fetchall()


@pytest.mark.parametrize("call", ["rl_bucket_guard(1, 0, 0)", "rl_bucket_new_level()", "rl_bucket_new_refilled_at()",
                                  "rl_bucket_new_full_at()", "rl_budget_guard(1, 0)", "rl_budget_new_used()",
                                  "rl_budget_new_resets_at()"])
def test_internal_functions_work_only_inside_their_statements(sqlite_db, call):
    conn, _ = sqlite_db
    with pytest.raises(sqlite3.Error, match="callable only from its own statements"):
        conn.execute(f"SELECT {call}").fetchall()
    conn.execute(f"CREATE VIEW v AS SELECT {call} AS r")
    with pytest.raises(sqlite3.Error, match="unsafe use of rl_"):
        conn.execute("SELECT * FROM v").fetchall()


def test_pure_functions_are_allowed_in_views(sqlite_db):
    conn, _ = sqlite_db
    conn.execute("CREATE VIEW v AS SELECT rl_key('a', 1) AS k, "
                 "rl_headers('{\"admitted\":true,\"remaining\":1,\"limit\":2,\"reset_after_seconds\":3}') AS h")
    k, h = conn.execute("SELECT k, h FROM v").fetchone()
    assert k == '["a","1"]'
    assert json.loads(h)["X-RateLimit-Remaining"] == "1"


@pytest.mark.parametrize("args, message", [
    (("k", "abc", 60), "rl_take: burst must be a finite number greater than 0, got 'abc'"),
    (("k", b"\xff\xfe", 60), "rl_take: burst must be a finite number greater than 0, got a blob of 2 bytes"),
    ((b"\xff", 3, 60), "rl_take: key must be text, got a blob of 1 bytes"),
    (("k", float("nan"), 60), "rl_take: burst must be a finite number greater than 0, got NULL"),
    (("k", float("inf"), 60), "rl_take: burst must be a finite number greater than 0, got Infinity"),
    (("k", 3, 60, 1, "noon"), "rl_take: now_ms must be an integer number of epoch milliseconds from 0 to 253402300799999, got 'noon'"),
])
def test_sqlite_types_are_checked(sqlite_db, args, message):
    conn, _ = sqlite_db
    with pytest.raises(sqlite3.Error) as e:
        conn.execute(f"SELECT rl_take({', '.join('?' * len(args))})", args).fetchone()
    assert str(e.value) == message
    assert conn.execute("SELECT count(*) FROM sqlite_schema WHERE name = 'rl_bucket'").fetchone()[0] == 0


def test_numbers_given_as_text_are_numbers(sqlite_db):
    conn, _ = sqlite_db
    assert take(conn, "SELECT rl_take(?, ?, ?, ?, ?)", ("k", "3", "60", "1", "0"))["remaining"] == 2
    r = json.loads(conn.execute("SELECT rl_spend('b', 'day', '1', '0.1', 0)").fetchone()[0])
    assert r["used"] == 0.1


def test_wrong_argument_count(sqlite_db):
    conn, _ = sqlite_db
    with pytest.raises(sqlite3.Error, match=r"^rl_take: expected 3 to 5 arguments, got 2$"):
        conn.execute("SELECT rl_take('k', 3)").fetchone()
    with pytest.raises(sqlite3.Error, match=r"^rl_sweep: expected 0 to 2 arguments, got 3$"):
        conn.execute("SELECT rl_sweep(1, 2, 3)").fetchone()


def test_call_takes_part_in_the_callers_transaction(sqlite_db):
    conn, _ = sqlite_db
    conn.execute("BEGIN")
    take(conn, args=("tx", 1, 0.001))
    conn.execute("ROLLBACK")
    assert take(conn, args=("tx", 1, 0.001))["admitted"] is True


def _hammer(args):
    path, calls, mode, function = args
    conn = sqlite_connect(path, timeout=60)
    sql = {
        "rl_take": "SELECT rl_take('hot', 200, 0.000001)",
        "rl_spend": "SELECT rl_spend('hot', 'month', 200, 1)",
    }[function]
    if mode == "reads_table":
        sql += " FROM one_row"
    admitted = refused = failed = 0
    messages = set()
    for _ in range(calls):
        try:
            if mode == "immediate":
                conn.execute("BEGIN IMMEDIATE")
            result = json.loads(conn.execute(sql).fetchone()[0])
            if mode == "immediate":
                conn.execute("COMMIT")
            admitted += result["admitted"]
            refused += not result["admitted"]
        except sqlite3.OperationalError as e:
            failed += 1
            messages.add(str(e))
            if conn.in_transaction:
                conn.execute("ROLLBACK")
    return admitted, refused, failed, messages


@pytest.mark.parametrize("function", ["rl_take", "rl_spend"])
@pytest.mark.parametrize("journal", ["wal", "delete"])
@pytest.mark.parametrize("mode", ["bare", "immediate", "reads_table"])
def test_processes_sharing_a_file_never_over_admit(tmp_path, function, journal, mode):
    path = str(tmp_path / "shared.db")
    setup = sqlite3.connect(path)
    setup.execute(f"PRAGMA journal_mode={journal}")
    setup.execute("CREATE TABLE one_row(x)")
    setup.execute("INSERT INTO one_row VALUES (1)")
    setup.commit()
    setup.close()
    processes, calls = 8, 500
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        results = pool.map(_hammer, [(path, calls, mode, function)] * processes)
    admitted = sum(r[0] for r in results)
    refused = sum(r[1] for r in results)
    failed = sum(r[2] for r in results)
    messages = set().union(*(r[3] for r in results))
    print(f"\n{function} {journal} {mode}: admitted {admitted}, refused {refused}, failed {failed}")
    assert admitted + refused + failed == processes * calls
    assert admitted <= 200
    if mode in ("bare", "immediate"):
        # a bare call waits for the write lock within the busy timeout: nothing fails
        assert (admitted, failed) == (200, 0), messages
    for m in messages:
        assert m.startswith(f"{function}: database is locked") and "BEGIN IMMEDIATE" in m
    # whatever failed wrote nothing: the state holds exactly what was admitted
    check = sqlite_connect(path)
    if function == "rl_take":
        level = check.execute("SELECT level FROM rl_bucket WHERE key = 'hot'").fetchone()[0]
        assert round(200 - level) == admitted
    else:
        used = check.execute("SELECT used FROM rl_budget WHERE key = 'hot'").fetchone()[0]
        assert used == admitted * 1_000_000
