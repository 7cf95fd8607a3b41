"""SQLite-specific behaviour of the loadable extension, through Python's sqlite3 module
and the sqlite3 shell."""
import json
import multiprocessing
import os
import sqlite3
import subprocess

import pytest

from conftest import INTERNAL, SQLITE_EXT, STATEFUL, sqlite_connect


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
    assert tables() == {"rl_bucket", "rl_budget", "rl_entries", "rl_policy", "rl_meta", "rl_usage", "rl_setting"}


def test_tables_gone_under_held_statements_are_made_again(sqlite_db):
    """The extension keeps each statement prepared for the connection's life; when the
    tables those statements read vanish (created in a transaction that rolled back, or
    dropped by another connection), the next call makes them again and answers from a
    fresh state, instead of failing on a statement prepared against tables that are gone."""
    conn, path = sqlite_db
    conn.execute("BEGIN")
    assert take(conn, args=("gone", 3, 0.001))["remaining"] == 2  # prepares, and creates the tables
    conn.execute("ROLLBACK")
    assert take(conn, args=("gone", 3, 0.001))["remaining"] == 2
    assert take(conn, args=("gone", 3, 0.001))["remaining"] == 1
    other = sqlite3.connect(path)
    other.execute("DROP TABLE rl_bucket")
    other.commit()
    other.close()
    assert take(conn, args=("gone", 3, 0.001))["remaining"] == 2
    assert conn.execute("SELECT count(*) FROM rl_bucket").fetchone()[0] == 1


def read_only(path):
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.enable_load_extension(True)
    conn.load_extension(SQLITE_EXT)
    return conn


def test_read_only_database_refuses_changes_and_answers_peeks(tmp_path):
    path = tmp_path / "ro.db"
    writer = sqlite_connect(str(path))
    writer.execute("SELECT rl_take('k', 3, 0.001, 2, 0), rl_spend('k', 'day', 5, 2, 0)")
    writer.close()
    conn = read_only(path)
    for sql, function in (("SELECT rl_take('k', 3, 60)", "rl_take"), ("SELECT rl_spend('k', 'day', 5)", "rl_spend"),
                          ("SELECT rl_refund('k', 3, 60, 1)", "rl_refund"), ("SELECT rl_reset('k')", "rl_reset")):
        with pytest.raises(sqlite3.Error, match=f"^{function}: cannot change rate-limit state in a read-only database"):
            conn.execute(sql).fetchone()
    # the reads answer from the stored state (as datasette's read-only endpoint would ask)
    peek = json.loads(conn.execute("SELECT rl_peek('k', 3, 0.001, 1, 0)").fetchone()[0])
    assert (peek["admitted"], peek["remaining"]) == (True, 0)
    budget = json.loads(conn.execute("SELECT rl_budget('k', 'day', 5, 1, 0)").fetchone()[0])
    assert (budget["used"], budget["remaining"]) == (3, 2)
    assert conn.execute("SELECT rl_key('a')").fetchone()[0] == '["a"]'


def test_read_only_database_without_state_peeks_a_full_bucket(tmp_path):
    path = tmp_path / "empty.db"
    sqlite_connect(str(path)).execute("CREATE TABLE t(x)")
    conn = read_only(path)
    assert json.loads(conn.execute("SELECT rl_peek('k', 3, 60, 1, 0)").fetchone()[0])["remaining"] == 2
    assert json.loads(conn.execute("SELECT rl_budget('k', 'day', 5, 1, 0)").fetchone()[0])["used"] == 1


@pytest.mark.parametrize("ddl, use", [
    *[(f"CREATE VIEW v AS SELECT {name}('x') AS r", "SELECT * FROM v") for name in STATEFUL],
    ("CREATE TABLE t(x); CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT rl_take('x', 1, 1); END",
     "INSERT INTO t VALUES (1)"),
])
def test_state_functions_are_direct_only(sqlite_db, ddl, use):
    conn, _ = sqlite_db
    conn.executescript(ddl)
    with pytest.raises(sqlite3.Error, match="unsafe use of rl_"):
        conn.execute(use).fetchall()


@pytest.mark.parametrize("call", [f"{name}({', '.join(['1'] * arity)})" for name, arity in INTERNAL.items()])
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


def test_numbers_given_as_text_are_numbers(sqlite_db):
    conn, _ = sqlite_db
    assert take(conn, "SELECT rl_take(?, ?, ?, ?, ?)", ("k", "3", "60", "1", "0"))["remaining"] == 2
    r = json.loads(conn.execute("SELECT rl_spend('b', 'day', '1', '0.1', 0)").fetchone()[0])
    assert r["used"] == 0.1


def test_sqlite3_close_succeeds_after_calls(tmp_path):
    """sqlite3_close() (unlike _v2) fails with SQLITE_BUSY while any statement of the
    connection is unfinalized: the statements the extension keeps prepared must go when
    the connection closes (the reason rl_statement_cache exists)."""
    import ctypes

    lib = ctypes.CDLL("libsqlite3.so.0")
    lib.sqlite3_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.sqlite3_exec.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.sqlite3_prepare_v2.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                       ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    for name in ["sqlite3_close", "sqlite3_finalize"]:
        getattr(lib, name).argtypes = [ctypes.c_void_p]
    lib.sqlite3_enable_load_extension.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.sqlite3_load_extension.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p]

    def open_with_extension(name):
        db = ctypes.c_void_p()
        assert lib.sqlite3_open(str(tmp_path / name).encode(), ctypes.byref(db)) == 0
        assert lib.sqlite3_enable_load_extension(db, 1) == 0
        assert lib.sqlite3_load_extension(db, SQLITE_EXT.encode(), None, None) == 0
        return db

    db = open_with_extension("close.db")
    for sql in ["SELECT rl_take('k', 3, 60)", "SELECT rl_spend('k', 'day', 3)", "SELECT rl_peek('k', 3, 60)",
                "SELECT rl_budget('k', 'day', 3)", "SELECT rl_refund('k', 3, 60, 1)", "SELECT rl_sweep()",
                """SELECT rl_take_all('[{"key": "k", "burst": 3, "refill_per_minute": 60}]')""",
                "SELECT rl_reset('k')"]:
        assert lib.sqlite3_exec(db, sql.encode(), None, None, None) == 0, sql
    assert lib.sqlite3_close(db) == 0, "SQLITE_BUSY: the extension left a statement unfinalized"

    # the check can fail: one unfinalized statement makes sqlite3_close() refuse
    db = open_with_extension("busy.db")
    stmt = ctypes.c_void_p()
    assert lib.sqlite3_prepare_v2(db, b"SELECT 1", -1, ctypes.byref(stmt), None) == 0
    assert lib.sqlite3_close(db) == 5  # SQLITE_BUSY
    lib.sqlite3_finalize(stmt)
    assert lib.sqlite3_close(db) == 0


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
            messages.add((e.sqlite_errorcode, str(e)))
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
    for code, m in messages:
        assert code & 0xFF == 5 and m.startswith(f"{function}: database is locked") and "BEGIN IMMEDIATE" in m
    # whatever failed wrote nothing: the state holds exactly what was admitted
    check = sqlite_connect(path)
    if function == "rl_take":
        level = check.execute("SELECT level FROM rl_bucket WHERE key = 'hot'").fetchone()[0]
        assert round(200 - level) == admitted
    else:
        used = check.execute("SELECT used FROM rl_budget WHERE key = 'hot'").fetchone()[0]
        assert used == admitted * 1_000_000


def test_version_and_schema_version(sqlite_db):
    from conftest import CARGO_VERSION

    conn, _ = sqlite_db
    assert conn.execute("SELECT rl_version()").fetchone()[0] == CARGO_VERSION
    conn.execute("SELECT rl_take('k', 1, 1)")
    assert conn.execute("SELECT value FROM rl_meta WHERE key = 'schema_version'").fetchone()[0] == "3"


def test_a_database_written_by_0_2_0_keeps_working(tmp_path):
    """tests/fixtures/state-0.2.0.db was written by the 0.2.0 extension at now_ms = 1000:
    rl_take('fixture:bucket', 10, 1, 4), rl_take('fixture:empty', 3, 0.001, 3),
    rl_spend('fixture:budget', 'month', 100, 12.5), rl_spend('fixture:budget', 'day', 10, 0.25)."""
    import shutil

    path = tmp_path / "old.db"
    shutil.copy(os.path.join(os.path.dirname(__file__), "fixtures", "state-0.2.0.db"), path)
    conn = sqlite_connect(str(path))
    call = lambda sql: json.loads(conn.execute(sql).fetchone()[0])  # noqa: E731
    assert call("SELECT rl_peek('fixture:bucket', 10, 1, 1, 1000)")["remaining"] == 5
    assert call("SELECT rl_peek('fixture:bucket', 10, 1, 1, 61000)")["remaining"] == 6  # one token refilled
    assert call("SELECT rl_take('fixture:empty', 3, 0.001, 1, 2000)")["admitted"] is False
    assert call("SELECT rl_budget('fixture:budget', 'month', 100, 0.5, 1000)")["used"] == 13
    assert call("SELECT rl_spend('fixture:budget', 'day', 10, 0.75, 1000)")["used"] == 1
    assert call("SELECT rl_take('fixture:bucket', 10, 1, 5, 1000)")["remaining"] == 1
    assert conn.execute("SELECT rl_reset('fixture:budget')").fetchone()[0] == 2
    # its layout was schema_version 1; the first call that needs a table or column of a later
    # version (rl_budget.quota: the first budget call) brings it to this version's (3)
    assert conn.execute("SELECT value FROM rl_meta WHERE key = 'schema_version'").fetchone()[0] == "3"
    assert call("SELECT rl_window('fixture:window', 1, 60, 1, 1000)")["admitted"] is True
