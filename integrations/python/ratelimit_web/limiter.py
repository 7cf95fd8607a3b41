"""The database side: one SQL statement per check, on PostgreSQL (psycopg 3) or SQLite (the
loadable extension). The async limiters serve ASGI (an async pool; SQLite in worker
threads); the sync ones serve WSGI and Django (a pool, or a connection per thread). Both
build their statements in one place, `_Statements`."""
from __future__ import annotations

import json
import queue
import random
import sqlite3
import sys
import threading
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import anyio
import anyio.to_thread


class DatabaseUnavailable(Exception):
    """The database did not answer: connection refused or lost, pool exhausted, locked."""


#: A check of a policy that does not exist fails with this SQLSTATE on PostgreSQL
#: (undefined_object) and, on SQLite, which has no SQLSTATE, with a message that starts
#: with one of these (the function's name, then the stable text).
UNKNOWN_POLICY_SQLSTATE = "42704"
UNKNOWN_POLICY_PREFIXES = ("rl_check: there is no policy named ", "rl_refund_check: there is no policy named ")


def is_missing_policy(error: BaseException) -> bool:
    """Whether the database refused a check because its policy does not exist (by its
    code; a driver's error may be wrapped, as Django's are)."""
    for e in (error, error.__cause__):
        if e is None:
            continue
        if (getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)) == UNKNOWN_POLICY_SQLSTATE:
            return True
        if isinstance(e, sqlite_errors("Error")) and str(e).startswith(UNKNOWN_POLICY_PREFIXES):
            return True
    return False


@dataclass(frozen=True)
class Answer:
    """What the database answered for one check: the rl_check / rl_take_all result and
    the HTTP headers rl_headers made of it."""

    result: dict
    headers: dict

    @property
    def admitted(self) -> bool:
        return bool(self.result["admitted"])


def limit_key(route_name: str, subject: str, index: int) -> str:
    """The key of a route's explicit limit `index` for `subject`: rl_key('web', route,
    subject, index), so routes and subjects never share a bucket."""
    return json.dumps(["web", route_name, subject, str(index)], ensure_ascii=False, separators=(",", ":"))


def take_items(route, subject: str, multiplier: float, cost: float) -> list:
    """The rl_take_all items of a route with explicit limits, passed through whatever their
    kind: each limit with its key, the cost and the tier's multiplier, which the engine
    applies as it applies a policy's tier."""
    scale = {} if multiplier == 1 else {"multiplier": multiplier}
    return [{**limit, "key": limit_key(route.name, subject, i), "cost": cost, **scale}
            for i, limit in enumerate(route.limits)]


class _Statements:
    """The SQL texts, written once with the engine's placeholder."""

    def __init__(self, placeholder: str, json_param: str):
        p = placeholder
        # MATERIALIZED: the limit is taken once, then its headers are read (neither engine
        # may inline a call that writes).
        self.check = (f"WITH c(r) AS MATERIALIZED (SELECT rl_check({p}, {p}, {p}, {p})) "
                      "SELECT r, rl_headers(r) FROM c")
        # rl_check_limits: rl_take_all counted under the route's name, as rl_check counts
        # a policy, so the operator's page, `top` and the exporter show the route too
        self.take_all = (f"WITH c(r) AS MATERIALIZED (SELECT rl_check_limits({p}, {p}, {json_param})) "
                         "SELECT r, rl_headers(r) FROM c")
        self.refund_check = f"SELECT rl_refund_check({p}, {p}, {p}, {p})"
        self.refund_all = f"SELECT rl_refund_all({json_param})"
        self.charge_check = (f"WITH c(r) AS MATERIALIZED (SELECT rl_charge_check({p}, {p}, {p}, {p})) "
                             "SELECT r, rl_headers(r) FROM c")
        self.charge_all = (f"WITH c(r) AS MATERIALIZED (SELECT rl_charge_all({json_param})) "
                           "SELECT r, rl_headers(r) FROM c")
        self.validate = f"SELECT rl_policy_validate({json_param})"
        self.policy_set = f"SELECT rl_policy_set({p}, {json_param})"

    def for_check(self, route, subject: str, tier: Optional[str], cost: float) -> tuple:
        """Takes `cost` from the route's limits for `subject` (all or nothing); its row
        becomes an Answer by `answer_of`."""
        if route.policy is not None:
            return self.check, [route.policy, subject, cost, tier]
        items = json.dumps(take_items(route, subject, route.multiplier(tier), cost))
        return self.take_all, [route.name or "unnamed route", subject, items]

    def for_refund(self, route, subject: str, tier: Optional[str], cost: float) -> tuple:
        """Gives back what an admitted check took (a handler failed): rl_refund_check for a
        policy, rl_refund_all (the inverse of rl_take_all, over the same items) for explicit
        limits."""
        if route.policy is not None:
            return self.refund_check, [route.policy, subject, cost, tier]
        return self.refund_all, [json.dumps(take_items(route, subject, route.multiplier(tier), cost))]

    def for_charge(self, route, subject: str, tier: Optional[str], cost: float) -> tuple:
        """Charges `cost` after the work, whatever the limits hold (into debt, past a
        quota): rl_charge_check for a policy, rl_charge_all over the route's items; its row
        becomes an Answer by `answer_of`."""
        if route.policy is not None:
            return self.charge_check, [route.policy, subject, cost, tier]
        return self.charge_all, [json.dumps(take_items(route, subject, route.multiplier(tier), cost))]

    def for_probe(self, policy: str) -> tuple:
        """Whether `policy` exists: rl_refund_check for a subject of no one's finds nothing
        to give back and so changes nothing; a missing policy is its error."""
        return self.refund_check, [policy, PROBE_SUBJECT, 1, None]

    def for_policy(self, name: str, definition: dict) -> tuple:
        return self.policy_set, [name, json.dumps(definition)]

    def for_validation(self, definition: dict) -> tuple:
        """The engine's own validation of a route's explicit limits (as a policy
        definition: rl_policy_validate), which writes nothing."""
        return self.validate, [json.dumps(definition)]


def _decoded(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _refusal(error: Exception) -> str:
    """The engine's refusal of a route's limits, as the route's own: "limits item 2: burst
    must be a finite number greater than 0, got 0" (any other error is raised again)."""
    if isinstance(error, DatabaseUnavailable):
        raise error
    message = str(getattr(error, "__cause__", None) or error).strip().splitlines()[0]
    prefix = "rl_policy_validate: "
    if prefix not in message:
        raise error
    message = message[message.index(prefix) + len(prefix):]
    return message.replace("definition.limits", "limits").replace("definition.tiers", "tiers").replace(
        "definition", "the route")


def _absent(error: Exception) -> bool:
    """The policy probe failed with `error`: False when it says the policy is missing; any
    other error (the database did not answer, ...) is raised again."""
    if isinstance(error, DatabaseUnavailable) or not is_missing_policy(error):
        raise error
    return False


def answer_of(row: tuple) -> Answer:
    """A check's row (the result and its headers; text on SQLite, jsonb on PostgreSQL)."""
    return Answer(_decoded(row[0]), _decoded(row[1]))


class _Limiter:
    statements: _Statements

    async def fetchone(self, sql: str, params: list) -> Optional[tuple]:
        """Runs one statement on the limiter's connections (placeholders: %s on PostgreSQL,
        ? on SQLite) and returns its first row: for an application's own calls, such as
        rl_penalize."""
        raise NotImplementedError

    async def check(self, route, subject: str, tier: Optional[str], cost: float) -> Answer:
        return answer_of(await self.fetchone(*self.statements.for_check(route, subject, tier, cost)))

    async def refund(self, route, subject: str, tier: Optional[str], cost: float) -> None:
        await self.fetchone(*self.statements.for_refund(route, subject, tier, cost))

    async def charge(self, route, subject: str, tier: Optional[str], cost: float) -> Answer:
        return answer_of(await self.fetchone(*self.statements.for_charge(route, subject, tier, cost)))

    async def wait(self, route, subject: str, *, tier: Optional[str] = None, cost: float = 1,
                   timeout: float = 30.0, jitter: float = 0.1) -> Answer:
        """Takes `cost` for `subject` (a policy's subject, or the key of explicit limits) as
        soon as the limits allow, for background jobs that call a rate-limited service:
        after a refusal it sleeps the answer's retry time (plus up to `jitter` of it, so
        waiters spread out) and asks again. Gives up, returning the refusal, when the next
        try would pass `timeout` seconds or when no wait can admit (a cost above a limit, a
        block without end). Cancellable like any anyio sleep."""
        deadline = anyio.current_time() + timeout
        while True:
            answer = await self.check(route, subject, tier, cost)
            if answer.admitted:
                return answer
            r = answer.result
            wait_ms = r.get("retry_after_ms")
            never = bool(r.get("exceeds_limit")) or any(i.get("exceeds_limit") for i in r.get("items", ()))
            if never or not isinstance(wait_ms, (int, float)):
                return answer
            pause = wait_ms / 1000 * (1 + random.uniform(0, jitter))
            if anyio.current_time() + pause > deadline:
                return answer
            await anyio.sleep(pause)

    async def validate_limits(self, definition: dict) -> Tuple[Optional[str], Optional[list]]:
        """(None, the limits as the engine read them), or (what it refuses in them, None)."""
        try:
            row = await self.fetchone(*self.statements.for_validation(definition))
        except Exception as e:
            return _refusal(e), None
        return None, _decoded(row[0])["limits"]

    async def set_policy(self, name: str, definition: dict) -> dict:
        """Inserts or replaces a policy (rl_policy_set; on PostgreSQL, as a member of
        rl_admin or the extension's owner); returns it as stored."""
        return _decoded((await self.fetchone(*self.statements.for_policy(name, definition)))[0])

    async def policy_exists(self, policy: str) -> bool:
        """Whether the database holds `policy`."""
        try:
            await self.fetchone(*self.statements.for_probe(policy))
        except Exception as e:
            return _absent(e)
        return True


# The subject of the startup check: never a request's (those are "user:..." or "ip:...").
PROBE_SUBJECT = "ratelimit_web:startup-check"


# How long past its own timeout a check may still be awaited before the connection itself
# is taken for lost (a network that stopped answering): the database cancels the statement
# at its timeout, so only a lost connection ever reaches this.
GRACE = 1.0


class PostgresLimiter(_Limiter):
    """Checks on PostgreSQL with pg_ratelimit installed, through a psycopg 3 async pool.
    The pool reconnects by itself; `open()` does not wait for the database, so an
    application starts (and falls back) while it is down. `timeout` (0.5 s) bounds the
    wait for a connection and each statement: the server cancels a statement at its
    `statement_timeout`, so a check that gives up has written nothing, and the local
    fallback never admits beside a take the database is still making."""

    def __init__(self, conninfo: str = "", *, min_size: int = 2, max_size: int = 10, timeout: float = 0.5, pool=None):
        from psycopg_pool import AsyncConnectionPool

        self.timeout = timeout
        options = f"-c statement_timeout={max(1, int(timeout * 1000))}"
        self.pool = pool or AsyncConnectionPool(conninfo, min_size=min_size, max_size=max_size, open=False,
                                                kwargs={"autocommit": True, "options": options}, reconnect_timeout=0)
        self.statements = _Statements("%s", "%s::jsonb")

    async def open(self) -> None:
        await self.pool.open(wait=False)

    async def aclose(self) -> None:
        await self.pool.close()

    async def fetchone(self, sql: str, params: list) -> Optional[tuple]:
        import psycopg
        import psycopg_pool

        try:
            with anyio.fail_after(self.timeout + GRACE):
                async with self.pool.connection(timeout=self.timeout) as conn:
                    cur = await conn.execute(sql, params)
                    return await cur.fetchone() if cur.description is not None else None
        except TimeoutError as e:
            raise DatabaseUnavailable(f"no answer within {(self.timeout + GRACE) * 1000:g} ms: the connection is lost") from e
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout, OSError) as e:
            raise DatabaseUnavailable(str(e).strip() or type(e).__name__) from e


# What makes SQLite unable to decide now, by primary result code: SQLITE_BUSY (another
# connection holds the write lock past the busy timeout), SQLITE_LOCKED (a table held in a
# shared cache), SQLITE_CANTOPEN (the file cannot be opened).
_UNAVAILABLE_CODES = (5, 6, 14)


def _extension(path: Optional[str]) -> str:
    """The loadable extension's path: as given, else the sqlite-ratelimit package's."""
    if path is not None:
        return path
    import sqlite_ratelimit  # the extension's own package (pip install sqlite-ratelimit)

    return sqlite_ratelimit.loadable_path()


#: Why SQLite cannot be used here, and what to do.
NO_EXTENSIONS = ("this Python's sqlite3 cannot load extensions (its SQLite was built without loadable-extension "
                 "support, as pyenv's and some distributions' are): pip install sqlean.py (a maintained sqlite3 "
                 "that can; ratelimit-web uses it when it is installed, also as the extra ratelimit-web[sqlean]), "
                 "or run a Python whose sqlite3 can (Debian's and Ubuntu's python3, for one)")


class ExtensionsUnsupported(RuntimeError):
    """This Python cannot load SQLite extensions, and sqlean.py is not installed."""


def sqlite_driver():
    """The sqlite3 module the limiters use: the standard library's when it can load
    extensions, else sqlean.py's (the same interface, a SQLite that can), else
    ExtensionsUnsupported saying so."""
    if hasattr(sqlite3.Connection, "enable_load_extension"):
        return sqlite3
    try:
        import sqlean
    except ImportError:
        raise ExtensionsUnsupported(f"ratelimit_web: {NO_EXTENSIONS}") from None
    return sqlean


def sqlite_errors(name: str) -> tuple:
    """The exception class `name` (Error, OperationalError) of every sqlite3 module in use."""
    modules = [sqlite3] + ([sys.modules["sqlean"]] if sys.modules.get("sqlean") is not None else [])
    return tuple(getattr(m, name) for m in modules)


def load_extension(conn, extension: str) -> None:
    if not hasattr(conn, "enable_load_extension"):  # a connection this Python's sqlite3 made (Django's)
        raise ExtensionsUnsupported(f"ratelimit_web: {NO_EXTENSIONS}")
    conn.enable_load_extension(True)
    try:
        conn.load_extension(extension)
    finally:
        conn.enable_load_extension(False)


def _sqlite_connect(path: str, extension: str, busy_timeout: float):
    """A connection of the limiter's own (sqlite_driver's), in autocommit, with the
    extension and WAL; an error names the file."""
    driver = sqlite_driver()
    try:
        conn = driver.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
        load_extension(conn, extension)
        conn.execute("PRAGMA journal_mode=wal")
    except driver.Error as e:
        raise driver.OperationalError(f"{path}: {e} (the database file, its folder or the extension "
                                       f"{extension})") from e
    return conn


def _make_tables(conn) -> None:
    """The state tables, made before any request pays for them (a call on a new file makes
    them: tens of milliseconds): a sweep that can remove nothing (its clock is 0)."""
    conn.execute("SELECT rl_sweep(0, 1)").fetchone()


def _unavailable(e) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    if code is None:  # Python before 3.11 gives no code: read SQLite's words
        return any(words in str(e) for words in ("database is locked", "database table is locked", "unable to open"))
    return code & 0xFF in _UNAVAILABLE_CODES


def _sqlite_fetchone(conn, path: str, sql: str, params: list) -> Optional[tuple]:
    """One statement's first row; a lock not had in time (or a file that cannot be
    opened) is DatabaseUnavailable, naming the file."""
    try:
        return conn.execute(sql, params).fetchone()
    except sqlite_errors("OperationalError") as e:
        if _unavailable(e):
            raise DatabaseUnavailable(f"{path}: {e}") from e
        raise


class SQLiteLimiter(_Limiter):
    """Checks on a SQLite database file with the loadable extension, on `threads`
    connections opened by `open()` (which also makes the state tables, so that no request
    pays for it) and used from worker threads. A check waits up to `timeout` (1 s) for a
    thread, then for SQLite's write lock (busy_timeout); past either it has written
    nothing and the fallback decides. A check that has started is always waited for:
    its statement is one SQLite call, bounded by the lock wait."""

    def __init__(self, path: str, *, extension: Optional[str] = None, threads: int = 4, timeout: float = 1.0,
                 busy_timeout: Optional[float] = None):
        self.path, self.extension, self.size = path, _extension(extension), threads
        self.timeout = timeout if busy_timeout is None else busy_timeout
        self.threads = anyio.CapacityLimiter(threads)
        self.idle: "queue.SimpleQueue" = queue.SimpleQueue()
        self.statements = _Statements("?", "?")

    async def open(self) -> None:
        """Opens the connections now, so that no check pays for one, and makes the state
        tables (a first call on a new file creates them: tens of milliseconds)."""
        for i in range(self.size):
            conn = await anyio.to_thread.run_sync(_sqlite_connect, self.path, self.extension, self.timeout)
            if i == 0:
                await anyio.to_thread.run_sync(_make_tables, conn)
            self.idle.put(conn)

    async def aclose(self) -> None:
        while not self.idle.empty():
            self.idle.get().close()

    def _run_here(self, sql: str, params: list) -> Optional[tuple]:
        conn = self.idle.get()
        try:
            return _sqlite_fetchone(conn, self.path, sql, params)
        finally:
            self.idle.put(conn)

    async def fetchone(self, sql: str, params: list) -> Optional[tuple]:
        # a connection first, within the timeout (a check that never got one never ran)...
        try:
            with anyio.fail_after(self.timeout):
                await self.threads.acquire()
        except TimeoutError as e:
            raise DatabaseUnavailable(f"{self.path}: no connection free within {self.timeout * 1000:g} ms") from e
        # ...then the call, waited for even if the request is cancelled: what it took stays
        # taken and is answered (SQLite's busy_timeout bounds its wait for the lock)
        try:
            with anyio.CancelScope(shield=True):
                return await anyio.to_thread.run_sync(self._run_here, sql, params)
        finally:
            self.threads.release()


class SyncLimiter:
    """The limiters of WSGI apps and Django: the same statements as the async ones, run
    on the calling thread."""

    statements: _Statements

    def fetchone(self, sql: str, params: list) -> Optional[tuple]:
        """Runs one statement and returns its first row (placeholders: %s on PostgreSQL, ?
        on SQLite)."""
        raise NotImplementedError

    def check(self, route, subject: str, tier: Optional[str], cost: float) -> Answer:
        return answer_of(self.fetchone(*self.statements.for_check(route, subject, tier, cost)))

    def refund(self, route, subject: str, tier: Optional[str], cost: float) -> None:
        self.fetchone(*self.statements.for_refund(route, subject, tier, cost))

    def charge(self, route, subject: str, tier: Optional[str], cost: float) -> Answer:
        return answer_of(self.fetchone(*self.statements.for_charge(route, subject, tier, cost)))

    def validate_limits(self, definition: dict) -> Tuple[Optional[str], Optional[list]]:
        try:
            row = self.fetchone(*self.statements.for_validation(definition))
        except Exception as e:
            return _refusal(e), None
        return None, _decoded(row[0])["limits"]

    def set_policy(self, name: str, definition: dict) -> dict:
        """Inserts or replaces a policy (rl_policy_set; on PostgreSQL, as a member of
        rl_admin or the extension's owner); returns it as stored."""
        return _decoded(self.fetchone(*self.statements.for_policy(name, definition))[0])

    def policy_exists(self, policy: str) -> bool:
        try:
            self.fetchone(*self.statements.for_probe(policy))
        except Exception as e:
            return _absent(e)
        return True


class SyncPostgresLimiter(SyncLimiter):
    """Checks on PostgreSQL through a psycopg 3 pool of its own (in autocommit). `timeout`
    (0.5 s) bounds both the wait for a connection and each statement (statement_timeout:
    the server cancels it, writing nothing), so a database that stops answering falls
    back within it and a slow one never admits twice."""

    def __init__(self, conninfo: str = "", *, min_size: int = 2, max_size: int = 8, timeout: float = 0.5, pool=None):
        from psycopg_pool import ConnectionPool

        self.timeout = timeout
        options = f"-c statement_timeout={max(1, int(timeout * 1000))}"
        self.pool = pool or ConnectionPool(conninfo, min_size=min_size, max_size=max_size, open=False,
                                           kwargs={"autocommit": True, "options": options}, reconnect_timeout=0)
        self.pool.open(wait=False)
        self.statements = _Statements("%s", "%s::jsonb")

    def close(self) -> None:
        self.pool.close()

    def policy_exists(self, policy: str) -> bool:
        """At startup: waits up to 5 s for the pool's first connections (a check's own
        timeout is shorter than a connection takes to open)."""
        import psycopg_pool

        try:
            self.pool.wait(timeout=5.0)
        except psycopg_pool.PoolTimeout as e:
            raise DatabaseUnavailable(str(e).strip() or "no connection within 5 s") from e
        return super().policy_exists(policy)

    def fetchone(self, sql: str, params: list) -> Optional[tuple]:
        import psycopg
        import psycopg_pool

        try:
            with self.pool.connection(timeout=self.timeout) as conn:
                cur = conn.execute(sql, params)
                return cur.fetchone() if cur.description is not None else None
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout, OSError) as e:
            raise DatabaseUnavailable(str(e).strip() or type(e).__name__) from e


class SyncSQLiteLimiter(SyncLimiter):
    """Checks on a SQLite database file with the loadable extension, on a connection per
    thread (opened on its first check; the state tables are made at construction). A
    writer waits for SQLite's lock up to `timeout` (1 s), then falls back, having written
    nothing."""

    def __init__(self, path: str, *, extension: Optional[str] = None, timeout: float = 1.0,
                 busy_timeout: Optional[float] = None):
        self.path, self.extension = path, _extension(extension)
        self.busy_timeout = timeout if busy_timeout is None else busy_timeout
        self.local = threading.local()
        self.statements = _Statements("?", "?")
        # a wrong path or extension fails here; the state tables are made now, not by a request
        first = _sqlite_connect(path, self.extension, self.busy_timeout)
        try:
            _make_tables(first)
        finally:
            first.close()

    def fetchone(self, sql: str, params: list) -> Optional[tuple]:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = _sqlite_connect(self.path, self.extension, self.busy_timeout)
        return _sqlite_fetchone(conn, self.path, sql, params)
