"""Black-box test fixtures: the built SQLite extension through Python's sqlite3 module and
the sqlite3 shell, and the installed PostgreSQL extension through psycopg2.

Run with Debian's /usr/bin/python3 (its sqlite3 module can load extensions).
Environment: RL_SQLITE_EXT (path of libratelimit without .so), and for PostgreSQL the
usual PGHOST/PGPORT/PGUSER of a cluster where pg_ratelimit is installed; PostgreSQL
tests are skipped when PGHOST is not set, unless RL_REQUIRE_PG=1 makes that a failure.
"""
import contextlib
import json
import os
import re
import sqlite3
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SQLITE_EXT = os.environ.get("RL_SQLITE_EXT", os.path.join(ROOT, "target", "release", "libratelimit"))

# Every SQL function as the core's table describes it (generated from shared/src/surface/functions.rs).
with open(os.path.join(ROOT, "tests", "functions.json")) as f:
    FUNCTIONS = json.load(f)
PUBLIC = [f["name"] for f in FUNCTIONS if f["kind"] != "internal"]
# PostgreSQL only: about the server's shared memory, which SQLite has no counterpart of.
SERVER = [f["name"] for f in FUNCTIONS if f["kind"] == "server"]
SQLITE_PUBLIC = [name for name in PUBLIC if name not in SERVER]
STATEFUL = [f["name"] for f in FUNCTIONS if f["kind"] == "state"]
INTERNAL = {f["name"]: len(f["params"]) for f in FUNCTIONS if f["kind"] == "internal"}
RESULT_KEYS = {f["name"]: f["result_keys"] for f in FUNCTIONS}
with open(os.path.join(ROOT, "Cargo.toml")) as f:
    CARGO_VERSION = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)

# Which edition PostgreSQL tests install: "native" (CREATE EXTENSION pg_ratelimit) or the SQL
# edition for managed PostgreSQL, installed by a database owner that is no superuser: from its
# plain script (RL_PG_EDITION=sql) or registered with pg_tle and then created as an extension
# (RL_PG_EDITION=pg_tle, on a cluster that preloads pg_tle).
INSTALL = os.environ.get("RL_PG_EDITION", "native")
EDITION = "sql" if INSTALL in ("sql", "pg_tle") else "native"
native_only = pytest.mark.skipif(EDITION == "sql", reason="about the native extension (the SQL edition has its own)")
# What rl_version() answers on PostgreSQL: the SQL edition says which it is.
PG_VERSION_ANSWER = CARGO_VERSION + ("-sql" if EDITION == "sql" else "")


# The tests that do not depend on the PostgreSQL major (SQLite's, the packages' and the
# README's on SQLite) run once per test command: RL_SQLITE=0 skips them on the other majors.
SQLITE_ONLY_FILES = {"test_sqlite.py", "test_sqlite_faults.py", "test_packages.py"}


def pytest_collection_modifyitems(config, items):
    if os.environ.get("RL_SQLITE") != "0":
        return
    skip = pytest.mark.skip(reason="RL_SQLITE=0: SQLite's tests ran on the first major already")
    for item in items:
        name = item.name.lower()
        if (os.path.basename(str(item.fspath)) in SQLITE_ONLY_FILES or "sqlite" in name
                or "sqlite_db" in getattr(item, "fixturenames", ()) or "[sqlite" in name):
            item.add_marker(skip)


def sqlite_connect(path, timeout=30.0):
    conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
    conn.enable_load_extension(True)
    conn.load_extension(SQLITE_EXT)
    conn.enable_load_extension(False)
    return conn


@pytest.fixture
def sqlite_db(tmp_path):
    path = str(tmp_path / "state.db")
    conn = sqlite_connect(path)
    yield conn, path
    conn.close()


class SqliteEngine:
    name = engine = "sqlite"

    def __init__(self, conn):
        self.conn = conn

    def call(self, function, *args):
        placeholders = ", ".join("?" for _ in args)
        (value,) = self.conn.execute(f"SELECT {function}({placeholders})", args).fetchone()
        return json.loads(value) if isinstance(value, str) and value.startswith("{") else value

    def error_of(self, function, *args):
        try:
            self.call(function, *args)
        except sqlite3.Error as e:
            return str(e), None
        raise AssertionError(f"{function}{args} did not fail")


class PgEngine:
    engine = "postgres"
    version = PG_VERSION_ANSWER

    def __init__(self, conn, name="postgres"):
        self.conn = conn
        self.name = name

    def call(self, function, *args):
        placeholders = ", ".join("%s" for _ in args)
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT {function}({placeholders})", args)
            (value,) = cur.fetchone()
        return value

    def error_of(self, function, *args):
        import psycopg2

        try:
            self.call(function, *args)
        except psycopg2.Error as e:
            return e.diag.message_primary, e.pgcode
        raise AssertionError(f"{function}{args} did not fail")


def pg_available():
    if os.environ.get("PGHOST"):
        return True
    if os.environ.get("RL_REQUIRE_PG") == "1":
        pytest.fail("RL_REQUIRE_PG=1 but PGHOST is not set")
    return False


def pg_connect(dbname, autocommit=True):
    import psycopg2

    conn = psycopg2.connect(dbname=dbname)
    conn.autocommit = autocommit
    return conn


def run_sessions(dbname, count, work, timeout=120):
    """Runs work(i, conn) in `count` threads, each with its own connection, all starting
    together (a barrier), and fails on any error or on a session that never finishes."""
    import threading

    barrier = threading.Barrier(count)
    errors = []

    def session(i):
        try:
            conn = pg_connect(dbname)
            barrier.wait()
            work(i, conn)
            conn.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=session, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a session hung (deadlock?)"
    assert errors == []


@contextlib.contextmanager
def pg_database(prefix="rl_test", extension=True):
    """A new database (with pg_ratelimit created unless told not to), dropped afterwards
    even when the test or the set-up fails (and after a crash of the server: the drop
    uses a connection of its own). Yields its name."""
    if not pg_available():
        pytest.skip("PGHOST not set: no PostgreSQL cluster for client tests")
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin(f"CREATE DATABASE {name}")
    owner = f"owner_{name}"
    try:
        if extension and EDITION == "sql":
            install_sql_edition(name, owner)
        elif extension:
            conn = pg_connect(name)
            with conn.cursor() as cur:
                cur.execute("CREATE EXTENSION pg_ratelimit")
            conn.close()
        yield name
    finally:
        admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if extension and EDITION == "sql":
            admin(f"DROP ROLE IF EXISTS {owner}")


def install_sql_edition(name, owner, through=None):
    """Makes `owner` (CREATEDB and CREATEROLE, no superuser: a managed service's master user)
    the owner of database `name` and installs the SQL edition there as that role: from the
    plain script, or (through "pg_tle") registered with pg_tle, as a member of pgtle_admin,
    and created as the extension pg_ratelimit_sql."""
    import psycopg2

    through = through or INSTALL
    admin(f"CREATE ROLE {owner} LOGIN CREATEDB CREATEROLE")
    admin(f"ALTER DATABASE {name} OWNER TO {owner}")
    if through == "pg_tle":
        superuser = pg_connect(name)
        with superuser.cursor() as cur:
            cur.execute("CREATE EXTENSION IF NOT EXISTS pg_tle")
            cur.execute(f"GRANT pgtle_admin TO {owner}")
        superuser.close()
    if through != "pg_tle":
        run_plain_script(name, owner)
        return
    conn = psycopg2.connect(dbname=name, user=owner)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql_edition_script("pg_tle.sql"))
            cur.execute("CREATE EXTENSION pg_ratelimit_sql")
    finally:
        conn.close()


def psql_program():
    """psql of the server's own major where its bin folder has one, else the machine's."""
    own = os.path.join(os.environ.get("RL_PG_BIN", ""), "psql")
    return own if os.path.exists(own) else "psql"


def run_plain_script(name, role, *options, script=None, check=True):
    """The SQL edition's plain script (or `script`, a path) run as users run it: psql -f,
    as `role` on database `name`, with psql `options` such as ("-v", "rl_schema=x")."""
    import subprocess

    path = script or sql_edition_script_path()
    out = subprocess.run([psql_program(), "-X", "-q", "-U", role, "-d", name, *options, "-f", path],
                         capture_output=True, text=True)
    if check and out.returncode != 0:
        raise AssertionError(f"the script failed as {role}: {out.stderr}")
    return out


def pg_tle_preloaded():
    if not pg_available():
        pytest.skip("PGHOST not set: no PostgreSQL cluster for client tests")
    conn = pg_connect("postgres")
    with conn.cursor() as cur:
        cur.execute("SELECT 'pg_tle' = ANY (string_to_array(replace(current_setting('shared_preload_libraries'), ' ', ''), ','))")
        (preloaded,) = cur.fetchone()
    conn.close()
    return preloaded


def assert_refused_read_only(cur, sql, function):
    """In the cursor's open read-only transaction, `sql` fails with 25006 and a message that
    names `function`; the transaction goes on (a savepoint takes the failure)."""
    import psycopg2

    cur.execute("SAVEPOINT refused")
    with pytest.raises(psycopg2.errors.ReadOnlySqlTransaction) as e:
        cur.execute(sql)
    assert e.value.diag.message_primary.startswith(f"{function}: cannot change rate-limit state")
    cur.execute("ROLLBACK TO SAVEPOINT refused")


def admin(sql):
    """Runs one statement on the postgres database, on a connection of its own."""
    conn = pg_connect("postgres")
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


def amcheck_state_tables(cur):
    """amcheck over the state tables: each primary key's btree against every heap tuple
    (with its parent pages) and each heap itself; fails on any finding. False where the
    server has no amcheck (the PostgreSQL 16 wheel has no contrib); Debian's 15 has it."""
    cur.execute("SELECT current_setting('server_version_num')::int / 10000, "
                "EXISTS (SELECT FROM pg_available_extensions WHERE name = 'amcheck')")
    major, available = cur.fetchone()
    if not available:
        assert major != 15, "amcheck is part of Debian's postgresql-15"
        return False
    cur.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
    for table in ("rl_bucket", "rl_budget", "rl_entries", "rl_policy", "rl_usage", "rl_setting"):
        cur.execute(f"SELECT bt_index_check('ratelimit.{table}_pkey', true)")
        cur.execute(f"SELECT bt_index_parent_check('ratelimit.{table}_pkey', true)")
        cur.execute(f"SELECT count(*) FROM verify_heapam('ratelimit.{table}')")
        assert cur.fetchone()[0] == 0, f"amcheck found ratelimit.{table}'s heap damaged"
    return True


@contextlib.contextmanager
def pg_test_database(buckets="table", direct_writes=True):
    """A fresh database with pg_ratelimit created, the explicit clock allowed and buckets
    in `buckets` ('table' or 'memory'), the table store's bucket rows changed in the heap
    directly or (`direct_writes` False) by its guarded UPDATE, set for every session of the
    database as a superuser would. Yields a connection (a superuser's) and the database's name."""
    if EDITION == "sql" and buckets == "memory":
        pytest.skip("the SQL edition has no memory store")
    if EDITION == "sql" and not direct_writes:
        pytest.skip("the SQL edition has one way to write")
    with pg_database() as name:
        conn = pg_connect(name)
        try:
            # The SQL edition needs no setting: the owner and members of rl_admin (a
            # superuser is one) may pass now_ms.
            if EDITION != "sql":
                with conn.cursor() as cur:
                    cur.execute("LOAD 'pg_ratelimit'")  # its settings exist once the library is loaded
                    settings = (("allow_explicit_clock", "on"), ("buckets", buckets),
                                ("direct_writes", "on" if direct_writes else "off"))
                    for setting, value in settings:
                        cur.execute(f"ALTER DATABASE {name} SET pg_ratelimit.{setting} = '{value}'")
                        cur.execute(f"SET pg_ratelimit.{setting} = '{value}'")
            yield conn, name
        finally:
            conn.close()


@pytest.fixture
def pg_db():
    """A fresh database with buckets in the table store (the default)."""
    with pg_test_database() as db:
        yield db


@pytest.fixture(params=["table", "table by statement", "memory"])
def pg_store_db(request):
    """A fresh database for each store of buckets, and for the table store's two ways of
    changing a bucket row (in the heap directly, the default, or by its guarded UPDATE)."""
    buckets = request.param.split()[0]
    with pg_test_database(buckets, direct_writes=request.param != "table by statement") as db:
        yield db


@pytest.fixture
def pg_memory_db():
    """A fresh database with buckets in the memory store (the cluster preloads pg_ratelimit)."""
    with pg_test_database("memory") as db:
        yield db


@pytest.fixture
def sqlite_engine(sqlite_db):
    return SqliteEngine(sqlite_db[0])


@pytest.fixture
def pg_engine(pg_db):
    return PgEngine(pg_db[0])


@pytest.fixture
def pg_memory_engine(pg_memory_db):
    return PgEngine(pg_memory_db[0], "postgres-memory")


@pytest.fixture(params=["sqlite", "postgres", "postgres-memory"])
def engine(request):
    """One engine and store per parameter, each on a fresh database."""
    if request.param == "sqlite":
        return SqliteEngine(request.getfixturevalue("sqlite_db")[0])
    if request.param == "postgres":
        return PgEngine(request.getfixturevalue("pg_db")[0])
    return PgEngine(request.getfixturevalue("pg_memory_db")[0], request.param)


def one(conn, sql, args=()):
    """The one value a PostgreSQL statement returns."""
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchone()[0]


_SQL_EDITION_BUILT = []


def sql_edition_script_path(form="sql"):
    """The SQL edition's install script as scripts/package.sh --sql writes it ('sql': for
    psql -f; 'pg_tle.sql': pg_tle's registration), built once per test run: by this process
    on its first use, unless the test command built dist/ already (RL_DIST_BUILT=1)."""
    import subprocess

    path = os.path.join(ROOT, "dist", f"pg_ratelimit_sql-{CARGO_VERSION}.{form}")
    if os.environ.get("RL_DIST_BUILT") == "1" and os.path.exists(path):
        _SQL_EDITION_BUILT.append(True)
    if not _SQL_EDITION_BUILT:
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "package.sh"), "--sql"], check=True,
                       stdout=subprocess.DEVNULL)
        _SQL_EDITION_BUILT.append(True)
    return path


def sql_edition_script(form="sql"):
    with open(sql_edition_script_path(form)) as f:
        return f.read()


@contextlib.contextmanager
def sql_edition_database():
    """A fresh database with the SQL edition installed by a non-superuser owner (whichever
    edition the other tests use). Yields a connection of the owner's and the database's name."""
    import psycopg2

    if not pg_available():
        pytest.skip("PGHOST not set: no PostgreSQL cluster for client tests")
    with pg_database("rl_sql", extension=False) as name:
        owner = f"owner_{name}"
        install_sql_edition(name, owner)
        try:
            conn = psycopg2.connect(dbname=name, user=owner)
            conn.autocommit = True
            try:
                yield conn, name
            finally:
                conn.close()
        finally:
            admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin(f"DROP ROLE IF EXISTS {owner}")


@pytest.fixture
def pg_sql_db():
    """A fresh database with the SQL edition installed by a non-superuser owner."""
    with sql_edition_database() as db:
        yield db


@pytest.fixture
def pg_sql_engine(pg_sql_db):
    engine = PgEngine(pg_sql_db[0], "postgres-sql")
    engine.version = f"{CARGO_VERSION}-sql"
    return engine
