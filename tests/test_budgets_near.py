"""rl_budgets_near(fraction [, n [, now_ms]]): the budgets of the current period that used at
least `fraction` of their quota, the quota being the one the last spend gave the row (rl_spend,
a budget of rl_take_all or of a policy's rl_check, tier included); charges and refunds keep
it. On SQLite, the native extension (both bucket stores) and, with INSTALL=sql, the SQL edition."""

import json
import sqlite3

import pytest

from conftest import SQLITE_EXT, sqlite_connect
from test_policies import roles  # noqa: F401 (a fixture)

NOW = 1_800_000_000_000  # 2027-01-15 08:00 UTC
DAY_END = 1_800_057_600  # the day's end, in epoch seconds


def spend_everything(call):
    """Budgets at known shares of their quotas, written by every kind of budget change."""
    call("rl_spend", "a", "day", 10, 9, NOW)  # 0.9
    call("rl_spend", "b", "day", 10, 8, NOW)  # 0.8
    call("rl_spend", "b", "month", 100, 1, NOW)  # 0.01
    call("rl_spend", "d", "day", 2, 1, NOW)
    call("rl_charge_budget", "d", "day", 3, NOW)  # 4 of 2: a charge keeps the spend's quota
    call("rl_spend", "e", "day", 10, 10, NOW)
    call("rl_refund_budget", "e", "day", 5, NOW)  # 0.5: a refund keeps it too
    call("rl_charge_budget", "f", "day", 7, NOW)  # charged only: no quota known, never listed
    call("rl_take_all", json.dumps([{"key": "g", "period": "day", "quota": 4, "cost": 3},
                                    {"key": "g", "burst": 5, "refill_per_minute": 1}]), NOW)  # 0.75
    call("rl_policy_set", "login", json.dumps({"limits": [{"period": "day", "quota": 10}], "tiers": {"pro": 5}}))
    call("rl_check", "login", "ann", 47, "pro", NOW)  # 47 of 10 x 5


def near(engine, *args):
    """rl_budgets_near's answer as a dict (SQLite answers text)."""
    answer = engine.call("rl_budgets_near", *args)
    return json.loads(answer) if isinstance(answer, str) else answer


def keys_and_shares(answer):
    return [(b["key"], b["period"], b["used"] / b["quota"]) for b in answer["budgets"]]


def test_budgets_near_lists_the_current_periods_most_used_first(engine):
    spend_everything(engine.call)
    answer = near(engine, 0.7, 100, NOW)
    assert answer["fraction"] == 0.7
    listed = keys_and_shares(answer)
    assert [(k, p) for k, p, _ in listed][0] == ("d", "day")
    assert "login" in listed[1][0] and "ann" in listed[1][0], listed
    assert [(k, p, s) for k, p, s in listed[2:]] == [("a", "day", 0.9), ("b", "day", 0.8), ("g", "day", 0.75)]
    assert answer["budgets"][0] == {"key": "d", "period": "day", "used": 4, "quota": 2, "resets_at": DAY_END}
    assert answer["budgets"][1]["quota"] == 50 and answer["budgets"][1]["used"] == 47
    every = near(engine, 0, 100, NOW)
    assert len(every["budgets"]) == 7 and every["budgets"][-1]["key"] == "b" and every["budgets"][-1]["period"] == "month"
    two = near(engine, 0, 2, NOW)
    assert [b["key"] for b in two["budgets"]] == [b["key"] for b in every["budgets"][:2]]
    # the next day lists the month's budget alone; an unknown quota gains one with a spend
    tomorrow = near(engine, 0, 100, (DAY_END + 1) * 1000)
    assert [(b["key"], b["period"]) for b in tomorrow["budgets"]] == [("b", "month")]
    engine.call("rl_spend", "f", "day", 7.000001, 0.000001, NOW)
    past = near(engine, 1, 100, NOW)  # f: 7.000001 of 7.000001
    assert [b["key"] for b in past["budgets"]] == ["d", "f"]


@pytest.mark.parametrize("args, message", [
    ((-0.1,), "rl_budgets_near: fraction must be a number from 0 to 1000000, got -0.1"),
    ((None,), "rl_budgets_near: fraction must be a number from 0 to 1000000, got NULL"),
    ((float("inf"),), "rl_budgets_near: fraction must be a number from 0 to 1000000, got Infinity"),
    ((0.5, 0), "rl_budgets_near: n must be an integer from 1 to 10000, got 0"),
    ((0.5, 10001), "rl_budgets_near: n must be an integer from 1 to 10000, got 10001"),
])
def test_budgets_near_names_a_bad_argument(engine, args, message):
    text, code = engine.error_of("rl_budgets_near", *args)
    assert text == message
    assert code in (None, "22023")


def test_postgres_budgets_near_is_for_rl_admin_only(pg_db, roles):  # noqa: F811
    import psycopg2  # PostgreSQL only: a SQLite user has no psycopg2

    conn, _ = pg_db
    app, admin = roles
    with conn.cursor() as cur:
        cur.execute(f"SET ROLE {app}")
        cur.execute("SELECT rl_spend('app-key', 'month', 10, 9)")
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            cur.execute("SELECT rl_budgets_near(0.5)")
        cur.execute(f"SET ROLE {admin}")
        cur.execute("SELECT rl_budgets_near(0.5)")
        (answer,) = cur.fetchone()
        assert [(b["key"], b["used"], b["quota"]) for b in answer["budgets"]] == [("app-key", 9, 10)]
        cur.execute("RESET ROLE")
        cur.execute("SELECT quota FROM ratelimit.rl_budget WHERE key = 'app-key'")
        assert cur.fetchone() == (10_000_000,), "kept in millionths"
        # on a standby, or in a read-only transaction, it answers too
        cur.execute("BEGIN READ ONLY")
        cur.execute("SELECT jsonb_array_length(rl_budgets_near(0.9) -> 'budgets')")
        assert cur.fetchone() == (1,)
        cur.execute("ROLLBACK")


def test_postgres_usage_is_read_by_an_application_role_and_in_a_read_only_transaction(pg_db, roles):  # noqa: F811
    """An application role reads a key's ended periods as it reads its budgets, never the
    table itself; rl_usage only reads, so a read-only transaction (a standby) answers too."""
    import psycopg2  # PostgreSQL only: a SQLite user has no psycopg2

    conn, _ = pg_db
    app, _ = roles
    day = 86_400_000
    with conn.cursor() as cur:
        cur.execute("SELECT rl_spend('tenant-7', 'day', 100, 42.5, %s)", (NOW,))
        cur.execute("SELECT rl_spend('tenant-7', 'day', 100, 1, %s)", (NOW + day,))
        cur.execute(f"SET ROLE {app}")
        cur.execute("SELECT rl_usage('tenant-7', %s, %s) -> 'periods'", (NOW, NOW + 2 * day))
        assert cur.fetchone()[0] == [{"period": "day", "starts_at": DAY_END - 86_400, "ends_at": DAY_END,
                                      "used": 42.5, "quota": 100}]
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            cur.execute("SELECT count(*) FROM ratelimit.rl_usage")
        conn.rollback()
        cur.execute(f"SET ROLE {app}")
        cur.execute("BEGIN READ ONLY")
        cur.execute("SELECT jsonb_array_length(rl_usage('tenant-7', 0, %s) -> 'periods')", (NOW + 2 * day,))
        assert cur.fetchone() == (1,)
        cur.execute("ROLLBACK")
        cur.execute("RESET ROLE")


def test_usage_is_kept_as_long_as_the_retention_says(engine):
    """rl_sweep removes a kept period once the retention has passed since it ended: 400 days
    unless rl_usage_retention(days) set another (an administrator's setting of the database)."""
    import time

    day = 86_400_000
    start = int(time.time() * 1000) // day * day - 100 * day  # a day that ended 99 days ago
    engine.call("rl_spend", "ret", "day", 10, 1, start + 1000)
    engine.call("rl_spend", "ret", "day", 10, 2, start + day + 1000)  # keeps the first day
    ends = lambda: [p["ends_at"] for p in as_dict(engine.call("rl_usage", "ret", 0, start + 10 * day))["periods"]]
    assert engine.call("rl_usage_retention") == 400
    engine.call("rl_sweep")  # keeps the second day, then removes its row; 400 days keep both
    assert ends() == [(start + day) // 1000, (start + 2 * day) // 1000]
    assert engine.call("rl_usage_retention", 99) == 99
    assert engine.call("rl_usage_retention") == 99
    engine.call("rl_sweep")  # the first day ended 99 days ago (or more): gone
    assert ends() == [(start + 2 * day) // 1000]
    assert engine.call("rl_usage_retention", 30) == 30
    engine.call("rl_sweep")
    assert ends() == []


def as_dict(answer):
    return json.loads(answer) if isinstance(answer, str) else answer


def test_postgres_usage_retention_is_for_rl_admin_only(pg_db, roles):  # noqa: F811
    """An application role reads its usage but cannot shorten how long it is kept (nor read
    the setting); rl_admin sets it; the table is nobody's but the extension's."""
    import psycopg2  # PostgreSQL only: a SQLite user has no psycopg2

    conn, _ = pg_db
    app, admin = roles
    with conn.cursor() as cur:
        for call in ("SELECT rl_usage_retention(1)", "SELECT rl_usage_retention()",
                     "UPDATE ratelimit.rl_setting SET value = 0"):
            cur.execute(f"SET ROLE {app}")
            with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                cur.execute(call)
            conn.rollback()
        cur.execute(f"SET ROLE {admin}")
        cur.execute("SELECT rl_usage_retention(500), rl_usage_retention()")
        assert cur.fetchone() == (500, 500)
        cur.execute("BEGIN READ ONLY")
        cur.execute("SELECT rl_usage_retention()")
        assert cur.fetchone() == (500,)
        with pytest.raises(psycopg2.errors.ReadOnlySqlTransaction):
            cur.execute("SELECT rl_usage_retention(30)")
        cur.execute("ROLLBACK")
        cur.execute("RESET ROLE")


def test_sqlite_usage_answers_on_a_read_only_file_and_a_0_3_0_file_gains_the_table(tmp_path):
    path = str(tmp_path / "usage.db")
    conn = sqlite_connect(path)
    conn.execute("SELECT rl_spend('tenant-7', 'day', 100, 42.5, ?)", (NOW,)).fetchone()
    conn.execute("SELECT rl_spend('tenant-7', 'day', 100, 1, ?)", (NOW + 86_400_000,)).fetchone()
    conn.close()
    ro = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    ro.enable_load_extension(True)
    ro.load_extension(SQLITE_EXT)
    periods = json.loads(ro.execute("SELECT rl_usage('tenant-7', 0, ?)", (NOW * 2,)).fetchone()[0])["periods"]
    assert [(p["ends_at"], p["used"]) for p in periods] == [(DAY_END, 42.5)]
    ro.close()
    # a file of 0.3.0's layout has no rl_usage: the first write that keeps a period makes it
    old = sqlite3.connect(path, isolation_level=None)
    old.executescript("DROP TABLE rl_usage; DROP TABLE rl_setting; UPDATE rl_meta SET value = '2' WHERE key = 'schema_version';")
    old.close()
    conn = sqlite_connect(path)
    conn.execute("SELECT rl_spend('tenant-7', 'day', 100, 1, ?)", (NOW + 2 * 86_400_000,)).fetchone()
    periods = json.loads(conn.execute("SELECT rl_usage('tenant-7', 0, ?)", (NOW * 2,)).fetchone()[0])["periods"]
    assert [(p["ends_at"], p["used"]) for p in periods] == [(DAY_END + 86_400, 1)]


def test_sqlite_upgrades_a_database_of_0_3_0_on_first_use(tmp_path):
    """A file whose tables 0.3.0 made (rl_budget without quota, schema_version 2, no view
    rl_refused) gains the column and the view the first time a statement needs them; the
    rows it had keep their use with no quota known."""
    path = str(tmp_path / "old.db")
    new = sqlite_connect(path)
    new.execute("SELECT rl_spend('x', 'day', 1, 1)")  # the tables as 0.4.0 makes them
    new.close()
    old = sqlite3.connect(path, isolation_level=None)
    old.executescript("""
        DROP VIEW rl_refused;
        DROP TABLE rl_budget;
        CREATE TABLE rl_budget (key TEXT NOT NULL, period TEXT NOT NULL, used INTEGER NOT NULL,
                                resets_at INTEGER NOT NULL, PRIMARY KEY (key, period)) WITHOUT ROWID;
        INSERT INTO rl_budget VALUES ('kept', 'day', 9000000, 1800057600000);
        UPDATE rl_meta SET value = '2' WHERE key = 'schema_version';
    """)
    old.close()
    conn = sqlite_connect(path)
    assert json.loads(conn.execute("SELECT rl_spend('kept', 'day', 10, 1, ?)", (NOW,)).fetchone()[0])["used"] == 10
    assert conn.execute("SELECT value FROM rl_meta WHERE key = 'schema_version'").fetchone() == ("3",)
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'view' AND name = 'rl_refused'").fetchone() == (1,)
    conn.execute("SELECT count(*) FROM rl_refused").fetchone()  # answers (the process's summary)
    near = json.loads(conn.execute("SELECT rl_budgets_near(1, 10, ?)", (NOW,)).fetchone()[0])
    assert near["budgets"] == [{"key": "kept", "period": "day", "used": 10, "quota": 10, "resets_at": DAY_END}]
    # a second connection of the old layout's era finds it upgraded already
    other = sqlite_connect(path)
    assert json.loads(other.execute("SELECT rl_budget('kept', 'day', 10, 0, ?)", (NOW,)).fetchone()[0])["used"] == 10
