"""Chaos for the web packages: each package's server of the test application (the spec's,
integrations/spec/app.json: Python's ASGI middleware under uvicorn, Node's Express
middleware, Ruby's Rack middleware under puma) under load from 8 keep-alive HTTP clients,
on PostgreSQL while the server is restarted (fast and immediate) and its backends are
killed, and on SQLite while another connection holds the file's write lock.

The clients sign in as fresh users every few requests and ask for
- `POST /login` (the policy web_login: 3 per user, never refilled; a sensitive route, so
  it fails closed: 503 with Retry-After while the database cannot answer), and
- `GET /open` (40 per user, never refilled; not sensitive: while the database cannot
  answer, each process admits through a local bucket at half the limit, by design).

Checked: no user is admitted more than 3 logins; no admission a client saw is lost (after
the run each user is asked again: the database admits at most what it still owes); every
answer is 200, 429 or 503 with Retry-After (a 503 only while the database is out, or
within RECOVERY_SECONDS after); the server never drops a connection or fails a request;
and after each outage a login is answered by the database again within RECOVERY_SECONDS.
Appends its section to bench/results/chaos.md (scripts/chaos.sh runs it after
bench/chaos.py). RL_WEB_CHAOS_SECONDS: the length of each package's run on each engine.

Run with the web packages' virtualenv (it uses the Python package's test helpers)."""
import collections
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import httpx
import psycopg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "integrations", "python", "tests")
sys.path.insert(0, TESTS)
from routes import token  # noqa: E402
from test_middleware import EXTENSION, Database, Server, start_postgres  # noqa: E402

SECONDS = float(os.environ.get("RL_WEB_CHAOS_SECONDS", "90"))
CLIENTS, REQUESTS_PER_USER = 8, 12
LOGINS = 3  # web_login's burst
# The documented bound: a login is answered by the database again this soon after the
# database accepts connections (or the lock is released).
RECOVERY_SECONDS = 5.0
PG_DIR, PG_BIN = os.environ["RL_PG_DIR"], os.environ["RL_PG_BIN"]
PACKAGES = ["python (ASGI, uvicorn)", "node (Express)", "ruby (Rack, puma)"]


class NodeServer:
    """integrations/node/test/app-server.js: the test application under Express (and the
    Fetch API, unused here), in a child process."""

    def __init__(self, db):
        env = dict(os.environ, RL_WEB_ENGINE=db.engine, RL_WEB_EXTENSION=EXTENSION,
                   RL_WEB_DB=db.dsn if db.engine == "sqlite" else db.dsn.split("=", 1)[1])
        self.process = subprocess.Popen(["node", os.path.join(ROOT, "integrations", "node", "test", "app-server.js")],
                                        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        said = []
        for line in self.process.stdout:
            said.append(line)
            found = re.search(r"listening (\d+) (\d+)", line)
            if found:
                break
        else:
            raise RuntimeError("the Node server did not start: " + "".join(said))
        self.url = f"http://127.0.0.1:{found.group(1)}"
        # drain its output, so that a server that logs much never blocks
        self.lines = []
        threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True).start()

    def output(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)
        return "".join(self.lines)


def serve(package, db):
    if package.startswith("node"):
        return NodeServer(db)
    return Server(db, framework="asgi" if package.startswith("python") else "rack")


class Outages:
    """The disruptions of one run, as (what, started, ended) on the monotonic clock: ended
    is when the database accepts connections again (or the lock is released)."""

    def __init__(self):
        self.list = []

    def out_at(self, t):
        return any(s <= t <= e + RECOVERY_SECONDS for _, s, e in self.list)


def as_pg(*cmd):
    return subprocess.run(["runuser", "-u", "postgres", "--", *cmd], capture_output=True, text=True)


def wait_for_postgres(dsn):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            psycopg.connect(dsn, connect_timeout=2).close()
            return
        except psycopg.Error:
            time.sleep(0.05)
    raise SystemExit("PostgreSQL did not come back")


def disrupt_postgres(db, rng):
    action = rng.choice(["restart fast", "restart immediate", "kill a backend"])
    if action == "kill a backend":
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            pids = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]
        if not pids:
            return None
        started, pid = time.monotonic(), rng.choice(pids)
        os.kill(pid, signal.SIGKILL)  # the postmaster then restarts every backend
        # once it has reaped the backend, it refuses connections until it has reset shared
        # memory: the wait below cannot slip in before the crash is noticed
        while os.path.exists(f"/proc/{pid}"):
            time.sleep(0.01)
    else:
        started = time.monotonic()
        as_pg(f"{PG_BIN}/pg_ctl", "-D", os.path.join(PG_DIR, "data"), "-m", action.split()[1], "-w", "stop")
        time.sleep(rng.uniform(0.5, 3))
        start_postgres()
    wait_for_postgres(db.dsn)
    return action, started, time.monotonic()


def disrupt_sqlite(db, rng):
    lock = sqlite3.connect(db.dsn, isolation_level=None, timeout=30)
    lock.execute("BEGIN EXCLUSIVE")  # every other writer waits, then gives up
    started = time.monotonic()
    time.sleep(rng.uniform(1, 4))
    lock.execute("ROLLBACK")
    lock.close()
    return "the file locked (BEGIN EXCLUSIVE)", started, time.monotonic()


class Client(threading.Thread):
    def __init__(self, number, url, stop, run_id):
        super().__init__(daemon=True)
        self.number, self.url, self.stop, self.run_id = number, url, stop, run_id
        self.rng = random.Random(number)
        self.answers = []  # (monotonic, path, status, has Retry-After)
        self.logins = collections.Counter()  # user -> 200s seen
        self.users = []
        self.dropped = []  # transport errors (the server dropped or refused a connection)

    def run(self):
        n = 0
        with httpx.Client(base_url=self.url, timeout=30) as c:
            while not self.stop.is_set():
                user = f"{self.run_id}c{self.number}u{n // REQUESTS_PER_USER}"
                if n % REQUESTS_PER_USER == 0:
                    self.users.append(user)
                n += 1
                path = "/login" if self.rng.random() < 0.5 else "/open"
                try:
                    r = (c.post if path == "/login" else c.get)(path, headers={"Authorization": "Bearer " + token(user)})
                except httpx.TransportError as e:
                    self.dropped.append(f"{path}: {type(e).__name__}: {e}")
                    time.sleep(0.05)
                    continue
                self.answers.append((time.monotonic(), path, r.status_code, "Retry-After" in r.headers))
                if path == "/login" and r.status_code == 200:
                    self.logins[user] += 1


def one_run(package, engine, tmp, rng):
    db = Database(engine, tmp)
    server = serve(package, db)
    stop, outages = threading.Event(), Outages()
    run_id = f"{engine[0]}{PACKAGES.index(package)}"
    clients = [Client(i, server.url, stop, run_id) for i in range(CLIENTS)]
    for c in clients:
        c.start()
    began = time.monotonic()
    try:
        while time.monotonic() - began < SECONDS:
            time.sleep(rng.uniform(3, 8))
            outage = disrupt_postgres(db, rng) if engine == "postgres" else disrupt_sqlite(db, rng)
            if outage:
                outages.list.append(outage)
        time.sleep(RECOVERY_SECONDS)
    finally:
        stop.set()
        for c in clients:
            c.join(timeout=60)
    # after the run: each user asked for the logins the database still owes it, plus one
    owed_over = []
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for client in clients:
            for user in client.users:
                seen = client.logins[user]
                more = sum(c.post("/login", headers={"Authorization": "Bearer " + token(user)}).status_code == 200
                           for _ in range(LOGINS - seen + 1))
                if seen + more > LOGINS:
                    owed_over.append((user, seen, more))
    log = server.output()
    answers = sorted(a for c in clients for a in c.answers)
    statuses = collections.Counter(a[2] for a in answers)
    unmapped = [a for a in answers if a[2] not in (200, 429, 503) or (a[2] == 503 and not a[3])]
    stray_503 = [a for a in answers if a[2] == 503 and not outages.out_at(a[0])]
    over = [(u, n) for c in clients for u, n in c.logins.items() if n > LOGINS]
    recoveries, unrecovered = [], []
    for what, _, ended in outages.list:
        after = next((t for t, path, status, _ in answers if t >= ended and path == "/login" and status != 503), None)
        if after is None or after - ended > RECOVERY_SECONDS:
            unrecovered.append(what)
        else:
            recoveries.append(after - ended)
    dropped = [d for c in clients for d in c.dropped]
    return {
        "package": package, "engine": engine, "outages": collections.Counter(w for w, _, _ in outages.list),
        "requests": len(answers), "statuses": statuses,
        "logins admitted": sum(n for c in clients for n in c.logins.values()),
        "users": sum(len(c.users) for c in clients), "over": over, "lost": owed_over, "unmapped": unmapped,
        "stray 503": stray_503, "dropped": dropped, "recovery max": max(recoveries, default=0.0),
        "recovery median": sorted(recoveries)[len(recoveries) // 2] if recoveries else 0.0,
        "unrecovered": unrecovered, "log tail": log[-2000:],
    }


def main():
    import tempfile
    import pathlib

    rng = random.Random(11)
    results = []
    for engine in ("postgres", "sqlite"):
        for package in PACKAGES:
            with tempfile.TemporaryDirectory() as tmp:
                tmp = pathlib.Path(tmp) / f"webchaos{engine}{PACKAGES.index(package)}"
                tmp.mkdir()
                result = one_run(package, engine, tmp, rng)
            results.append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "log tail"}, default=str)[:1500], flush=True)
    failed = [r for r in results if r["over"] or r["lost"] or r["unmapped"] or r["stray 503"] or r["dropped"]
              or r["unrecovered"] or not r["outages"]]
    lines = [
        "",
        "## Web packages",
        "",
        f"`bash scripts/chaos.sh` then runs `bench/web_chaos.py` (RL_WEB_CHAOS_SECONDS={SECONDS:.0f} per package and "
        f"engine), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: each package's server of the test "
        f"application under {CLIENTS} keep-alive HTTP clients, each signing in as a fresh user every "
        f"{REQUESTS_PER_USER} requests, half `POST /login` (3 per user, sensitive: fails closed), half `GET /open` "
        "(40 per user; fails open to a local bucket at half the limit), while PostgreSQL is restarted (fast, "
        "immediate) or a backend is killed, or SQLite's file is locked by another connection for 1 to 4 s, every "
        f"3 to 8 s. A login must be answered by the database again within {RECOVERY_SECONDS:.0f} s of the "
        "database accepting connections (or the lock's release).",
        "",
        "| package | engine | outages | requests | 200 / 429 / 503 | logins admitted (users) | users over 3 logins "
        "| logins seen and lost | unmapped answers | 503 outside an outage | connections dropped "
        "| recovery: median / max (s) | outages not recovered from in time |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r["statuses"]
        lines.append(
            f"| {r['package']} | {r['engine']} | {', '.join(f'{w} {n}' for w, n in sorted(r['outages'].items()))} "
            f"| {r['requests']} | {s.get(200, 0)} / {s.get(429, 0)} / {s.get(503, 0)} "
            f"| {r['logins admitted']} ({r['users']}) | {len(r['over'])} | {len(r['lost'])} | {len(r['unmapped'])} "
            f"| {len(r['stray 503'])} | {len(r['dropped'])} "
            f"| {r['recovery median']:.2f} / {r['recovery max']:.2f} | {len(r['unrecovered'])} |")
    lines += ["", f"Verdict: {'every check held' if not failed else 'FAILED'}."]
    for r in failed:
        lines += ["", f"{r['package']} on {r['engine']}:",
                  *[f"- {k}: {str(r[k])[:500]}" for k in ("over", "lost", "unmapped", "stray 503", "dropped",
                                                          "unrecovered") if r[k]],
                  "", "```", r["log tail"], "```"]
    section = "\n".join(lines) + "\n"
    path = os.path.join(ROOT, "bench", "results", "chaos.md")
    with open(path) as f:
        report = f.read().split("\n## Web packages\n")[0].rstrip("\n") + "\n"
    with open(path, "w") as f:
        f.write(report + section)
    print(section)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
