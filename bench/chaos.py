"""Chaos: clients taking and spending on a few keys, directly and through pgbouncer (the
native extension's table store), directly on the SQL edition and on the memory store (a
database each), while a driver kills backends with SIGKILL, restarts the server (fast,
fast with a backend killed during the shutdown, before the memory store's save, and
immediate) and stops pgbouncer. From the clients' own records it checks that no key
admitted more than its limit, that no admission a client saw is lost, and that every
error is one of the documented kinds. The memory store keeps its levels over a clean
restart only (after a crash every bucket starts full, as documented): its buckets are
checked exactly wherever no crash came between their first call and a read of their
levels, across fast restarts included, and elsewhere against the limit once more per
crash. Writes bench/results/chaos.md.

Run through scripts/chaos.sh (it installs pgbouncer, builds, starts the server and
pgbouncer, and stops them). RL_CHAOS_SECONDS sets the length (600)."""
import collections
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import psycopg2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECONDS = float(os.environ.get("RL_CHAOS_SECONDS", "600"))
SERVER = os.environ["RL_PG_DIR"], int(os.environ["RL_PG_PORT"])
BOUNCER = os.environ["RL_BOUNCER_DIR"], int(os.environ["RL_BOUNCER_PORT"])
PG_BIN = os.environ["RL_PG_BIN"]
DB = "chaos"
# where each kind of client goes: the native extension (directly or through pgbouncer), the
# SQL edition's database, or the memory store's (directly)
DATABASES = {"direct": DB, "pgbouncer": DB, "edition": "chaos_sql", "memory": "chaos_memory"}
CLIENTS_DIRECT, CLIENTS_BOUNCED, CLIENTS_EDITION, CLIENTS_MEMORY = 4, 4, 2, 2
# Each key is used for one epoch, then fresh keys: so keys reach their limit all through
# the run, and each key's count is exact (an explicit clock: no refill). The memory
# store's epochs are shorter, so that many of them see no crash before they are read.
EPOCH_SECONDS, KEYS_PER_EPOCH, LIMIT = 20, 3, 400
MEMORY_EPOCH_SECONDS = 5
# A call may still land this long after its epoch ends (a connect waits up to 3 s).
LATE_SECONDS = 5
# One explicit clock for the whole run (no refill), at the real time it starts: the memory
# store saves only buckets not yet full again by the real clock at shutdown, and a bucket
# of this run is full again only some years after it.
NOW_MS = int(time.time() * 1000)

# Every error a client may see, by its SQLSTATE or, for errors before or after the server
# answers (no SQLSTATE), by its words. Anything else fails the run.
DOCUMENTED_CODES = {
    "57P01": "terminating connection due to administrator command (a restart)",
    "57P02": "terminating connection due to crash of another server process",
    "57P03": "the database system is starting up / shutting down / in recovery",
    "08006": "connection failure",
    "08001": "cannot connect",
    "08P01": "protocol violation (pgbouncer: server connection lost mid-query)",
}
DOCUMENTED_WORDS = [
    (r"server closed the connection unexpectedly", "the server closed the connection (a backend killed or restarting)"),
    (r"connection to server .* failed|could not connect to server", "cannot connect (the server or pgbouncer down)"),
    (r"terminating connection", "terminating connection (a restart or a crash of another backend)"),
    (r"the database system is (starting up|shutting down|in recovery mode|not yet accepting connections)",
     "the database system is starting up or shutting down"),
    (r"no connection to the server|connection already closed", "the connection was already lost"),
    (r"server conn crashed|pgbouncer cannot connect to server|server login has been failing|query_wait_timeout",
     "pgbouncer: its server connection lost"),
    (r"SSL SYSCALL error|EOF detected", "the connection ended mid-reply"),
]


def connect(via):
    folder, port = BOUNCER if via == "pgbouncer" else SERVER
    conn = psycopg2.connect(host=folder, port=port, user="postgres", dbname=DATABASES[via], connect_timeout=3)
    conn.autocommit = True
    return conn


def key_of(kind, epoch, j):
    return f"{kind}:{epoch}:{j}"


class Client(threading.Thread):
    def __init__(self, number, via, start, stop):
        super().__init__(daemon=True)
        self.rng = random.Random(number)
        self.via, self.started_at, self.stop = via, start, stop
        self.epoch_seconds = MEMORY_EPOCH_SECONDS if via == "memory" else EPOCH_SECONDS
        self.seen = collections.Counter()  # (database, kind, key) -> admissions answered
        self.failed = collections.Counter()  # (database, kind, key) -> calls whose outcome is unknown
        self.answered = 0
        self.errors = collections.Counter()  # documented kind -> count
        self.undocumented = []

    def classify(self, e):
        code = getattr(e, "pgcode", None)
        if code in DOCUMENTED_CODES:
            return f"{code}: {DOCUMENTED_CODES[code]}"
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        for words, label in DOCUMENTED_WORDS:
            if re.search(words, str(e)):
                return label
        self.undocumented.append(f"{code} {text}")
        return "undocumented"

    def run(self):
        conn = None
        while not self.stop.is_set():
            epoch = int((time.monotonic() - self.started_at) // self.epoch_seconds)
            kind = self.rng.choice(["bucket", "budget"])
            key = key_of(kind, epoch, self.rng.randrange(KEYS_PER_EPOCH))
            try:
                if conn is None:
                    conn = connect(self.via)
            except psycopg2.Error as e:
                self.errors[self.classify(e)] += 1
                time.sleep(0.2)
                continue
            try:
                with conn.cursor() as cur:
                    if kind == "bucket":
                        cur.execute("SELECT (rl_take(%s, %s, 0.000001, 1, %s) ->> 'admitted')::bool",
                                    (key, LIMIT, NOW_MS))
                    else:
                        cur.execute("SELECT (rl_spend(%s, 'month', %s, 1, %s) ->> 'admitted')::bool",
                                    (key, LIMIT, NOW_MS))
                    admitted = cur.fetchone()[0]
                self.answered += 1
                self.seen[(DATABASES[self.via], kind, key)] += admitted
            except psycopg2.Error as e:
                self.failed[(DATABASES[self.via], kind, key)] += 1
                self.errors[self.classify(e)] += 1
                try:
                    conn.close()
                except psycopg2.Error:
                    pass
                conn = None
                time.sleep(0.05)


def as_pg(*cmd):
    return subprocess.run(["runuser", "-u", "postgres", "--", *cmd], capture_output=True, text=True)


def server_pid():
    with open(os.path.join(SERVER[0], "data", "postmaster.pid")) as f:
        return int(f.readline())


def wait_for_server(seconds=120):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            connect("direct").close()
            return
        except psycopg2.Error:
            time.sleep(0.2)
    raise SystemExit("the server did not come back")


def backend_pids():
    conn = connect("direct")
    with conn.cursor() as cur:
        cur.execute("SELECT pid FROM pg_stat_activity WHERE datname = ANY(%s) AND pid <> pg_backend_pid()",
                    (sorted(set(DATABASES.values())),))
        pids = [r[0] for r in cur.fetchall()]
    conn.close()
    return pids


def kill(pid):
    """SIGKILL to pid, returning once the postmaster has reaped it (from then on it refuses
    connections until it has reset shared memory, so no connection slips in before the
    crash is noticed); whether it was still there to receive it."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    for _ in range(3000):
        try:
            os.kill(pid, 0)  # a zombie still answers: not reaped yet
        except ProcessLookupError:
            break
        time.sleep(0.01)
    return True


def restart_server(mode, kill_during=False):
    """Stops the server (`mode`) and starts it again. kill_during: a backend is killed
    with SIGKILL while the shutdown runs, before the postmaster's save of the memory store
    (which it writes only at a clean exit). Returns whether that kill landed (the backend
    may have ended already)."""
    pids = backend_pids() if kill_during else []
    stop = [f"{PG_BIN}/pg_ctl", "-D", os.path.join(SERVER[0], "data"), "-m", mode, "-w", "-t", "120", "stop"]
    stopper = threading.Thread(target=as_pg, args=stop)
    stopper.start()
    landed = False
    if pids:
        time.sleep(random.uniform(0, 0.05))
        landed = kill(random.choice(pids))
    stopper.join()
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "pg_cluster.sh"), "start"], check=True, capture_output=True)
    wait_for_server()
    return landed


def kill_a_backend():
    pids = backend_pids()
    if pids:
        kill(random.choice(pids))
        wait_for_server()  # the postmaster restarts every backend after a crash of one
    return bool(pids)


def bouncer(action):
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "chaos.sh"), f"bouncer-{action}"], check=True,
                   capture_output=True)


# What a driver's action does to the memory store: a clean restart saves and loads its
# buckets; anything that crashes a backend (or may, or stops the server at once) can leave
# every bucket full.
KEEPS_MEMORY = {"restart fast": True, "restart fast (the backend to kill during it had ended)": True,
                "stop pgbouncer": True}
CLEAN_RESTARTS = {a for a in KEEPS_MEMORY if a.startswith("restart")}


def drive(stop, events, timeline):
    """Acts every 3 to 8 s; appends [action, started, ended] to timeline (monotonic) as it
    starts, ended infinite until the server answers again: a reader never misses an action
    under way."""
    rng = random.Random(7)
    while not stop.wait(rng.uniform(3, 8)):
        wait_for_server()  # (a restart's own connection may meet the server recovering)
        action = rng.choice(["kill a backend", "kill a backend", "restart fast", "restart fast",
                             "restart fast, a backend killed during it", "restart immediate",
                             "stop pgbouncer"])
        entry = [action, time.monotonic(), float("inf")]
        timeline.append(entry)
        if action == "kill a backend":
            if not kill_a_backend():
                timeline.remove(entry)
                continue
        elif action.startswith("restart"):
            landed = restart_server(action.split()[1].rstrip(","), kill_during="killed" in action)
            if "killed" in action and not landed:
                entry[0] = action = "restart fast (the backend to kill during it had ended)"
        else:
            bouncer("stop")
            time.sleep(rng.uniform(0.5, 3))
            bouncer("start")
        entry[2] = time.monotonic()
        events[action] += 1


class MemoryReader(threading.Thread):
    """Reads the memory store's levels of each epoch's bucket keys once the epoch's calls
    are over (LATE_SECONDS after it), unless a crash-like action overlapped the time from
    the epoch's start to the read: those counts are then exact, and the run checks them as
    the tables' ones. Epochs that met a crash are listed with how many."""

    def __init__(self, start, stop, timeline):
        super().__init__(daemon=True)
        self.started_at, self.stop, self.timeline = start, stop, timeline
        self.levels = {}  # epoch -> {key: admissions stored}, read after a stretch without a crash
        self.across_fast = set()  # epochs read with a clean restart (a save and a load) between
        self.crashed = {}  # epoch -> crash-like actions overlapping its calls or its read
        self.read_at = {}  # epoch -> when its levels were read

    def overlapping(self, since, until, crash):
        """The crash-like actions (crash) or clean restarts (not crash) between the two times."""
        return [a for a in list(self.timeline) if a[2] >= since and a[1] <= until
                and (not KEEPS_MEMORY.get(a[0], False) if crash else a[0] in CLEAN_RESTARTS)]

    def read(self, epoch):
        conn = connect("memory")
        with conn.cursor() as cur:
            counts = {}
            for j in range(KEYS_PER_EPOCH):
                key = key_of("bucket", epoch, j)
                cur.execute("SELECT round(%s - (rl_peek(%s, %s, 0.000001, 0, %s) ->> 'remaining')::float8)::int",
                            (LIMIT, key, LIMIT, NOW_MS))
                counts[key] = cur.fetchone()[0]
        conn.close()
        return counts

    def run(self):
        epoch = 0
        while not self.stop.wait(0.5):
            begins = self.started_at + epoch * MEMORY_EPOCH_SECONDS
            if time.monotonic() < begins + MEMORY_EPOCH_SECONDS + LATE_SECONDS:
                continue
            try:
                counts = self.read(epoch)
            except psycopg2.Error:
                counts = None  # the server is down: read again, unless a crash settles it
            crashes = self.overlapping(begins, time.monotonic(), crash=True)
            if counts is None and not crashes:
                continue
            if crashes:
                self.crashed[epoch] = len(crashes)
            else:
                self.levels[epoch] = counts
                self.read_at[epoch] = time.monotonic()
                if self.overlapping(begins, time.monotonic(), crash=False):
                    self.across_fast.add(epoch)
            epoch += 1


def crashes_during(timeline, epoch, start):
    begins = start + epoch * MEMORY_EPOCH_SECONDS
    ends = begins + MEMORY_EPOCH_SECONDS + LATE_SECONDS
    return sum(1 for a in timeline if a[2] >= begins and a[1] <= ends and not KEEPS_MEMORY.get(a[0], False))


def save_file_findings():
    """The server log's word on the memory store's file: damaged files it ignored, and the
    starts that loaded buckets."""
    with open(os.path.join(SERVER[0], "server.log"), errors="replace") as f:
        log = f.read()
    ignored = re.findall(r"pg_ratelimit: ignoring .*", log)
    loads = [int(n) for n in re.findall(r"pg_ratelimit: loaded (\d+) of \d+ buckets", log)]
    return ignored, sum(1 for n in loads if n > 0)


def final_counts():
    """What the tables hold (the memory store's buckets are read by MemoryReader)."""
    counts = {}
    for via in ("direct", "edition", "memory"):
        db = DATABASES[via]
        conn = connect(via)
        with conn.cursor() as cur:
            if via != "memory":
                cur.execute("SELECT key, round(%s - level)::int FROM ratelimit.rl_bucket", (LIMIT,))
                counts.update({(db, "bucket", k): n for k, n in cur.fetchall()})
            cur.execute("SELECT key, (used / 1000000)::int FROM ratelimit.rl_budget")
            counts.update({(db, "budget", k): n for k, n in cur.fetchall()})
        conn.close()
    return counts


def amcheck_findings():
    """What amcheck finds wrong in the state tables of both databases after the run: their
    heaps and their primary keys' btrees checked against every heap tuple (empty: intact)."""
    findings = []
    for via in ("direct", "edition", "memory"):
        conn = connect(via)
        with conn.cursor() as cur:
            cur.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
            for table in ("rl_bucket", "rl_budget", "rl_entries", "rl_policy"):
                try:
                    cur.execute(f"SELECT bt_index_parent_check('ratelimit.{table}_pkey', true)")
                except psycopg2.Error as e:
                    findings.append(f"{DATABASES[via]}: {table}_pkey: {str(e).strip()}")
                cur.execute(f"SELECT blkno, offnum, msg FROM verify_heapam('ratelimit.{table}')")
                findings += [f"{DATABASES[via]}: {table} block {b} item {o}: {m}" for b, o, m in cur.fetchall()]
        conn.close()
    return findings


def main():
    wait_for_server()
    start, stop = time.monotonic(), threading.Event()
    clients = [Client(i, "direct", start, stop) for i in range(CLIENTS_DIRECT)]
    clients += [Client(100 + i, "pgbouncer", start, stop) for i in range(CLIENTS_BOUNCED)]
    clients += [Client(200 + i, "edition", start, stop) for i in range(CLIENTS_EDITION)]
    clients += [Client(300 + i, "memory", start, stop) for i in range(CLIENTS_MEMORY)]
    for c in clients:
        c.start()
    events, timeline = collections.Counter(), []
    driver = threading.Thread(target=drive, args=(stop, events, timeline), daemon=True)
    driver.start()
    reader = MemoryReader(start, stop, timeline)
    reader.start()
    time.sleep(SECONDS)
    stop.set()
    driver.join()
    for c in clients:
        c.join(timeout=30)
    reader.join()
    wait_for_server()
    stored = final_counts()
    damaged = amcheck_findings()
    ignored_files, loading_starts = save_file_findings()

    seen, failed = collections.Counter(), collections.Counter()
    errors = collections.Counter()
    undocumented = []
    for c in clients:
        seen.update(c.seen)
        failed.update(c.failed)
        errors.update(c.errors)
        undocumented += c.undocumented
    # The memory store's buckets: exact where read after a stretch without a crash; else
    # within the limit once more per crash (each may have left every bucket full).
    memory_db = DATABASES["memory"]
    in_memory = {k for k in seen if k[0] == memory_db and k[1] == "bucket"}
    epoch_of = {k: int(k[2].split(":")[1]) for k in in_memory}
    for k in in_memory:
        stored_levels = reader.levels.get(epoch_of[k])
        if stored_levels is not None:
            stored[k] = stored_levels.get(k[2], 0)
    memory_read = {k for k in in_memory if epoch_of[k] in reader.levels}
    memory_unread = in_memory - memory_read
    memory_over = [k for k in memory_unread
                   if seen[k] > LIMIT * (1 + crashes_during(timeline, epoch_of[k], start))]
    keys = sorted((set(seen) | set(stored)) - memory_unread)
    over = [k for k in keys if stored.get(k, 0) > LIMIT or seen[k] > LIMIT] + memory_over
    lost = [k for k in keys if stored.get(k, 0) < seen[k]]
    unexplained = [k for k in keys if stored.get(k, 0) - seen[k] > failed[k]]
    kept_across_fast = [k for k in memory_read if epoch_of[k] in reader.across_fast and seen[k] > 0]
    answered = sum(c.answered for c in clients)
    admitted = sum(seen.values())
    unseen = sum(max(0, stored.get(k, 0) - seen[k]) for k in keys)
    # a run long enough to restart cleanly must have checked levels kept over a restart
    ok = not (over or lost or unexplained or undocumented or damaged or ignored_files
              or (SECONDS >= 300 and not kept_across_fast))
    by_database = {db: (sum(n for k, n in seen.items() if k[0] == db), len({k for k in keys if k[0] == db}))
                   for db in sorted(set(DATABASES.values()))}

    lines = [
        "# Chaos run",
        "",
        f"`bash scripts/chaos.sh` (RL_CHAOS_SECONDS={SECONDS:.0f}), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"{CLIENTS_DIRECT} clients connected directly and {CLIENTS_BOUNCED} through pgbouncer (transaction pooling) "
        f"to the native extension, {CLIENTS_EDITION} directly to the SQL edition in a database of its own, and "
        f"{CLIENTS_MEMORY} directly to a database whose buckets are in the memory store (pg_ratelimit.buckets = "
        f"memory), call rl_take and rl_spend (limit {LIMIT}, no refill: an explicit clock) on {KEYS_PER_EPOCH} "
        f"bucket and {KEYS_PER_EPOCH} budget keys per database, fresh keys every {EPOCH_SECONDS} s "
        f"({MEMORY_EPOCH_SECONDS} s in the memory store's database), tables with synchronous_commit on, while a "
        "driver acts every 3 to 8 s. The memory store keeps its buckets over a clean restart only: its keys are "
        f"read {LATE_SECONDS} s after their stretch, and checked exactly where no crash-like action (a backend "
        "killed, an immediate stop, a backend killed during a fast stop) came between their first call and "
        "that read; the others are held to the limit once more per crash-like action.",
        "",
        "| what | count |",
        "|---|---|",
        *[f"| {action} | {n} |" for action, n in sorted(events.items())],
        f"| calls answered | {answered} |",
        f"| admissions answered | {admitted} |",
        *[f"| admissions answered in {db} (keys) | {n} ({k}) |" for db, (n, k) in by_database.items()],
        f"| keys | {len(keys)} |",
        f"| calls that failed (outcome unknown to the client) | {sum(failed.values())} |",
        f"| admissions committed but not seen (a call cut off after its commit) | {unseen} |",
        f"| keys over their limit | {len(over)} |",
        f"| admissions seen and then lost | {sum(seen[k] - stored.get(k, 0) for k in lost)} |",
        f"| keys with more unseen admissions than failed calls | {len(unexplained)} |",
        f"| undocumented errors | {len(undocumented)} |",
        f"| amcheck findings in the state tables (heaps, primary keys) | {len(damaged)} |",
        f"| memory store: bucket keys checked exactly (of them, across a clean restart: saved and loaded) | "
        f"{len(memory_read)} ({len(kept_across_fast)}) |",
        f"| memory store: bucket keys after a crash-like action (held to the limit once more per action) | "
        f"{len(memory_unread)} |",
        f"| memory store: keys over that bound | {len(memory_over)} |",
        f"| memory store: starts that loaded saved buckets | {loading_starts} |",
        f"| memory store: saved files found damaged and ignored | {len(ignored_files)} |",
        "",
        "Errors the clients saw, by kind:",
        "",
        "| kind | count |",
        "|---|---|",
        *[f"| {kind} | {n} |" for kind, n in errors.most_common()],
        "",
        *[f"amcheck: {d}" for d in damaged[:20]],
        "",
        f"Verdict: {'every check held' if ok else 'FAILED'}.",
    ]
    if undocumented:
        lines += ["", "Undocumented errors (first 10):", "", *[f"- `{u}`" for u in undocumented[:10]]]
    if over or lost or unexplained:
        lines += ["", "Keys that failed a check (database, kind, key: stored, seen, failed calls; first 20):", "",
                  *[f"- {k}: {stored.get(k, 0)}, {seen[k]}, {failed[k]}" for k in (over + lost + unexplained)[:20]]]
        for e in sorted({epoch_of[k] for k in lost if k in epoch_of}):
            begins = e * MEMORY_EPOCH_SECONDS
            lines += ["", f"Memory store epoch {e}: calls from {begins} s, read at "
                      f"{reader.read_at.get(e, float('nan')) - start:.2f} s; actions around it (s from the start):", "",
                      *[f"- {a[0]}: {a[1] - start:.2f} to {a[2] - start:.2f}" for a in timeline
                        if a[2] - start >= begins - 10 and a[1] - start <= begins + 20]]
    report = "\n".join(lines) + "\n"
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "chaos.md"), "w") as f:
        f.write(report)
    print(report)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
