"""The packages of scripts/package.sh, installed the way their users install them."""
import glob
import os
import subprocess
import sys

import pytest

from conftest import CARGO_VERSION, ROOT

DIST = os.path.join(ROOT, "dist")


def test_the_python_wheel_installs_and_loads(tmp_path):
    wheels = glob.glob(os.path.join(DIST, f"sqlite_ratelimit-{CARGO_VERSION}-py3-none-*.whl"))
    if not wheels:
        if os.environ.get("RL_REQUIRE_PACKAGES") == "1":
            pytest.fail("no wheel in dist/: run bash scripts/package.sh")
        pytest.skip("no wheel in dist/ (bash scripts/package.sh builds it)")
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-index", wheels[0]], check=True)
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
