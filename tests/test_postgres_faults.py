"""PostgreSQL with its state tables in a tablespace on a small file system that fills up:
calls that must write fail with 53100 (disk_full) naming the function, nothing admitted is
lost, the memory store goes on answering, and calls work again once there is room."""
import contextlib
import json
import os
import subprocess
import uuid

import pytest

from conftest import admin, native_only, pg_available, pg_test_database

psycopg2 = pytest.importorskip("psycopg2")
pytestmark = native_only

NOW = 1_000_000


@contextlib.contextmanager
def small_tablespace(size="2m"):
    """A tablespace on a tmpfs of `size`; yields its name and folder."""
    if not pg_available():
        pytest.skip("PGHOST not set: no PostgreSQL cluster for client tests")
    name = f"rl_small_{uuid.uuid4().hex[:8]}"
    folder = f"/tmp/{name}"
    os.makedirs(folder)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", folder], capture_output=True)
    if done.returncode != 0:
        os.rmdir(folder)
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    try:
        subprocess.run(["chown", "postgres:postgres", folder], check=True)
        admin(f"CREATE TABLESPACE {name} LOCATION '{folder}'")
        try:
            yield name, folder
        finally:
            admin(f"DROP TABLESPACE IF EXISTS {name}")
    finally:
        subprocess.run(["umount", "-l", folder], check=False)
        os.rmdir(folder)


def answered(conn, sql, params=()):
    """The call's answer, or its error as (SQLSTATE, message)."""
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone()[0]
    except psycopg2.Error as e:
        return (e.pgcode, e.diag.message_primary)


def state_changing_calls(tag):
    """One call of each function that writes state, on keys of its own: (function, sql,
    parameters, the key its rows hold)."""
    calls = [
        ("rl_take", "SELECT rl_take(%s, 5, 1, 1, %s)"),
        ("rl_spend", "SELECT rl_spend(%s, 'day', 5, 1, %s)"),
        ("rl_charge_budget", "SELECT rl_charge_budget(%s, 'day', 1, %s)"),
        ("rl_window", "SELECT rl_window(%s, 5, 60, 1, %s)"),
        ("rl_acquire", "SELECT rl_acquire(%s, 2, 60, %s)"),
        ("rl_penalize", "SELECT rl_penalize(%s, 0, 60, 3600, 3600, %s)"),
        ("rl_take_all", "SELECT rl_take_all(%s, %s)"),
        ("rl_check", "SELECT rl_check('fault', %s, 1, NULL, %s)"),
        ("rl_policy_set", "SELECT rl_policy_set(%s, %s)"),
    ]
    out = []
    for function, sql in calls:
        key = f"{tag}-{function}-" + "k" * 100
        params = (key, NOW)
        if function == "rl_take_all":
            params = (json.dumps([{"key": key, "period": "day", "quota": 5}, {"key": key, "burst": 5,
                                                                              "refill_per_minute": 1}]), NOW)
        elif function == "rl_policy_set":
            params = (key, '{"limits": [{"burst": 5, "refill_per_minute": 1}]}')
        out.append((function, sql, params, key))
    return out


def rows_naming(conn, key):
    tables = [("ratelimit.rl_bucket", "key"), ("ratelimit.rl_budget", "key"), ("ratelimit.rl_entries", "key"),
              ("ratelimit.rl_policy", "name")]
    with conn.cursor() as cur:
        total = 0
        for table, column in tables:
            cur.execute(f"SELECT count(*) FROM {table} WHERE strpos({column}, %s) > 0", (key,))
            total += cur.fetchone()[0]
        return total


def take_every_block(folder, name):
    path = os.path.join(folder, name)
    with open(path, "wb", buffering=0) as f:
        with pytest.raises(OSError):
            while True:
                f.write(b"\0" * 4096)
    return path


@pytest.mark.parametrize("buckets", ["table", "memory"])
def test_a_full_tablespace_fails_calls_with_53100_and_loses_nothing(buckets):
    with small_tablespace() as (tablespace, folder), pg_test_database(buckets) as (conn, _):
        with conn.cursor() as cur:
            cur.execute("SELECT rl_policy_set('fault', '{\"limits\": [{\"burst\": 5, \"refill_per_minute\": 1}]}')")
            cur.execute(f"ALTER TABLE ALL IN TABLESPACE pg_default SET TABLESPACE {tablespace}")
            cur.execute(f"ALTER INDEX ALL IN TABLESPACE pg_default SET TABLESPACE {tablespace}")
        # fill: spends on new keys until the tablespace cannot grow, then the last blocks go too
        filler = take_every_block(folder, "filler")
        os.truncate(filler, max(0, os.path.getsize(filler) - 256 * 1024))
        spent = []
        for i in range(100_000):
            key = f"fill-{i}-" + "f" * 200
            outcome = answered(conn, "SELECT rl_spend(%s, 'day', 5, 1, %s)", (key, NOW))
            if isinstance(outcome, tuple):
                assert outcome[0] == "53100" and outcome[1].startswith("rl_spend: could not extend file"), outcome
                break
            assert outcome["admitted"]
            spent.append(key)
        else:
            raise AssertionError("the tablespace never filled up")
        rest = take_every_block(folder, "rest")
        outcomes = [(c, answered(conn, c[1], c[2])) for c in state_changing_calls("full")]
        failed = []
        for (function, _, _, key), outcome in outcomes:
            if buckets == "memory" and function in ("rl_take", "rl_check"):
                # buckets live in shared memory: no file to extend (rl_check's policy is one bucket)
                assert outcome["admitted"] is True, outcome
                continue
            # a page with room left (a failed insert's) may still take a row: then it is stored
            if isinstance(outcome, tuple):
                assert outcome[0] == "53100" and outcome[1].startswith(f"{function}: could not extend file"), outcome
                assert rows_naming(conn, key) == 0, f"{function} failed but wrote"
                failed.append(function)
            else:
                assert rows_naming(conn, key) > 0, f"{function} answered but wrote nothing"
        print(f"{buckets}: {len(spent)} spends filled it; then {len(failed)} of {len(outcomes)} calls failed: {failed}")
        assert len(failed) >= len(outcomes) // 2, failed
        # every spend answered is stored
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM ratelimit.rl_budget WHERE key LIKE 'fill-%%' AND used = 1000000")
            assert cur.fetchone()[0] == len(spent)
        os.remove(filler)
        os.remove(rest)
        for function, sql, params, key in state_changing_calls("freed"):
            outcome = answered(conn, sql, params)
            assert not isinstance(outcome, tuple), (function, outcome)
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM ratelimit.rl_budget WHERE key LIKE 'fill-%%'")
            assert cur.fetchone()[0] == len(spent)
            cur.execute(f"ALTER TABLE ALL IN TABLESPACE {tablespace} SET TABLESPACE pg_default")
            cur.execute(f"ALTER INDEX ALL IN TABLESPACE {tablespace} SET TABLESPACE pg_default")


def test_errors_postgresql_raises_inside_a_call_keep_their_sqlstate_and_name_the_function():
    with pg_test_database() as (conn, name):
        answered(conn, "SELECT rl_take('held', 5, 1, 1, %s)", (NOW,))
        holder = psycopg2.connect(dbname=name)
        other = psycopg2.connect(dbname=name)
        other.autocommit = True
        try:
            with holder.cursor() as cur:  # a transaction that holds the row
                cur.execute("SELECT * FROM ratelimit.rl_bucket WHERE key = 'held' FOR UPDATE")
            with conn.cursor() as cur:
                cur.execute("SET lock_timeout = '200ms'")
            assert answered(conn, "SELECT rl_take('held', 5, 1, 1, %s)", (NOW,)) == \
                ("55P03", "rl_take: canceling statement due to lock timeout")
            holder.rollback()
            # a repeatable-read transaction whose row another session changed meanwhile
            conn.autocommit = False
            with conn.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cur.execute("SELECT 1 FROM ratelimit.rl_bucket WHERE key = 'held'")
            answered(other, "SELECT rl_take('held', 5, 1, 1, %s)", (NOW,))
            assert answered(conn, "SELECT rl_take('held', 5, 1, 1, %s)", (NOW,)) == \
                ("40001", "rl_take: could not serialize access due to concurrent update")
            conn.rollback()
            conn.autocommit = True
            assert answered(conn, "SELECT rl_peek('held', 5, 1, 0, %s)", (NOW,))["remaining"] == 3
        finally:
            holder.close()
            other.close()
