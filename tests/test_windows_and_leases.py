"""Sliding windows, leases and charges through real clients: exact totals and caps under
concurrency (PostgreSQL sessions, SQLite processes), checked from outside while they run;
rollback, read-only transactions, the bound on entries per key, and the sweep. Each
answer's exact values are in the conformance list (tests/test_conformance.py)."""
import json
import multiprocessing
import random
import sqlite3
import threading
import time

import pytest

from conftest import SQLITE_EXT, assert_refused_read_only, one, pg_connect, run_sessions, sqlite_connect

MAX_IN_FLIGHT = 4



class Watcher(threading.Thread):
    """Reads rl_in_flight over a connection of its own, from outside the workers, until
    stopped; keeps the most it saw and how often it looked. Entering returns once its
    first read is done, so the workers start under its eye; an error in the thread is
    raised on leaving, never lost as a silent 0."""

    def __init__(self, connect, read):
        super().__init__()
        self.connect, self.read = connect, read
        self.stop, self.looking, self.error = threading.Event(), threading.Event(), None
        self.most, self.reads = 0, 0

    def run(self):
        try:
            conn = self.connect()
            while not self.stop.is_set():
                self.most = max(self.most, self.read(conn))
                self.reads += 1
                self.looking.set()
            conn.close()
        except BaseException as e:  # noqa: BLE001 -- handed to the test's thread in __exit__
            self.error = e
            self.looking.set()

    def __enter__(self):
        self.start()
        if not self.looking.wait(60) or self.error is not None:
            self.__exit__(None, None, None)  # stops it; raises its error if it had one
            raise AssertionError("the watcher's first read did not finish in 60 s")
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join()
        if self.error is not None and exc[0] is None:
            raise self.error


class HeldCounter:
    """Leases the workers hold by their own count: raised after an acquire returns, lowered
    before a release is sent, so it never exceeds what the database holds."""

    def __init__(self):
        self.lock = threading.Lock()
        self.held = self.most = 0

    def change(self, by):
        with self.lock:
            self.held += by
            self.most = max(self.most, self.held)


def test_sixteen_sessions_never_hold_more_than_max_in_flight(pg_store_db):
    conn, name = pg_store_db
    key = f"jobs-{name}"
    held, acquired = HeldCounter(), [0] * 16

    def work(i, c):
        rng = random.Random(i)
        for _ in range(25):
            r = one(c, "SELECT rl_acquire(%s, %s, 30)", (key, MAX_IN_FLIGHT))
            if not r["admitted"]:
                time.sleep(rng.random() * 0.002)
                continue
            acquired[i] += 1
            held.change(+1)
            assert r["in_flight"] <= MAX_IN_FLIGHT
            time.sleep(rng.random() * 0.003)
            held.change(-1)
            assert one(c, "SELECT rl_release(%s, %s)", (key, r["lease"])) is True

    with Watcher(lambda: pg_connect(name), lambda c: one(c, "SELECT rl_in_flight(%s)", (key,))) as watcher:
        run_sessions(name, 16, work)
    print(f"\nacquired {sum(acquired)}, most held {held.most}; the watcher read {watcher.reads} times, most {watcher.most}")
    assert held.most <= MAX_IN_FLIGHT and watcher.most <= MAX_IN_FLIGHT
    assert watcher.most >= 2 and sum(acquired) >= 25, "the sessions really overlapped"
    assert one(conn, "SELECT rl_in_flight(%s)", (key,)) == 0, "every lease was released"


@pytest.mark.parametrize("sql", [
    "SELECT rl_window('hot-{n}', 100, 3600)",
    "SELECT rl_take_all('[{{\"key\": \"hot-{n}\", \"limit\": 100, \"window_seconds\": 3600}}]')",
])
def test_sixteen_sessions_admit_exactly_the_window(pg_store_db, sql):
    conn, name = pg_store_db
    admitted = [0] * 16

    def work(i, c):
        for _ in range(40):
            admitted[i] += one(c, sql.format(n=name))["admitted"]

    run_sessions(name, 16, work)
    assert sum(admitted) == 100
    assert one(conn, "SELECT rl_window_peek(%s, 100, 3600)", (f"hot-{name}",))["remaining"] == 0


def _acquire_in_a_process(args):
    path, calls, seed = args
    rng = random.Random(seed)
    conn = sqlite_connect(path, timeout=60)
    acquired = 0
    for _ in range(calls):
        r = json.loads(conn.execute("SELECT rl_acquire('jobs', ?, 30)", (MAX_IN_FLIGHT,)).fetchone()[0])
        if r["admitted"]:
            acquired += 1
            time.sleep(rng.random() * 0.002)
            assert conn.execute("SELECT rl_release('jobs', ?)", (r["lease"],)).fetchone()[0] == 1
    return acquired


def test_eight_processes_never_hold_more_than_max_in_flight(tmp_path):
    path = str(tmp_path / "leases.db")
    setup = sqlite3.connect(path)
    setup.execute("PRAGMA journal_mode=wal")
    setup.close()
    # The state tables are made first, so the watcher only reads: a read of a writable file
    # without them creates them, and a writer waiting in SQLite's busy handler can wait out
    # eight processes that write in a loop (it once read once, after they had all finished).
    made = sqlite_connect(path)
    assert made.execute("SELECT rl_in_flight('jobs')").fetchone()[0] == 0
    assert made.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN "
                        "('rl_bucket', 'rl_entries', 'rl_meta')").fetchone()[0] == 3
    made.close()
    # the workers are forked before the watcher's thread starts (a fork copies no thread)
    with multiprocessing.get_context("fork").Pool(8) as pool:
        with Watcher(lambda: sqlite_connect(path, timeout=60),
                     lambda c: c.execute("SELECT rl_in_flight('jobs')").fetchone()[0]) as watcher:
            acquired = pool.map(_acquire_in_a_process, [(path, 150, seed) for seed in range(8)])
    print(f"\nacquired {sum(acquired)}; the watcher read {watcher.reads} times, most {watcher.most}")
    assert watcher.most <= MAX_IN_FLIGHT and watcher.most >= 2
    assert sum(acquired) >= 150
    assert sqlite_connect(path).execute("SELECT rl_in_flight('jobs')").fetchone()[0] == 0


def _window_in_a_process(args):
    path, calls = args
    conn = sqlite_connect(path, timeout=60)
    return sum(json.loads(conn.execute("SELECT rl_window('hot', 200, 3600)").fetchone()[0])["admitted"]
               for _ in range(calls))


def test_eight_processes_admit_exactly_the_window(tmp_path):
    path = str(tmp_path / "window.db")
    with multiprocessing.get_context("fork").Pool(8) as pool:
        admitted = pool.map(_window_in_a_process, [(path, 60)] * 8)
    assert sum(admitted) == 200


def test_a_lease_taken_in_a_rolled_back_transaction_was_never_held(pg_db):
    _, name = pg_db
    tx = pg_connect(name, autocommit=False)
    assert one(tx, "SELECT rl_acquire('once', 1, 60)")["admitted"] is True
    tx.rollback()
    assert one(tx, "SELECT rl_in_flight('once')") == 0
    lease = one(tx, "SELECT rl_acquire('once', 1, 60)")
    tx.commit()
    assert one(tx, "SELECT rl_acquire('once', 1, 60)")["admitted"] is False
    tx.rollback()
    assert one(tx, "SELECT rl_release('once', %s)", (lease["lease"],)) is True
    tx.commit()
    tx.close()


def test_read_only_transaction_refuses_changes_and_answers_reads(pg_db):
    conn, _ = pg_db
    with conn.cursor() as cur:
        cur.execute("SELECT rl_window('ro', 5, 60, 2, 0), rl_acquire('ro', 3, 60, 0)")
        cur.execute("BEGIN READ ONLY")
        for sql, function in (("SELECT rl_window('ro', 5, 60)", "rl_window"),
                              ("SELECT rl_acquire('ro', 3, 60)", "rl_acquire"),
                              ("SELECT rl_release('ro', '0-1', 0)", "rl_release"),
                              ("SELECT rl_charge_budget('ro', 'day', 1)", "rl_charge_budget")):
            assert_refused_read_only(cur, sql, function)
        cur.execute("SELECT rl_window_peek('ro', 5, 60, 1, 0) ->> 'remaining', rl_in_flight('ro', 0)")
        assert cur.fetchone() == ("2", 1)
        cur.execute("ROLLBACK")


def test_sqlite_read_only_database_answers_reads(tmp_path):
    path = tmp_path / "ro.db"
    writer = sqlite_connect(str(path))
    writer.execute("SELECT rl_window('ro', 5, 60, 2, 0), rl_acquire('ro', 3, 60, 0)")
    writer.close()
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.enable_load_extension(True)
    conn.load_extension(SQLITE_EXT)
    assert json.loads(conn.execute("SELECT rl_window_peek('ro', 5, 60, 1, 0)").fetchone()[0])["remaining"] == 2
    assert conn.execute("SELECT rl_in_flight('ro', 0)").fetchone()[0] == 1
    with pytest.raises(sqlite3.OperationalError, match="^rl_acquire: cannot change rate-limit state"):
        conn.execute("SELECT rl_acquire('ro', 3, 60, 0)")


FULL_WINDOW = ",".join(["1"] * 10_000)  # 10 000 entries, 1 ms apart, from 1 ms


def test_sqlite_window_bound_is_an_error_that_writes_nothing(sqlite_db):
    conn, _ = sqlite_db
    conn.execute("SELECT rl_window('warm', 1, 1)")  # creates the state tables
    conn.execute("INSERT INTO rl_entries VALUES ('full', 'window', ?, 10000 + 60000)", (FULL_WINDOW,))
    with pytest.raises(sqlite3.OperationalError, match="^rl_window: the window would hold more than 10000 entries"):
        conn.execute("SELECT rl_window('full', 1e6, 60, 1, 20000)")
    assert conn.execute("SELECT entries FROM rl_entries WHERE key = 'full'").fetchone()[0] == FULL_WINDOW
    # merging into an entry's millisecond needs no new entry, and a refusal stores nothing
    assert json.loads(conn.execute("SELECT rl_window('full', 1e6, 60, 1, 10000)").fetchone()[0])["admitted"]
    assert not json.loads(conn.execute("SELECT rl_window('full', 5, 60, 1, 20000)").fetchone()[0])["admitted"]


def test_postgres_window_bound_is_program_limit_exceeded(pg_db):
    import psycopg2

    conn, _ = pg_db
    with conn.cursor() as cur:
        cur.execute("INSERT INTO ratelimit.rl_entries VALUES ('full', 'window', %s, 10000 + 60000)", (FULL_WINDOW,))
        with pytest.raises(psycopg2.Error) as e:
            cur.execute("SELECT rl_window('full', 1e6, 60, 1, 20000)")
        assert e.value.pgcode == "54000"
        assert e.value.diag.message_primary.startswith("rl_window: the window would hold more than 10000 entries")
        cur.execute("SELECT entries = %s FROM ratelimit.rl_entries WHERE key = 'full'", (FULL_WINDOW,))
        assert cur.fetchone() == (True,)


def test_sweep_removes_empty_windows_and_expired_leases_only(engine):
    # explicit clocks long past: empty now; the real clock: still counting
    engine.call("rl_window", "old", 5, 60, 1, 0)
    engine.call("rl_acquire", "old", 5, 60, 0)
    engine.call("rl_window", "new", 5, 60)
    engine.call("rl_acquire", "new", 5, 60)
    assert engine.call("rl_sweep") == 2
    assert engine.call("rl_in_flight", "new") == 1
    assert engine.call("rl_window_peek", "new", 5, 60)["remaining"] == 3  # 1 recorded, 1 more peeked
