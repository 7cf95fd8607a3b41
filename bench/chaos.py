"""Chaos: clients taking and spending on a few keys, directly and through pgbouncer (the
native extension) and directly on the SQL edition (a database of its own), while a
driver kills backends with SIGKILL, restarts the server (fast and immediate) and stops
pgbouncer. From the clients' own records it checks that no key admitted more than its
limit, that no admission a client saw is lost, and that every error is one of the
documented kinds. Writes bench/results/chaos.md.

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
# where each kind of client goes: the native extension (directly or through pgbouncer), or
# the SQL edition's database (directly)
DATABASES = {"direct": DB, "pgbouncer": DB, "edition": "chaos_sql"}
CLIENTS_DIRECT, CLIENTS_BOUNCED, CLIENTS_EDITION = 4, 4, 2
# Each key is used for one epoch, then fresh keys: so keys reach their limit all through
# the run, and each key's count is exact (an explicit clock: no refill).
EPOCH_SECONDS, KEYS_PER_EPOCH, LIMIT = 20, 3, 400
NOW_MS = 0

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
            epoch = int((time.monotonic() - self.started_at) // EPOCH_SECONDS)
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


def restart_server(mode):
    as_pg(f"{PG_BIN}/pg_ctl", "-D", os.path.join(SERVER[0], "data"), "-m", mode, "-w", "-t", "120", "stop")
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "pg_cluster.sh"), "start"], check=True, capture_output=True)
    wait_for_server()


def kill_a_backend():
    conn = connect("direct")
    with conn.cursor() as cur:
        cur.execute("SELECT pid FROM pg_stat_activity WHERE datname = ANY(%s) AND pid <> pg_backend_pid()",
                    (sorted(set(DATABASES.values())),))
        pids = [r[0] for r in cur.fetchall()]
    conn.close()
    if pids:
        os.kill(random.choice(pids), signal.SIGKILL)
        wait_for_server()  # the postmaster restarts every backend after a crash of one
    return bool(pids)


def bouncer(action):
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "chaos.sh"), f"bouncer-{action}"], check=True,
                   capture_output=True)


def drive(stop, events):
    rng = random.Random(7)
    while not stop.wait(rng.uniform(3, 8)):
        action = rng.choice(["kill a backend", "kill a backend", "restart fast", "restart immediate",
                             "stop pgbouncer"])
        if action == "kill a backend":
            if not kill_a_backend():
                continue
        elif action.startswith("restart"):
            restart_server(action.split()[1])
        else:
            bouncer("stop")
            time.sleep(rng.uniform(0.5, 3))
            bouncer("start")
        events[action] += 1


def final_counts():
    counts = {}
    for via in ("direct", "edition"):
        db = DATABASES[via]
        conn = connect(via)
        with conn.cursor() as cur:
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
    for via in ("direct", "edition"):
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
    for c in clients:
        c.start()
    events = collections.Counter()
    driver = threading.Thread(target=drive, args=(stop, events), daemon=True)
    driver.start()
    time.sleep(SECONDS)
    stop.set()
    driver.join()
    for c in clients:
        c.join(timeout=30)
    wait_for_server()
    stored = final_counts()
    damaged = amcheck_findings()

    seen, failed = collections.Counter(), collections.Counter()
    errors = collections.Counter()
    undocumented = []
    for c in clients:
        seen.update(c.seen)
        failed.update(c.failed)
        errors.update(c.errors)
        undocumented += c.undocumented
    keys = sorted(set(seen) | set(stored))
    over = [k for k in keys if stored.get(k, 0) > LIMIT or seen[k] > LIMIT]
    lost = [k for k in keys if stored.get(k, 0) < seen[k]]
    unexplained = [k for k in keys if stored.get(k, 0) - seen[k] > failed[k]]
    answered = sum(c.answered for c in clients)
    admitted = sum(seen.values())
    unseen = sum(max(0, stored.get(k, 0) - seen[k]) for k in keys)
    ok = not (over or lost or unexplained or undocumented or damaged)
    by_database = {db: (sum(n for k, n in seen.items() if k[0] == db), len({k for k in keys if k[0] == db}))
                   for db in sorted(set(DATABASES.values()))}

    lines = [
        "# Chaos run",
        "",
        f"`bash scripts/chaos.sh` (RL_CHAOS_SECONDS={SECONDS:.0f}), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"{CLIENTS_DIRECT} clients connected directly and {CLIENTS_BOUNCED} through pgbouncer (transaction pooling) "
        f"to the native extension, and {CLIENTS_EDITION} directly to the SQL edition in a database of its own, "
        f"call rl_take and rl_spend (limit {LIMIT}, no refill: an explicit clock) on {KEYS_PER_EPOCH} bucket and "
        f"{KEYS_PER_EPOCH} budget keys per database, fresh keys every {EPOCH_SECONDS} s, on PostgreSQL's table "
        "store (synchronous_commit on), while a driver acts every 3 to 8 s.",
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
    report = "\n".join(lines) + "\n"
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "chaos.md"), "w") as f:
        f.write(report)
    print(report)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
