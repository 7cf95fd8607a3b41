"""The SQLite paths on every supported Python, whether or not its sqlite3 can load
extensions. The test command runs this file twice: in the web tests' virtualenv (Debian's
python3, whose sqlite3 can) and in the Django 6 one (a pyenv Python 3.12 or later, built
without loadable-extension support, with sqlean.py installed), where the limiters and the
command-line tool must choose sqlean and work, and must say what to do once it is gone."""
import os
import sqlite3
import subprocess
import sys
import types

import anyio
import pytest

from ratelimit_web import Route, SQLiteLimiter, SyncSQLiteLimiter
from ratelimit_web import limiter as limiter_module
from ratelimit_web.limiter import NO_EXTENSIONS, ExtensionsUnsupported, sqlite_driver

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
EXTENSION = os.path.join(ROOT, "target", "release", "libratelimit")
CAN_LOAD = hasattr(sqlite3.Connection, "enable_load_extension")
ROUTE = Route(limits=[{"burst": 2, "refill_per_minute": 1e-6}], name="/p")


def test_the_driver_is_the_standard_librarys_where_it_can_load_extensions_else_sqlean():
    if os.environ.get("RL_EXPECT_NO_LOAD_EXTENSION") == "1":
        assert not CAN_LOAD, f"{sys.executable}'s sqlite3 can load extensions: this run proves nothing"
    driver = sqlite_driver()
    assert driver is sqlite3 if CAN_LOAD else driver.__name__ == "sqlean"


def test_the_sync_limiter_checks_on_sqlite(tmp_path):
    limiter = SyncSQLiteLimiter(str(tmp_path / "app.db"), extension=EXTENSION)
    answers = [limiter.check(ROUTE, "ip:203.0.113.9", None, 1) for _ in range(3)]
    assert [a.admitted for a in answers] == [True, True, False]
    assert answers[1].headers["X-RateLimit-Remaining"] == "0"


def test_the_async_limiter_checks_and_charges_on_sqlite(tmp_path):
    async def run():
        limiter = SQLiteLimiter(str(tmp_path / "app.db"), extension=EXTENSION, threads=2)
        await limiter.open()
        try:
            first = await limiter.check(ROUTE, "user:ann", None, 1)
            charged = await limiter.charge(ROUTE, "user:ann", None, 3)
            refused = await limiter.check(ROUTE, "user:ann", None, 1)
        finally:
            await limiter.aclose()
        return first, charged, refused

    first, charged, refused = anyio.run(run)
    assert first.admitted and not refused.admitted
    assert charged.result["items"][0]["remaining"] == -2  # 2 - 1 - 3: the debt a charge may leave


def test_the_command_line_tool_sets_a_policy_on_sqlite(tmp_path):
    db = str(tmp_path / "ops.db")
    env = dict(os.environ, RATELIMIT_SQLITE_EXTENSION=EXTENSION)
    out = subprocess.run([sys.executable, "-m", "ratelimit_web.cli", "--db", db, "policy", "set", "login",
                          '{"limits": [{"burst": 5, "refill_per_minute": 5}]}'], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    listed = subprocess.run([sys.executable, "-m", "ratelimit_web.cli", "--db", db, "policy", "list"],
                            capture_output=True, text=True, env=env)
    assert '"name": "login"' in listed.stdout, listed.stderr


def test_a_database_string_that_names_nothing_is_refused_not_made_a_file(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ratelimit_web.cli", "--db", "app", "policy", "list"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1
    assert "'app' names no database: a PostgreSQL one is postgresql://HOST/NAME or dbname=NAME" in out.stderr
    assert not (tmp_path / "app").exists()


def test_without_a_sqlite3_that_can_the_error_says_why_and_what_to_do(monkeypatch, tmp_path):
    # a sqlite3 without enable_load_extension, and no sqlean: what such a Python meets
    monkeypatch.setattr(limiter_module, "sqlite3", types.SimpleNamespace(Connection=object, Error=sqlite3.Error,
                                                                         OperationalError=sqlite3.OperationalError))
    monkeypatch.setitem(sys.modules, "sqlean", None)
    with pytest.raises(ExtensionsUnsupported, match="cannot load extensions .* pip install sqlean.py"):
        SyncSQLiteLimiter(str(tmp_path / "app.db"), extension=EXTENSION)
    assert "ratelimit-web[sqlean]" in NO_EXTENSIONS


@pytest.mark.skipif(CAN_LOAD, reason="this Python's sqlite3 loads extensions: no such error to meet")
def test_on_this_python_without_sqlean_the_limiter_says_why(tmp_path):
    code = ("import sys; sys.modules['sqlean'] = None\n"
            "from ratelimit_web import SyncSQLiteLimiter\n"
            f"SyncSQLiteLimiter({str(tmp_path / 'app.db')!r}, extension={EXTENSION!r})\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1
    assert "ExtensionsUnsupported: ratelimit_web: this Python's sqlite3 cannot load extensions" in out.stderr
    assert "pip install sqlean.py" in out.stderr
