"""The memory store (pg_ratelimit.buckets = 'memory') through a real client: who may choose
it, read-only transactions, a hot standby, clean restarts and crashes, a flood of keys, a
server that did not preload the library. The conformance list, the engine-parametrized
tests, the fuzz run and the concurrency tests also run against it (see their files)."""
import os
import signal
import time

import pytest

psycopg2 = pytest.importorskip("psycopg2")

from clusters import BIN, cluster, standby_of
from conftest import assert_refused_read_only, pg_available, pg_connect

# Private ports for the clusters of these tests (the shared one is on 54329).
PORTS = iter(range(54341, 54360))
MEMORY = {"shared_preload_libraries": "pg_ratelimit", "pg_ratelimit.buckets": "memory"}
SLOW = "10, 0.000001"  # burst 10, refilled so slowly that no level moves during a test


@pytest.fixture(autouse=True)
def needs_postgres():
    if not pg_available():
        pytest.skip("PGHOST not set: no PostgreSQL cluster for client tests")


def one(conn, sql):
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchone()[0]


def new_database(c, name="app"):
    c.sql(f"CREATE DATABASE {name}")
    c.sql("CREATE EXTENSION pg_ratelimit", name)
    return c.connect(name)


def test_only_a_superuser_or_its_configuration_chooses_the_store(pg_memory_db):
    conn, name = pg_memory_db
    role = f"app_{name}"
    with conn.cursor() as cur:
        cur.execute(f"CREATE ROLE {role} LOGIN")
        try:
            cur.execute(f"SET ROLE {role}")
            # the superuser's ALTER DATABASE applies to the application's sessions
            assert one(conn, "SELECT current_setting('pg_ratelimit.buckets')") == "memory"
            for sql in ("SET pg_ratelimit.buckets = 'table'", "SET LOCAL pg_ratelimit.buckets = 'table'",
                        "SELECT set_config('pg_ratelimit.buckets', 'table', false)",
                        f"ALTER ROLE {role} SET pg_ratelimit.buckets = 'table'"):
                with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                    cur.execute(sql)
            assert one(conn, "SELECT current_setting('pg_ratelimit.buckets')") == "memory"
            cur.execute("RESET ROLE")
            # a role's own login session gets the same, and cannot switch either
            app = psycopg2.connect(dbname=name, user=role)
            app.autocommit = True
            assert one(app, "SELECT current_setting('pg_ratelimit.buckets')") == "memory"
            with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                app.cursor().execute("SET pg_ratelimit.buckets = 'table'")
            app.close()
        finally:
            cur.execute("RESET ROLE")
            cur.execute(f"DROP ROLE {role}")


def test_bucket_calls_work_read_only_and_budgets_still_refuse(pg_memory_db):
    conn, _ = pg_memory_db
    with conn.cursor() as cur:
        cur.execute("BEGIN READ ONLY")
        assert one(conn, "SELECT rl_take('ro', 2, 60, 1, 0) ->> 'remaining'") == "1"
        assert one(conn, "SELECT rl_peek('ro', 2, 60, 1, 0) ->> 'remaining'") == "0"  # what a take would leave
        assert one(conn, "SELECT rl_refund('ro', 2, 60, 1, 0) ->> 'remaining'") == "2"
        items = '[{"key": "ro", "burst": 2, "refill_per_minute": 60}, {"key": "ro2", "burst": 1, "refill_per_minute": 60}]'
        assert one(conn, f"SELECT rl_take_all('{items}', 0) ->> 'admitted'") == "true"
        for sql, function in (("SELECT rl_spend('ro', 'day', 1, 1, 0)", "rl_spend"),
                              ("SELECT rl_take_all('[{\"key\": \"ro\", \"period\": \"day\", \"quota\": 1}]', 0)",
                               "rl_take_all"),
                              ("SELECT rl_reset('ro')", "rl_reset")):
            assert_refused_read_only(cur, sql, function)
        cur.execute("COMMIT")
    assert one(conn, "SELECT rl_peek('ro', 2, 60, 1, 0) ->> 'remaining'") == "0", "rl_take_all took one"


def test_a_take_is_not_undone_by_a_rollback(pg_memory_db):
    _, name = pg_memory_db
    tx = pg_connect(name, autocommit=False)
    assert one(tx, "SELECT rl_take('tx', 1, 0.001) ->> 'admitted'") == "true"
    tx.rollback()
    assert one(tx, "SELECT rl_take('tx', 1, 0.001) ->> 'admitted'") == "false", "by design: not transactional"
    assert one(tx, "SELECT rl_refund('tx', 1, 0.001, 1) ->> 'remaining'") == "1"
    tx.close()


def test_memory_buckets_write_no_rows_and_no_wal(pg_memory_db):
    """10,000 memory-store takes in one transaction assign it no transaction id (they change
    no row) and write no WAL. The WAL position is the whole cluster's, which autovacuum, a
    checkpoint or another database move too (a CI run saw 16,696 bytes), so that check is
    taken up to three times and the quietest counts; the transaction id is this call's alone."""
    conn, _ = pg_memory_db
    wal = []
    with conn.cursor() as cur:
        for _ in range(3):
            cur.execute("BEGIN")
            cur.execute("SELECT pg_current_wal_insert_lsn()")
            before = cur.fetchone()[0]
            cur.execute("SELECT count(*) FILTER (WHERE (rl_take('w' || (g % 100), 1e9, 1e9) ->> 'admitted')::bool) "
                        "FROM generate_series(1, 10000) g")
            admitted = cur.fetchone()[0]
            cur.execute("SELECT pg_current_xact_id_if_assigned()")
            xid = cur.fetchone()[0]
            cur.execute("COMMIT")
            cur.execute("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", (before,))
            wal.append(cur.fetchone()[0])
            assert admitted == 10000
            assert xid is None, "a memory-store take changed a row"
            if wal[-1] < 1000:
                break
    assert min(wal) < 1000, f"{wal} bytes of WAL for 10000 takes"  # a table-store take writes ~120 each
    assert one(conn, "SELECT count(*) FROM ratelimit.rl_bucket") == 0
    stats = one(conn, "SELECT rl_memory_stats()")
    assert stats["in_use"] >= 100 and stats["capacity"] >= 1_000_000 and stats["bytes_per_bucket"] > 0


def test_databases_of_one_cluster_never_share_buckets(pg_memory_db):
    conn, name = pg_memory_db
    other = f"{name}_b"
    conn.cursor().execute(f"CREATE DATABASE {other}")
    try:
        b = pg_connect(other)
        b.cursor().execute("CREATE EXTENSION pg_ratelimit")
        b.cursor().execute("SET pg_ratelimit.buckets = 'memory'")
        assert one(conn, "SELECT rl_take('same', 1, 0.001) ->> 'admitted'") == "true"
        assert one(b, "SELECT rl_take('same', 1, 0.001) ->> 'admitted'") == "true"
        assert one(b, "SELECT rl_reset('same')") == 1
        assert one(conn, "SELECT rl_take('same', 1, 0.001) ->> 'admitted'") == "false"
        b.close()
    finally:
        conn.cursor().execute(f"DROP DATABASE {other} WITH (FORCE)")


def test_clean_restart_keeps_every_level_and_a_crash_or_an_immediate_shutdown_starts_full():
    with cluster(next(PORTS), **MEMORY) as c:
        conn = new_database(c)
        for i in range(1, 6):  # key i has 10 - i tokens left; a peek says a take would leave 9 - i
            one(conn, f"SELECT rl_take('k{i}', {SLOW}, {i})")
        conn.close()
        c.stop("fast")
        c.start()
        conn = c.connect("app")
        assert [one(conn, f"SELECT rl_peek('k{i}', {SLOW}) ->> 'remaining'") for i in range(1, 6)] == \
            ["8", "7", "6", "5", "4"]
        stats = one(conn, "SELECT rl_memory_stats()")
        assert (stats["saved"], stats["loaded"], stats["in_use"]) == (5, 5, 5)
        conn.close()

        # a crash of the whole server: no file is written, and the last one was removed when read
        c.kill_everything()
        c.start()
        conn = c.connect("app")
        assert one(conn, f"SELECT rl_peek('k5', {SLOW}) ->> 'remaining'") == "9", "fails open after a crash"
        assert one(conn, "SELECT rl_memory_stats() ->> 'in_use'") == "0"

        # a crashed backend makes the postmaster reinitialise shared memory: full again
        assert one(conn, f"SELECT rl_take('k1', {SLOW}, 4) ->> 'remaining'") == "6"
        kill_backend(one(conn, "SELECT pg_backend_pid()"))
        conn = reconnect(c, "app")
        assert one(conn, f"SELECT rl_peek('k1', {SLOW}) ->> 'remaining'") == "9"
        assert "terminated by signal 9" in c.log()

        # an immediate shutdown stops backends with SIGQUIT wherever they are, and the
        # postmaster then exits with code 0 as after a clean one: only the control file's
        # shutdown checkpoint tells them apart, and nothing is saved
        one(conn, f"SELECT rl_take('k2', {SLOW}, 3)")
        conn.close()
        c.stop("immediate")
        c.start()
        conn = c.connect("app")
        assert one(conn, f"SELECT rl_peek('k2', {SLOW}) ->> 'remaining'") == "9", "starts full after -m immediate"
        assert "pg_ratelimit: not saving buckets: the server did not shut down cleanly" in c.log()
        conn.close()


def test_a_clean_restart_with_another_capacity_keeps_every_level():
    """pg_ratelimit.memory_buckets changed between a clean shutdown and the next start: the
    save file lists buckets, not parts, so each is found again in a table of another size
    (whose parts hold another number of buckets each)."""
    keys = 300
    with cluster(next(PORTS), **MEMORY) as c:
        conn = new_database(c)
        one(conn, f"SELECT count(rl_take('k' || g, {SLOW}, 1 + g % 9)) FROM generate_series(1, {keys}) g")
        conn.close()
        for n, capacity in enumerate(("2000", "100000", "1000000")):
            c.stop("fast")
            c.settings["pg_ratelimit.memory_buckets"] = capacity
            c.write_settings()
            c.start()
            conn = c.connect("app")
            stats = one(conn, "SELECT rl_memory_stats()")
            held = keys + 64 * n  # and each round's rl_take_all keys below
            assert (stats["loaded"], stats["in_use"]) == (held, held) and stats["capacity"] >= int(capacity), stats
            remaining = one(conn, f"SELECT array_agg((rl_peek('k' || g, {SLOW}, 0) ->> 'remaining')::int ORDER BY g)"
                                  f" FROM generate_series(1, {keys}) g")
            assert remaining == [10 - (1 + g % 9) for g in range(1, keys + 1)], capacity
            # and a take on the most keys a call takes holds each of their parts at once
            items = ", ".join(f'{{"key": "t{n}.{g}", "burst": 10, "refill_per_minute": 0.000001}}'
                              for g in range(64))
            assert one(conn, f"SELECT rl_take_all('[{items}]') ->> 'admitted'") == "true"
            conn.close()


def kill_backend(pid):
    """kill -9 of one backend, returning once the postmaster has reaped it: from then on it
    refuses connections until it has reset shared memory, so a reconnect cannot slip in
    before the crash is noticed (one did, under load)."""
    os.kill(pid, signal.SIGKILL)
    for _ in range(3000):
        try:
            os.kill(pid, 0)  # a zombie still answers: not reaped yet
        except ProcessLookupError:
            return
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} was not reaped")


def reconnect(c, dbname):
    """A connection once the server has recovered from a crash."""
    for _ in range(300):
        try:
            return c.connect(dbname)
        except psycopg2.OperationalError:
            time.sleep(0.1)
    raise AssertionError("the server did not recover")


def test_a_hot_standby_takes_from_buckets_of_its_own():
    with cluster(next(PORTS), **MEMORY, wal_level="replica") as primary:
        conn = new_database(primary)
        one(conn, "SELECT rl_spend('user', 'day', 5, 2)")
        with standby_of(primary, next(PORTS)) as standby:
            replica = standby.connect("app")
            assert one(replica, "SELECT pg_is_in_recovery()") is True
            # each node keeps its own buckets
            assert one(conn, "SELECT rl_take('user', 3, 0.000001) ->> 'remaining'") == "2"
            assert one(replica, "SELECT rl_take('user', 3, 0.000001) ->> 'remaining'") == "2"
            assert one(replica, "SELECT rl_take('user', 3, 0.000001) ->> 'remaining'") == "1"
            assert one(conn, "SELECT rl_peek('user', 3, 0.000001) ->> 'remaining'") == "1", "2 left on the primary"
            assert one(replica, "SELECT rl_take_all('[{\"key\": \"user\", \"burst\": 3, \"refill_per_minute\": 0.000001}]') ->> 'admitted'") == "true"
            # budgets live in the replicated tables, which the standby cannot change
            with pytest.raises(psycopg2.errors.ReadOnlySqlTransaction) as e:
                one(replica, "SELECT rl_spend('user', 'day', 5, 1)")
            assert e.value.diag.message_primary.startswith("rl_spend: cannot change rate-limit state")
            assert one(replica, "SELECT rl_memory_stats() ->> 'in_use'") == "1"
            # with buckets in the table, peeks answer from the replicated state on the standby
            with conn.cursor() as cur:
                cur.execute("SET pg_ratelimit.buckets = 'table'")
            one(conn, "SELECT rl_take('tbl', 3, 0.000001, 2)")
            caught_up(conn, replica)
            with replica.cursor() as cur:
                cur.execute("SET pg_ratelimit.buckets = 'table'")
            assert one(replica, "SELECT rl_peek('tbl', 3, 0.000001) ->> 'remaining'") == "0"
            assert one(replica, "SELECT rl_budget('user', 'day', 5, 1) ->> 'used'") == "3"
            with pytest.raises(psycopg2.errors.ReadOnlySqlTransaction) as e:
                one(replica, "SELECT rl_take('tbl', 3, 0.000001)")
            assert e.value.diag.message_primary.startswith("rl_take: cannot change rate-limit state")
            replica.close()
        conn.close()


def caught_up(primary, replica):
    """Waits until the standby has replayed everything the primary wrote so far."""
    lsn = one(primary, "SELECT pg_current_wal_lsn()")
    for _ in range(300):
        if one(replica, f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"):
            return
        time.sleep(0.1)
    raise AssertionError("the standby did not catch up")


def test_a_flood_of_keys_evicts_full_buckets_first_and_never_fails():
    with cluster(next(PORTS), **MEMORY, **{"pg_ratelimit.memory_buckets": "2000",
                                           "pg_ratelimit.allow_explicit_clock": "on"}) as c:
        conn = new_database(c)
        assert one(conn, "SELECT rl_memory_stats() ->> 'capacity'") == "2000"
        # the legitimate key: burst 1, full again after a minute
        assert one(conn, "SELECT rl_take('user', 1, 1, 1, 0) ->> 'admitted'") == "true"
        # a flood of 20 000 new keys, one a millisecond, each full again 1 s after: about
        # 1000 in use at a time, so only buckets that are full again are replaced
        flood = ("SELECT count(*) FILTER (WHERE (rl_take('flood' || g, 1000, 60, 1, 1000 + g) ->> 'admitted')::bool)"
                 " FROM generate_series(1, 20000) g")
        assert one(conn, flood) == 20000
        stats = one(conn, "SELECT rl_memory_stats()")
        assert stats["evicted_early"] == 0 and stats["evicted_full"] >= 18000 and stats["in_use"] == 2000, stats
        assert one(conn, "SELECT rl_take('user', 1, 1, 1, 21000) ->> 'admitted'") == "false", "flood did not reset it"
        # a flood faster than the table (20 000 keys within 20 ms): now buckets go before they
        # are full again, soonest first, and the user's (full at 60 s) outlasts the flood's
        fast = ("SELECT count(*) FILTER (WHERE (rl_take('fast' || g, 1000, 60, 1, 21000 + g / 1000) ->> 'admitted')::bool)"
                " FROM generate_series(1, 20000) g")
        assert one(conn, fast) == 20000
        stats = one(conn, "SELECT rl_memory_stats()")
        assert stats["evicted_early"] >= 17000, stats
        assert one(conn, "SELECT rl_take('user', 1, 1, 1, 21100) ->> 'admitted'") == "false"
        conn.close()


def test_without_preload_memory_bucket_calls_fail_clearly_and_the_rest_works():
    with cluster(next(PORTS), **{"pg_ratelimit.buckets": "memory"}) as c:
        conn = new_database(c)
        for sql, function in (("SELECT rl_take('k', 3, 60)", "rl_take"), ("SELECT rl_peek('k', 3, 60)", "rl_peek"),
                              ("SELECT rl_reset('k')", "rl_reset"), ("SELECT rl_memory_stats()", "rl_memory_stats")):
            with pytest.raises(psycopg2.errors.ObjectNotInPrerequisiteState) as e:
                one(conn, sql)
            message = e.value.diag.message_primary
            assert message.startswith(f"{function}: the memory store is not loaded") and \
                "shared_preload_libraries" in message, message
        assert one(conn, "SELECT rl_spend('k', 'day', 3) ->> 'admitted'") == "true", "budgets need no shared memory"
        # an application role that sets the store before the library is loaded in its session
        # (a placeholder then) does not escape: the value is dropped when the library loads
        c.sql("CREATE ROLE app LOGIN")
        app = psycopg2.connect(host=c.folder, port=c.port, user="app", dbname="app")
        app.autocommit = True
        app.cursor().execute("SET pg_ratelimit.buckets = 'table'")
        with pytest.raises(psycopg2.errors.ObjectNotInPrerequisiteState):
            one(app, "SELECT rl_take('k', 3, 60)")
        assert one(app, "SELECT current_setting('pg_ratelimit.buckets')") == "memory"
        app.close()
        with conn.cursor() as cur:
            cur.execute("SET pg_ratelimit.buckets = 'table'")
        assert one(conn, "SELECT rl_take('k', 3, 60) ->> 'remaining'") == "2"
        # without preload, rl_check's counters are each session's own, and say so
        one(conn, "SELECT rl_policy_set('p', '{\"limits\": [{\"burst\": 1, \"refill_per_minute\": 1}]}')")
        one(conn, "SELECT rl_check('p', 'a')")
        assert one(conn, "SELECT rl_policy_stats() ->> 'scope'") == "session"
        assert one(conn, "SELECT admitted FROM rl_stats WHERE policy = 'p'") == 1
        other = c.connect("app")
        assert one(other, "SELECT count(*) FROM rl_stats") == 0
        other.close()
        conn.close()


SAVE_FILE = os.path.join("pg_stat", "pg_ratelimit_buckets.dat")


def stopped_at_the_save(c):
    """Asks the postmaster to stop and holds it (under gdb) at the rename of its written
    save file. Returns a function that kills it there with SIGKILL (delivered by gdb, which
    then reaps it as its tracer)."""
    import shutil
    import subprocess

    if shutil.which("gdb") is None:
        pytest.fail("gdb is missing (scripts/setup.sh --pg installs it)")
    armed, hit, go = (os.path.join(c.folder, name) for name in ("armed", "at_rename", "kill_now"))
    # the shutdown's own signals pass straight to the postmaster
    signals = "handle SIGINT SIGUSR1 SIGUSR2 SIGTERM SIGQUIT SIGCHLD SIGHUP SIGPIPE SIGALRM nostop noprint pass"
    # durable_rename(oldfile, ...): the first argument in rdi; PostgreSQL renames files of its own too
    at_ours = f'break durable_rename if $_streq((char *) $rdi, "{SAVE_FILE}.tmp")'
    gdb = subprocess.Popen(["gdb", "-p", str(c.postmaster_pid()), "-batch", "-ex", signals, "-ex", at_ours,
                            "-ex", f"shell touch {armed}", "-ex", "continue", "-ex", f"shell touch {hit}",
                            "-ex", f"shell while [ ! -f {go} ]; do sleep 0.1; done", "-ex", "signal SIGKILL"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait_for(path, what):
        for _ in range(600):
            if os.path.exists(path):
                return
            time.sleep(0.1)
        gdb.kill()
        raise AssertionError(what)

    # attached and the breakpoint set (a stop asked before gdb continues waits for it)
    wait_for(armed, "gdb never set the breakpoint")
    c.run(f"{BIN}/pg_ctl", "-D", c.data, "-m", "fast", "-W", "stop")
    wait_for(hit, "the postmaster never reached the save's rename")

    def kill():
        open(go, "w").close()
        gdb.wait(timeout=60)
        pid = c.postmaster_pid()
        for _ in range(100):
            if not os.path.exists(f"/proc/{pid}"):
                return
            time.sleep(0.1)
        raise AssertionError(f"the postmaster {pid} did not go")

    return kill


def test_a_kill_during_the_save_leaves_no_file_and_a_torn_file_is_never_read():
    with cluster(next(PORTS), **MEMORY) as c:
        conn = new_database(c)
        for i in range(1, 6):
            one(conn, f"SELECT rl_take('k{i}', {SLOW}, {i})")
        conn.close()
        # kill -9 of the postmaster between writing the new file and renaming it into place
        kill = stopped_at_the_save(c)
        tmp = os.path.join(c.data, SAVE_FILE + ".tmp")
        try:
            assert os.path.getsize(tmp) > 0, "the save had written its file"
            assert not os.path.exists(os.path.join(c.data, SAVE_FILE))
        finally:
            kill()
        c.start()
        conn = c.connect("app")
        # none: the last file was removed when read at start, the new one never took its name
        assert one(conn, "SELECT rl_memory_stats() ->> 'loaded'") == "0"
        assert one(conn, f"SELECT rl_peek('k5', {SLOW}) ->> 'remaining'") == "9"
        # the next clean shutdown saves over what the killed one left
        one(conn, f"SELECT rl_take('k1', {SLOW}, 3)")
        conn.close()
        c.stop("fast")
        saved = os.path.join(c.data, SAVE_FILE)
        with open(saved, "rb") as f:
            whole = f.read()
        assert not os.path.exists(saved + ".tmp")
        # a torn file (half of it, as a file system without durable renames could leave) is refused whole
        with open(saved, "wb") as f:
            f.write(whole[: len(whole) // 2])
        c.start()
        conn = c.connect("app")
        assert one(conn, "SELECT rl_memory_stats() ->> 'loaded'") == "0"
        assert one(conn, f"SELECT rl_peek('k1', {SLOW}) ->> 'remaining'") == "9"
        assert "pg_ratelimit: ignoring pg_stat/pg_ratelimit_buckets.dat" in c.log()
        conn.close()
        # and the whole file is read whole
        c.stop("fast")
        with open(saved, "wb") as f:
            f.write(whole)
        c.start()
        conn = c.connect("app")
        assert one(conn, f"SELECT rl_peek('k1', {SLOW}) ->> 'remaining'") == "6"
        conn.close()
