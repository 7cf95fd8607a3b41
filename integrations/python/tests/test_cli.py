"""`ratelimit-web` of each package (Python, Node, Ruby) against identifiers an attacker
chose: a subject that ends up blocked, refused or budgeted reaches the operator's terminal
with every character a terminal acts on written as its \\uXXXX escape (C0, DEL, C1,
bidirectional and zero-width format characters, separators), so it can neither clear the
screen, set the window title nor write the clipboard; JSON lines stay JSON."""
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
EXTENSION = os.environ.get("RATELIMIT_SQLITE_EXTENSION", os.path.join(ROOT, "target", "release", "libratelimit"))

HOSTILE = [
    "ip:\x1b]0;pwned\x07",                 # set the window title
    "user:\x1b[2J\x1b[H",                   # clear the screen
    "\x1b]52;c;cHduZWQ=\x07",              # write the clipboard (OSC 52)
    "c1:\u009b2J\u009d0;x\u009c",          # the same as C1 controls
    "del:\x7f\x08\x08back",                 # DEL and backspaces
    "rtl:\u202egnp.exe",                    # a bidirectional override
    "zw:ad\u200bmin\u2028next",             # zero width, a line separator
]
# what may reach the terminal: printable text, and a newline between lines
FORBIDDEN = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]")


def clis():
    """Each package's command, as its users run it."""
    found = {"python": [sys.executable, "-m", "ratelimit_web.cli"]}
    node = os.path.join(ROOT, "integrations", "node", "dist", "cli.js")
    if shutil.which("node") and os.path.exists(node):
        found["node"] = ["node", node]
    if shutil.which("ruby"):
        found["ruby"] = ["ruby", "-I", os.path.join(ROOT, "integrations", "ruby", "lib"),
                         os.path.join(ROOT, "integrations", "ruby", "exe", "ratelimit-web")]
    return found


@pytest.fixture
def hostile_db(tmp_path):
    path = str(tmp_path / "app.db")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.enable_load_extension(True)
    conn.load_extension(EXTENSION)
    conn.execute("""SELECT rl_policy_set('login', '{"limits": [{"burst": 1, "refill_per_minute": 0.001}]}')""")
    for subject in HOSTILE:
        conn.execute("SELECT rl_block(?, NULL)", (subject,))
        conn.execute("SELECT rl_spend(?, 'month', 10, 9)", (subject,))
    conn.close()
    return path


def run(command, db, *args):
    env = {**os.environ, "RATELIMIT_SQLITE_EXTENSION": EXTENSION}
    return subprocess.run([*command, "--db", db, *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("package", ["python", "node", "ruby"])
def test_blocks_and_unblock_escape_what_a_terminal_acts_on(hostile_db, package):
    command = clis().get(package)
    if command is None:
        if os.environ.get("RL_REQUIRE_RUBY") == "1":
            pytest.fail(f"no {package} here to run ratelimit-web with")
        pytest.skip(f"no {package} here")
    listed = run(command, hostile_db, "blocks")
    assert listed.returncode == 0, listed.stderr
    assert not FORBIDDEN.search(listed.stdout), repr(listed.stdout)
    subjects = sorted(json.loads(line)["subject"] for line in listed.stdout.splitlines())
    assert subjects == sorted(HOSTILE), "JSON lines that still decode to the subjects"
    lifted = run(command, hostile_db, "unblock", HOSTILE[0])
    assert lifted.returncode == 0, lifted.stderr
    assert lifted.stdout == "unblocked ip:\\u001b]0;pwned\\u0007\n"
    again = run(command, hostile_db, "unblock", HOSTILE[1])
    assert again.stdout == "unblocked user:\\u001b[2J\\u001b[H\n"
    failed = run(command, hostile_db, "policy", "drop", "\x1b]0;x\x07")
    assert not FORBIDDEN.search(failed.stdout + failed.stderr), repr(failed.stdout + failed.stderr)


def test_top_shows_hostile_subjects_escaped_in_a_real_terminal(hostile_db):
    """`top --once` writes no control character but newlines; `top` in a tmux pane keeps its
    title and shows the escapes as text."""
    conn = sqlite3.connect(hostile_db, isolation_level=None)
    conn.enable_load_extension(True)
    conn.load_extension(EXTENSION)
    conn.close()
    once = run(clis()["python"], hostile_db, "top", "--once")
    assert once.returncode == 0, once.stderr
    assert not FORBIDDEN.search(once.stdout), repr(once.stdout)
    assert "ip:\\u001b]0;pwned\\u0007" in once.stdout and "rtl:\\u202egnp.exe" in once.stdout, once.stdout
    assert "c1:\\u009b2J\\u009d0;x\\u009c" in once.stdout
    if not shutil.which("tmux"):
        if os.environ.get("RL_REQUIRE_RUBY") == "1":
            pytest.fail("tmux missing (scripts/setup.sh installs it)")
        pytest.skip("no tmux")

    def tmux(*args):
        return subprocess.run(["tmux", "-L", "rl_cli_test", *args], check=True, capture_output=True, text=True).stdout

    command = " ".join([*clis()["python"], "--db", hostile_db, "top", "--interval", "0.3"])
    tmux("new-session", "-d", "-s", "top", "-x", "160", "-y", "50",
         f"env RATELIMIT_SQLITE_EXTENSION={EXTENSION} {command}")
    try:
        title = tmux("display-message", "-p", "-t", "top", "#{pane_title}")
        for _ in range(300):
            shown = tmux("capture-pane", "-p", "-t", "top")
            if "pwned" in shown:
                break
            time.sleep(0.1)
        assert "ip:\\u001b]0;pwned\\u0007" in shown, shown
        assert "BLOCKED NOW" in shown and "NEAR THEIR QUOTA" in shown, "the screen was not cleared away"
        assert tmux("display-message", "-p", "-t", "top", "#{pane_title}") == title
        assert "pwned" not in tmux("display-message", "-p", "-t", "top", "#{pane_title}")
    finally:
        tmux("kill-server")


@pytest.mark.skipif(not os.environ.get("PGHOST"), reason="needs PostgreSQL (the server's counters)")
def test_top_lists_a_route_with_explicit_limits_beside_the_policies():
    """A route with its own limits (no policy), checked as the middleware checks it
    (rl_check_limits under the route's name), shows in `top` with the subject it refused."""
    import psycopg

    from ratelimit_web import Route, SyncPostgresLimiter

    name = "rl_cli_top"
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    with psycopg.connect(dbname=name, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_ratelimit")
        conn.execute("""SELECT rl_policy_set('login', '{"limits": [{"burst": 1, "refill_per_minute": 0.001}]}')""")
    limiter = SyncPostgresLimiter(f"dbname={name}", min_size=1, max_size=1, timeout=10)
    route = Route(name="POST /top-route", limits=[{"burst": 1, "refill_per_minute": 0.001}])
    try:
        assert [limiter.check(route, "user:bob", None, 1).admitted for _ in range(3)] == [True, False, False]
    finally:
        limiter.close()
    once = run(clis()["python"], f"dbname={name}", "top", "--once")
    assert once.returncode == 0, once.stderr
    policies = once.stdout.split("MOST REFUSED")[0]
    assert re.search(r"POST /top-route\s+1\s+2\s", policies), once.stdout  # admitted 1, refused 2
    assert re.search(r"POST /top-route\s+user:bob\s+2\s", once.stdout.split("MOST REFUSED")[1]), once.stdout
