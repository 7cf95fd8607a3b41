"""Soak and sweep: 1,000,000 distinct keys taken once each on an explicit clock an hour in
the past, then rl_sweep in bounded batches while another connection keeps taking.
Reports bytes on disk per live key, sweep time, the longest batch, and the concurrent
taker's worst latency, for SQLite and PostgreSQL. Writes bench/results/soak.md.

Run through scripts/soak.sh (it builds, installs and starts what this needs)."""
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from conftest import pg_connect, sqlite_connect  # noqa: E402

KEYS = int(os.environ.get("RL_SOAK_KEYS", "1000000"))
BATCH = int(os.environ.get("RL_SOAK_BATCH", "10000"))
SQLITE_PAUSE = float(os.environ.get("RL_SOAK_SQLITE_PAUSE_MS", "10")) / 1000
HOUR_AGO = int(time.time() * 1000) - 3_600_000


class Taker(threading.Thread):
    """Keeps calling rl_take on keys of its own while the sweep runs; records latencies."""

    def __init__(self, connect, call):
        super().__init__(daemon=True)
        self.connect, self.call, self.latencies, self.done = connect, call, [], threading.Event()
        self.ready = threading.Event()

    def run(self):
        conn = self.connect()  # a connection of its own, made in its own thread
        self.ready.set()
        i = 0
        while not self.done.is_set():
            i += 1
            start = time.perf_counter()
            self.call(conn, f"live:{i % 1000}")
            self.latencies.append(time.perf_counter() - start)

    def start(self):
        super().start()
        self.ready.wait()


def sweep_in_batches(sweep, pause=0.0):
    """Sweeps until a batch comes back short. `pause` sleeps between batches: SQLite's
    write lock has no queue, and a waiting writer's busy handler polls with growing
    sleeps, so a sweeper that takes the lock again at once can starve it."""
    batches, start = [], time.perf_counter()
    while True:
        t = time.perf_counter()
        removed = sweep()
        batches.append(time.perf_counter() - t)
        if removed < BATCH:
            return time.perf_counter() - start, batches
        time.sleep(pause)


def soak_sqlite(tmp):
    path = os.path.join(tmp, "soak.db")
    conn = sqlite_connect(path)
    conn.execute("PRAGMA journal_mode=wal")
    conn.execute("PRAGMA synchronous=normal")
    t = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
        "SELECT count(rl_take('soak:' || i, 10, 60, 1, ?)) FROM n", (KEYS, HOUR_AGO)).fetchone()
    conn.execute("COMMIT")
    fill = time.perf_counter() - t
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    rows = conn.execute("SELECT count(*) FROM rl_bucket").fetchone()[0]
    size = os.path.getsize(path)

    taker = Taker(lambda: sqlite_connect(path), lambda c, k: c.execute("SELECT rl_take(?, 1000000, 60)", (k,)).fetchone())
    taker.start()
    total, batches = sweep_in_batches(lambda: conn.execute("SELECT rl_sweep(NULL, ?)", (BATCH,)).fetchone()[0],
                                      pause=SQLITE_PAUSE)
    taker.done.set()
    taker.join()
    left = conn.execute("SELECT count(*) FROM rl_bucket WHERE key LIKE 'soak:%'").fetchone()[0]
    return dict(engine="SQLite (WAL, synchronous=NORMAL)", rows=rows, fill=fill, bytes_per_key=size / rows,
                sweep=total, batches=batches, left=left, taker=taker.latencies)


def soak_postgres():
    conn = pg_connect("postgres")
    cur = conn.cursor()
    cur.execute("DROP DATABASE IF EXISTS rl_soak")
    cur.execute("CREATE DATABASE rl_soak")
    conn.close()
    conn = pg_connect("rl_soak")
    cur = conn.cursor()
    cur.execute("CREATE EXTENSION pg_ratelimit")
    cur.execute("SET pg_ratelimit.allow_explicit_clock = on")
    t = time.perf_counter()
    cur.execute("SELECT count(rl_take('soak:' || g, 10, 60, 1, %s)) FROM generate_series(1, %s) g", (HOUR_AGO, KEYS))
    fill = time.perf_counter() - t
    cur.execute("VACUUM ANALYZE ratelimit.rl_bucket")
    cur.execute("SELECT count(*), pg_total_relation_size('ratelimit.rl_bucket') FROM ratelimit.rl_bucket")
    rows, size = cur.fetchone()

    def pg_take(c, key):
        c.execute("SELECT rl_take(%s, 1000000, 60)", (key,))
        c.fetchone()

    taker = Taker(lambda: pg_connect("rl_soak").cursor(), pg_take)
    taker.start()

    def sweep():
        cur.execute("SELECT rl_sweep(NULL, %s)", (BATCH,))
        return cur.fetchone()[0]

    total, batches = sweep_in_batches(sweep)
    taker.done.set()
    taker.join()
    cur.execute("SELECT count(*) FROM ratelimit.rl_bucket WHERE key LIKE 'soak:%'")
    left = cur.fetchone()[0]
    conn.close()
    admin = pg_connect("postgres")
    admin.cursor().execute("DROP DATABASE rl_soak WITH (FORCE)")
    return dict(engine="PostgreSQL 15 (synchronous_commit on)", rows=rows, fill=fill, bytes_per_key=size / rows,
                sweep=total, batches=batches, left=left, taker=taker.latencies)


def report(results):
    lines = [
        f"# Soak and sweep: {KEYS:,} keys, sweep batches of {BATCH:,} rows "
        f"(SQLite pauses {SQLITE_PAUSE * 1000:.0f} ms between batches)",
        "",
        "| engine | keys stored | fill time | bytes on disk per key | sweep time | batches | longest batch | "
        "keys left | concurrent takes | taker p50 | taker max |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lat = sorted(r["taker"]) or [0.0]
        lines.append(
            f"| {r['engine']} | {r['rows']:,} | {r['fill']:.1f} s | {r['bytes_per_key']:.0f} | {r['sweep']:.1f} s | "
            f"{len(r['batches'])} | {max(r['batches']) * 1000:.0f} ms | {r['left']} | {len(lat):,} | "
            f"{statistics.median(lat) * 1000:.2f} ms | {lat[-1] * 1000:.0f} ms |")
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "soak.md"), "w") as f:
        f.write(text)
    print(text)


def main():
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        results.append(soak_sqlite(tmp))
    results.append(soak_postgres())
    report(results)
    for r in results:
        assert r["left"] == 0, f"{r['engine']}: {r['left']} soak keys left after the sweep"


if __name__ == "__main__":
    main()
