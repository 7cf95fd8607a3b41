"""The packages of scripts/package.sh, installed the way their users install them."""
import glob
import json
import os
import subprocess
import sys

import pytest

from conftest import CARGO_VERSION, ROOT

DIST = os.path.join(ROOT, "dist")


@pytest.fixture(autouse=True)
def once_per_run():
    # The packages do not depend on the PostgreSQL version the suite runs against: the test
    # command checks them in its first pass only.
    if os.environ.get("RL_SKIP_PACKAGES") == "1":
        pytest.skip("packages are tested in the first pass of the test command")


def built(pattern, what):
    """The package of this version in dist/: a failure when the test command requires it,
    else a skip."""
    found = glob.glob(os.path.join(DIST, pattern))
    if not found:
        if os.environ.get("RL_REQUIRE_PACKAGES") == "1":
            pytest.fail(f"no {what} in dist/: run bash scripts/package.sh")
        pytest.skip(f"no {what} in dist/ (bash scripts/package.sh builds it)")
    return found[0]


def test_the_python_wheel_installs_and_loads(tmp_path):
    wheel = built(f"sqlite_ratelimit-{CARGO_VERSION}-py3-none-*.whl", "wheel")
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-index", wheel], check=True)
    program = """
import json, os, sqlite3, sqlite_ratelimit
assert sqlite_ratelimit.__version__ == %r
assert os.path.exists(sqlite_ratelimit.loadable_path() + ".so")
conn = sqlite3.connect(":memory:")
sqlite_ratelimit.load(conn)
r = json.loads(conn.execute("SELECT rl_take('user:42', 3, 60, 1, 0)").fetchone()[0])
assert (r["admitted"], r["remaining"]) == (True, 2), r
assert conn.execute("SELECT rl_version()").fetchone()[0] == %r
try:
    conn.load_extension(sqlite_ratelimit.loadable_path())
    raise AssertionError("extension loading was left enabled")
except sqlite3.OperationalError:
    pass
print("ok")
""" % (CARGO_VERSION, CARGO_VERSION)
    out = subprocess.run([str(venv / "bin" / "python"), "-c", program], capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout.strip() == "ok", out.stderr


def test_the_npm_package_installs_and_loads_into_better_sqlite3(tmp_path):
    tarball = built(f"sqlite-ratelimit-{CARGO_VERSION}.tgz", "npm tarball")
    env = dict(os.environ)
    if os.path.isdir("/usr/include/node"):
        env["npm_config_nodedir"] = "/usr"  # build better-sqlite3 against the local headers
    if os.path.isdir("/opt/pg_ratelimit/prebuilds"):  # this machine's build of it (scripts/better_sqlite3.sh)
        env.setdefault("npm_config_better_sqlite3_local_prebuilds", "/opt/pg_ratelimit/prebuilds")
    app = tmp_path / "app"
    app.mkdir()
    subprocess.run(["npm", "init", "-y"], cwd=app, check=True, capture_output=True)
    # the version the web package pins (scripts/better_sqlite3.sh keeps a build of it per machine)
    pinned = json.load(open(os.path.join(ROOT, "integrations", "node", "package.json")))["devDependencies"]["better-sqlite3"]
    subprocess.run(["npm", "install", "--no-audit", "--no-fund", tarball, f"better-sqlite3@{pinned}"], cwd=app, env=env,
                   check=True, capture_output=True)
    program = """
const assert = require("assert");
const Database = require("better-sqlite3");
const ratelimit = require("sqlite-ratelimit");
assert.ok(require("fs").existsSync(ratelimit.getLoadablePath() + ".so"));
const db = new Database(":memory:");
ratelimit.load(db);
const r = JSON.parse(db.prepare("SELECT rl_take('user:42', 3, 60, 1, 0) AS r").get().r);
assert.deepStrictEqual([r.admitted, r.remaining], [true, 2]);
assert.strictEqual(db.prepare("SELECT rl_version() AS v").get().v, %r);
let sqlite;
try { sqlite = require("node:sqlite"); } catch (e) { sqlite = null; }
if (sqlite) {  // Node 22.13 and later
  const d = new sqlite.DatabaseSync(":memory:", { allowExtension: true });
  ratelimit.load(d);
  assert.strictEqual(d.prepare("SELECT rl_version() AS v").get().v, %r);
}
console.log("ok");
""" % (CARGO_VERSION, CARGO_VERSION)
    out = subprocess.run(["node", "-e", program], cwd=app, capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr
