"""Crash recovery: kill -9 in the middle of a load; afterwards every admission a client
saw is still counted, and the whole run never admits more than the limit allows."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import EDITION, ROOT, SQLITE_EXT, amcheck_state_tables, pg_connect, pg_database, sqlite_connect

PG_LIMIT = 1_000_000  # more than the load admits before the crash, so it dies mid-load
CLUSTER = ["bash", os.path.join(ROOT, "scripts", "pg_cluster.sh")]


def test_postgres_kill_9_loses_no_seen_admission():
    """Half the sessions that take write the bucket row in the heap directly
    (pg_ratelimit.direct_writes), half by the guarded UPDATE; after recovery amcheck finds
    the state tables and their keys intact."""
    with pg_database("rl_crash") as name:
        crash_mid_load(name)


def crash_mid_load(name):
    import psycopg2

    seen = {"take": 0, "spend": 0}
    lock = threading.Lock()
    stop = threading.Event()

    def load(i):
        try:
            conn = pg_connect(name)
            cur = conn.cursor()
            if EDITION == "native":
                cur.execute(f"SET pg_ratelimit.direct_writes = {'on' if i % 4 == 1 else 'off'}")
            while not stop.is_set():
                kind = "take" if i % 2 else "spend"
                sql = (f"SELECT rl_take('crash', {PG_LIMIT}, 0.000001)" if kind == "take"
                       else f"SELECT rl_spend('crash', 'month', {PG_LIMIT}, 1)")
                cur.execute(sql)
                if cur.fetchone()[0]["admitted"]:
                    with lock:
                        seen[kind] += 1
        except psycopg2.Error:
            return  # the server went away under us

    threads = [threading.Thread(target=load, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    # crash once both kinds of call are under way (not after a fixed second a busy machine
    # can spend connecting)
    deadline = time.monotonic() + 30
    while min(seen.values()) < 50 and time.monotonic() < deadline:
        time.sleep(0.05)
    subprocess.run(CLUSTER + ["crash"], check=True)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    subprocess.run(CLUSTER + ["start"], check=True, capture_output=True)

    conn = pg_connect(name)
    cur = conn.cursor()
    cur.execute("SELECT level FROM ratelimit.rl_bucket WHERE key = 'crash'")
    taken = PG_LIMIT - cur.fetchone()[0]
    cur.execute("SELECT used / 1000000 FROM ratelimit.rl_budget WHERE key = 'crash'")
    spent = cur.fetchone()[0]
    print(f"\npostgres crash: clients saw {seen}; after recovery {round(taken)} taken, {spent} spent")
    assert seen["take"] > 0 and seen["spend"] > 0, "the load ran before the crash"
    assert round(taken) >= seen["take"] and spent >= seen["spend"], "a committed admission was lost"
    # the rest of the run: never more than the limit in total
    assert seen["take"] < PG_LIMIT and seen["spend"] < PG_LIMIT, "the crash came before the limits ran out"
    # the rest of the run: exactly what is left can still be taken, then nothing
    for call in (f"rl_take('crash', {PG_LIMIT}, 0.000001, %s)", f"rl_spend('crash', 'month', {PG_LIMIT}, %s)"):
        left = PG_LIMIT - (round(taken) if "take" in call else spent)
        cur.execute(f"SELECT ({call}) ->> 'admitted'", (left,))
        assert cur.fetchone()[0] == "true"
        cur.execute(f"SELECT ({call}) ->> 'admitted'", (1,))
        assert cur.fetchone()[0] == "false"
    amcheck_state_tables(cur)
    conn.close()


WRITER = r"""
import json, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
conn.enable_load_extension(True)
conn.load_extension(sys.argv[2])
n = 0
while True:
    n += 1
    take = json.loads(conn.execute("SELECT rl_take('crash', 1000, 0.000001)").fetchone()[0])
    spend = json.loads(conn.execute("SELECT rl_spend('k' || ?, 'day', 1)", (n,)).fetchone()[0])
    sys.stdout.write(("T" if take["admitted"] else "t") + ("S" if spend["admitted"] else "s") + "\n")
    sys.stdout.flush()
"""


@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_sqlite_kill_9_mid_write_loop(tmp_path, journal):
    path = str(tmp_path / "crash.db")
    conn = sqlite_connect(path)
    conn.execute(f"PRAGMA journal_mode={journal}")
    conn.close()
    child = subprocess.Popen(["/usr/bin/python3", "-c", WRITER, path, SQLITE_EXT],
                             stdout=subprocess.PIPE, text=True)
    lines = []
    deadline = time.time() + 30
    while len(lines) < 300 and time.time() < deadline:
        lines.append(child.stdout.readline())
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    seen_takes = sum(line.startswith("T") for line in lines)
    seen_spends = sum(line[1:2] == "S" for line in lines)

    conn = sqlite_connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    level = conn.execute("SELECT level FROM rl_bucket WHERE key = 'crash'").fetchone()[0]
    budgets = conn.execute("SELECT count(*) FROM rl_budget").fetchone()[0]
    print(f"\nsqlite {journal} crash: saw {seen_takes} takes, {seen_spends} spends; stored {round(1000 - level)} taken, {budgets} budgets")
    assert seen_takes >= 300 - 1
    assert round(1000 - level) >= seen_takes and budgets >= seen_spends
    after = 0
    while json.loads(conn.execute("SELECT rl_take('crash', 1000, 0.000001)").fetchone()[0])["admitted"]:
        after += 1
    assert seen_takes + after <= 1000
    assert round(1000 - level) + after == 1000
