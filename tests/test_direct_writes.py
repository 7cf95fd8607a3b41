"""The table store's direct heap write (pg_ratelimit.direct_writes) against the guarded
UPDATE it stands in for, on a table the owner or a superuser changed: for each change,
the same calls give the same answers, the same errors and the same rows with the setting
on as with it off, and the guarded UPDATE is seen to run (the direct write fell back).
On the table as the extension made it, the direct write is seen to run instead. Then
amcheck finds the table and its key intact after many sessions wrote it both ways."""
import pytest

psycopg2 = pytest.importorskip("psycopg2")  # PostgreSQL only: a SQLite user has no psycopg2

from conftest import EDITION, amcheck_state_tables, pg_available, pg_connect, pg_test_database, run_sessions

pytestmark = [
    pytest.mark.skipif(not pg_available(), reason="PGHOST not set: no PostgreSQL cluster for client tests"),
    pytest.mark.skipif(EDITION == "sql", reason="the SQL edition has one way to write"),
]

T = "ratelimit.rl_bucket"
# Each change an owner or a superuser may make to rl_bucket, as SQL run before the calls.
CHANGES = {
    "a covering primary key": [f"ALTER TABLE {T} DROP CONSTRAINT rl_bucket_pkey",
                               f"ALTER TABLE {T} ADD PRIMARY KEY (key) INCLUDE (level, refilled_at, full_at)"],
    "a two-column primary key": [f"ALTER TABLE {T} DROP CONSTRAINT rl_bucket_pkey",
                                 f"ALTER TABLE {T} ADD PRIMARY KEY (level, key)"],
    "a key in another collation": [f"ALTER TABLE {T} ALTER COLUMN key TYPE text COLLATE \"C\""],
    "a key of another type": [f"ALTER TABLE {T} ALTER COLUMN key TYPE varchar(2000)"],
    "a unique key beside the primary one": [f"CREATE UNIQUE INDEX rl_bucket_pattern ON {T} (key text_pattern_ops)"],
    "a CHECK constraint": [f"ALTER TABLE {T} ADD CONSTRAINT rl_floor CHECK (level >= 0.5)"],
    "a NOT VALID CHECK constraint": [f"ALTER TABLE {T} ADD CONSTRAINT rl_floor CHECK (level >= 0.5) NOT VALID"],
    "a rule": [f"CREATE RULE rl_keep AS ON UPDATE TO {T} DO INSTEAD NOTHING"],
    "a trigger": ["CREATE FUNCTION public.rl_floor() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                  "IF NEW.level < 0.5 THEN RAISE EXCEPTION 'below the floor' USING ERRCODE = 'P0001'; END IF; "
                  "RETURN NEW; END $$",
                  f"CREATE TRIGGER rl_floor BEFORE UPDATE ON {T} FOR EACH ROW EXECUTE FUNCTION public.rl_floor()"],
    "a publication with a row filter": [f"CREATE PUBLICATION rl_pub FOR TABLE {T} WHERE (level > -1000000)"],
    "a publication with a column list": [f"CREATE PUBLICATION rl_pub FOR TABLE {T} (level, refilled_at, full_at)"],
    "a publication of every table": ["CREATE PUBLICATION rl_pub FOR ALL TABLES"],
    "row security": [f"ALTER TABLE {T} ENABLE ROW LEVEL SECURITY", f"ALTER TABLE {T} FORCE ROW LEVEL SECURITY",
                     f"CREATE POLICY rl_some ON {T} USING (level > 0.5)"],
    "replica identity full": [f"ALTER TABLE {T} REPLICA IDENTITY FULL"],
    "an added column": [f"ALTER TABLE {T} ADD COLUMN note text NOT NULL DEFAULT 'x'"],
    "an identity column": [f"ALTER TABLE {T} ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY"],
    "a generated column": [f"ALTER TABLE {T} ADD COLUMN twice double precision GENERATED ALWAYS AS (level * 2) STORED"],
    "an added index": [f"CREATE INDEX rl_by_level ON {T} (level)"],
    "an inheritance child holding a key": [
        f"CREATE TABLE ratelimit.rl_bucket_child () INHERITS ({T})",
        "INSERT INTO ratelimit.rl_bucket_child VALUES ('k', 3, 0, 0)"],
    "a partition": [f"CREATE TABLE ratelimit.rl_bucket_parent (LIKE {T}) PARTITION BY LIST (key)",
                    f"ALTER TABLE ratelimit.rl_bucket_parent ATTACH PARTITION {T} FOR VALUES IN ('k', 'k2')"],
}
# How each call runs: in its own transaction of this kind.
TRANSACTIONS = {
    "read committed": "BEGIN",
    "repeatable read": "BEGIN ISOLATION LEVEL REPEATABLE READ",
    "serializable": "BEGIN ISOLATION LEVEL SERIALIZABLE",
    "read only": "BEGIN READ ONLY",
}
# Takes into a bucket of 3 (the first inserts, the next change the row, the fourth is
# refused), a refund, a charge into debt, a take once refilled, another key.
CALLS = [
    "SELECT rl_take('k', 3, 60, 1, 0)",
    "SELECT rl_take('k', 3, 60, 1, 0)",
    "SELECT rl_take('k', 3, 60, 1, 0)",
    "SELECT rl_take('k', 3, 60, 1, 0)",
    "SELECT rl_refund('k', 3, 60, 2, 500)",
    "SELECT rl_charge('k', 3, 60, 4, 1000)",
    "SELECT rl_take('k', 3, 60, 1, 600000)",
    "SELECT rl_take('k2', 3, 60, 1, 0)",
    "SELECT rl_take('k2', 3, 60, 1, 0)",
]


def run_calls(direct_writes, change, begin):
    """Every call of CALLS, each in a transaction `begin` starts, in a fresh database where
    `change` was made: (answers and errors, the rows left, calls of the guarded UPDATE's
    condition)."""
    with pg_test_database(direct_writes=direct_writes) as (conn, name):
        with conn.cursor() as cur:
            for sql in change:
                cur.execute(sql)
        # a session that connects after the change, as an application's would
        conn = pg_connect(name)
        cur = conn.cursor()
        cur.execute("SET track_functions = 'all'")
        outcomes = []
        for sql in CALLS:
            cur.execute(begin)
            try:
                cur.execute(sql)
                outcomes.append(("answer", cur.fetchone()[0]))
                cur.execute("COMMIT")
            except psycopg2.Error as e:
                outcomes.append(("error", e.pgcode, e.diag.message_primary))
                cur.execute("ROLLBACK")
        cur.execute("SELECT pg_stat_force_next_flush()")
        conn.close()
        conn = pg_connect(name)
        with conn.cursor() as cur:
            try:
                cur.execute(f"SELECT key, level, refilled_at, full_at FROM {T} ORDER BY key")
                rows = cur.fetchall()
            except psycopg2.Error as e:
                rows = ("error", e.pgcode)
            cur.execute("SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE funcname = 'rl_bucket_guard'")
            guard_calls = cur.fetchone()[0]
        conn.close()
        return outcomes, rows, guard_calls


def test_on_the_table_as_made_the_direct_write_runs_and_answers_as_the_update():
    on = run_calls(True, [], TRANSACTIONS["read committed"])
    off = run_calls(False, [], TRANSACTIONS["read committed"])
    assert on[:2] == off[:2]
    assert on[0][3][1]["admitted"] is False and on[0][6][1]["admitted"] is True
    assert off[2] > 0, "the guarded UPDATE asks its condition on every change"
    assert on[2] == 0, "the direct write runs no UPDATE"


@pytest.mark.parametrize("change", list(CHANGES), ids=list(CHANGES))
def test_a_changed_table_gets_the_update_and_its_answers(change):
    on = run_calls(True, CHANGES[change], TRANSACTIONS["read committed"])
    off = run_calls(False, CHANGES[change], TRANSACTIONS["read committed"])
    assert on == off


@pytest.mark.parametrize("kind", ["repeatable read", "serializable", "read only"])
def test_other_transactions_get_the_update_and_its_answers(kind):
    on = run_calls(True, [], TRANSACTIONS[kind])
    off = run_calls(False, [], TRANSACTIONS[kind])
    assert on == off


def test_a_change_made_while_a_session_writes_directly_takes_effect_at_its_next_call():
    """The table's shape is judged once per relcache entry: a CHECK constraint added by
    another session reaches a session that already wrote directly."""
    with pg_test_database(direct_writes=True) as (conn, name):
        app = pg_connect(name)
        with app.cursor() as cur:
            cur.execute("SELECT rl_take('k', 3, 60, 1, 0)")
            cur.execute("SELECT rl_take('k', 3, 60, 1, 0)")
        with conn.cursor() as cur:
            cur.execute(f"ALTER TABLE {T} ADD CONSTRAINT rl_floor CHECK (level >= 0.5)")
        with app.cursor() as cur, pytest.raises(psycopg2.errors.CheckViolation):
            cur.execute("SELECT rl_take('k', 3, 60, 1, 0)")
        app.close()


def test_amcheck_finds_the_table_and_its_key_intact_after_sessions_wrote_both_ways():
    """32 sessions taking from 8 keys, half through the heap directly and half through the
    guarded UPDATE, with refunds and charges: every admission counted once, and amcheck
    (the key's btree against every heap tuple, and the heap itself) finds nothing wrong
    (on every major whose server has amcheck: 15, 17 and 18 here)."""
    with pg_test_database(direct_writes=True) as (conn, name):
        admitted = []

        def work(i, session_conn):
            with session_conn.cursor() as cur:
                cur.execute(f"SET pg_ratelimit.direct_writes = {'on' if i % 2 else 'off'}")
                for n in range(150):
                    cur.execute("SELECT (rl_take(%s, 1000000, 1, 1, 0) ->> 'admitted')::boolean", (f"k{n % 8}",))
                    admitted.append(cur.fetchone()[0])
                    if n % 10 == 0:
                        cur.execute("SELECT rl_refund(%s, 1000000, 1, 1, 0)", (f"k{n % 8}",))
                        cur.execute("SELECT rl_charge(%s, 1000000, 1, 1, 0)", (f"k{n % 8}",))

        run_sessions(name, 32, work)
        with conn.cursor() as cur:
            cur.execute(f"SELECT sum(1000000 - level) FROM {T}")
            assert cur.fetchone()[0] == sum(admitted) == 32 * 150
            if not amcheck_state_tables(cur):
                pytest.skip("this server has no amcheck (the totals above held)")
