"""SQLite faults reach callers with SQLite's own result codes: lock contention as
SQLITE_BUSY or SQLITE_LOCKED, a full database or file system as SQLITE_FULL, each with the
function's name in the message. What a failed call answers is never an admission that was
not written, the file stays intact, and calls work again once the cause is gone."""
import json
import os
import sqlite3
import subprocess

import pytest

from conftest import SQLITE_EXT, sqlite_connect

SQLITE_BUSY, SQLITE_LOCKED, SQLITE_FULL = 5, 6, 13
NOW = 1_000_000
POLICY = '{"limits": [{"burst": 5, "refill_per_minute": 1}]}'


def state_changing_calls(tag):
    """One call of each function that writes state, each on a key of its own so that each
    must write: (function, sql, parameters, the key its rows hold)."""
    calls = [
        ("rl_take", "SELECT rl_take(?, 5, 1, 1, ?)"),
        ("rl_charge", "SELECT rl_charge(?, 5, 1, 1, ?)"),
        ("rl_spend", "SELECT rl_spend(?, 'day', 5, 1, ?)"),
        ("rl_charge_budget", "SELECT rl_charge_budget(?, 'day', 1, ?)"),
        ("rl_window", "SELECT rl_window(?, 5, 60, 1, ?)"),
        ("rl_acquire", "SELECT rl_acquire(?, 2, 60, ?)"),
        ("rl_penalize", "SELECT rl_penalize(?, 0, 60, 3600, 3600, ?)"),
        ("rl_block", "SELECT rl_block(?, 60, ?)"),
        ("rl_take_all", "SELECT rl_take_all(?, ?)"),
        ("rl_check", "SELECT rl_check('fault', ?, 1, NULL, ?)"),
        ("rl_policy_set", "SELECT rl_policy_set(?, ?)"),
    ]
    out = []
    for function, sql in calls:
        key = f"{tag}-{function}-" + "k" * 100  # long keys fill pages sooner
        params = (key, NOW)
        if function == "rl_take_all":
            limits = [{"key": key, "burst": 5, "refill_per_minute": 1}, {"key": key, "period": "day", "quota": 5}]
            params = (json.dumps(limits), NOW)
        elif function == "rl_policy_set":
            params = (key, POLICY)
        out.append((function, sql, params, key))
    return out


def answered(conn, sql, params):
    """The call's answer, or its SQLite error as (primary code, message)."""
    try:
        return conn.execute(sql, params).fetchone()[0]
    except sqlite3.Error as e:
        return (e.sqlite_errorcode & 0xFF, str(e))


def assert_refused_with(code, words, outcomes):
    for (function, *_), outcome in outcomes:
        assert isinstance(outcome, tuple), f"{function} answered {outcome!r}"
        assert outcome[0] == code and outcome[1].startswith(f"{function}: {words}"), (function, outcome)


def test_lock_contention_is_sqlite_busy(tmp_path):
    path = str(tmp_path / "busy.db")
    holder, caller = sqlite_connect(path), sqlite_connect(path, timeout=0)
    holder.execute("SELECT rl_policy_set('fault', ?)", (POLICY,))
    holder.execute("SELECT rl_take('seen', 5, 1, 1, ?)", (NOW,))
    holder.execute("BEGIN IMMEDIATE")
    calls = state_changing_calls("busy")
    assert_refused_with(SQLITE_BUSY, "database is locked", [(c, answered(caller, c[1], c[2])) for c in calls])
    # reads go on while another connection holds the write lock
    assert json.loads(answered(caller, "SELECT rl_peek('seen', 5, 1, 0, ?)", (NOW,)))["remaining"] == 4
    holder.execute("COMMIT")
    for function, sql, params, _ in calls:
        assert not isinstance(answered(caller, sql, params), tuple), function


def test_a_table_held_in_a_shared_cache_is_sqlite_locked():
    uri = "file:rl_locked?mode=memory&cache=shared"

    def connect():
        conn = sqlite3.connect(uri, uri=True, timeout=0, isolation_level=None)
        conn.enable_load_extension(True)
        conn.load_extension(SQLITE_EXT)
        return conn

    holder, caller = connect(), connect()
    holder.execute("SELECT rl_policy_set('fault', ?)", (POLICY,))
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("SELECT rl_take('held', 5, 1, 1, ?)", (NOW,))
    outcomes = [(c, answered(caller, c[1], c[2])) for c in state_changing_calls("locked")]
    assert_refused_with(SQLITE_LOCKED, "database table is locked", outcomes)
    holder.execute("COMMIT")
    assert json.loads(answered(caller, "SELECT rl_take('held', 5, 1, 1, ?)", (NOW,)))["remaining"] == 3


def fill_until_full(conn):
    """Takes on new keys until the database cannot grow; returns the admissions answered."""
    admitted = []
    for i in range(100_000):
        key = f"fill-{i}-" + "f" * 200
        outcome = answered(conn, "SELECT rl_take(?, 5, 1, 1, ?)", (key, NOW))
        if isinstance(outcome, tuple):
            assert outcome[0] == SQLITE_FULL and outcome[1].startswith("rl_take: database or disk is full"), outcome
            return admitted
        assert json.loads(outcome)["admitted"]
        admitted.append(key)
    raise AssertionError("the database never filled up")


def rows_naming(conn, key):
    """The state rows whose key holds `key` (rl_check's key is made from the subject)."""
    tables = [("rl_bucket", "key"), ("rl_budget", "key"), ("rl_entries", "key"), ("rl_policy", "name")]
    return sum(conn.execute(f"SELECT count(*) FROM {t} WHERE instr({c}, ?) > 0", (key,)).fetchone()[0] for t, c in tables)


def check_full_then_freed(conn, path, make_full, make_room, all_refused):
    """Fills the database, then makes it full (`make_full`): each state-changing call then
    fails with SQLITE_FULL and writes nothing, or (only where `all_refused` is False: space
    a page or a reused log still has) answers and is written."""
    conn.execute("SELECT rl_policy_set('fault', ?)", (POLICY,))
    admitted = fill_until_full(conn)
    make_full()
    calls = state_changing_calls("full")
    outcomes = [(c, answered(conn, c[1], c[2])) for c in calls]
    failed = [c[0] for c, outcome in outcomes if isinstance(outcome, tuple)]
    print(f"full: {len(admitted)} rows filled it; {len(failed)} of {len(calls)} calls then failed: {failed}")
    assert failed, "the database was not full"
    if all_refused:
        assert_refused_with(SQLITE_FULL, "database or disk is full", outcomes)
    for (function, _, _, key), outcome in outcomes:
        if isinstance(outcome, tuple):
            assert outcome[0] == SQLITE_FULL and outcome[1].startswith(f"{function}: database or disk is full")
            assert rows_naming(conn, key) == 0, f"{function} failed but wrote"
        else:
            assert rows_naming(conn, key) > 0, f"{function} answered but wrote nothing"
    assert not conn.in_transaction
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    # every admission answered was written
    stored = {r[0] for r in conn.execute("SELECT key FROM rl_bucket WHERE key LIKE 'fill-%'")}
    assert stored == set(admitted)
    make_room()
    for function, sql, params, _ in state_changing_calls("freed"):
        assert not isinstance(answered(conn, sql, params), tuple), function
    fresh = sqlite_connect(path)
    assert fresh.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert fresh.execute("SELECT count(*) FROM rl_bucket WHERE key LIKE 'fill-%'").fetchone()[0] == len(admitted)
    fresh.close()


def test_a_database_at_its_page_limit_is_sqlite_full(tmp_path):
    path = str(tmp_path / "full.db")
    conn = sqlite_connect(path)
    conn.execute("SELECT rl_take('first', 5, 1, 1, ?)", (NOW,))
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages + 8}")
    check_full_then_freed(conn, path, lambda: None, lambda: conn.execute("PRAGMA max_page_count = 1000000"), False)


@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_a_full_file_system_is_sqlite_full(tmp_path, journal):
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    try:
        path = str(mount / "state.db")
        conn = sqlite_connect(path)
        conn.execute(f"PRAGMA journal_mode = {journal}")
        conn.execute("SELECT rl_take('first', 5, 1, 1, ?)", (NOW,))
        # room for a few dozen rows, then none: after filling, the last free blocks go too
        filler, rest = mount / "filler", mount / "rest"
        with open(filler, "wb") as f:
            free = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
            f.write(b"\0" * max(0, free - 64 * 1024))

        def take_every_block():
            with open(rest, "wb", buffering=0) as f:
                with pytest.raises(OSError):
                    while True:
                        f.write(b"\0" * 512)

        def make_room():
            filler.unlink()
            rest.unlink()

        # a rollback journal needs new blocks for every write; a WAL may reuse its own
        check_full_then_freed(conn, path, take_every_block, make_room, all_refused=journal == "delete")
        conn.close()
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_read_only_database_is_sqlite_readonly(tmp_path):
    path = str(tmp_path / "ro.db")
    sqlite_connect(path).execute("SELECT rl_take('k', 5, 1, 1, ?)", (NOW,))
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    conn.enable_load_extension(True)
    conn.load_extension(SQLITE_EXT)
    outcome = answered(conn, "SELECT rl_take('k', 5, 1, 1, ?)", (NOW,))
    assert outcome == (8, "rl_take: cannot change rate-limit state in a read-only database or transaction")
    assert json.loads(answered(conn, "SELECT rl_peek('k', 5, 1, 0, ?)", (NOW,)))["remaining"] == 4


def test_a_query_only_connection_is_sqlite_readonly_and_writes_nothing(tmp_path):
    path = str(tmp_path / "query_only.db")
    conn = sqlite_connect(path)
    conn.execute("SELECT rl_take('k', 5, 1, 1, ?)", (NOW,))
    conn.execute("PRAGMA query_only = 1")
    for sql in ("SELECT rl_take('k', 5, 1, 1, ?)", "SELECT rl_take('new', 5, 1, 1, ?)",
                "SELECT rl_spend('b', 'day', 10, 1, ?)"):
        function = sql.split("(")[0].split()[-1]
        outcome = answered(conn, sql, (NOW,))
        assert outcome == (8, f"{function}: cannot change rate-limit state in a read-only database or transaction")
    conn.execute("PRAGMA query_only = 0")
    assert json.loads(answered(conn, "SELECT rl_peek('k', 5, 1, 0, ?)", (NOW,)))["remaining"] == 4
    assert conn.execute("SELECT count(*) FROM rl_bucket").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM rl_budget").fetchone()[0] == 0
