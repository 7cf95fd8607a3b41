"""Policies through real clients: who may change them in PostgreSQL (rl_admin), exact
totals when many sessions check one policy and subject, and the listing on both engines.
Each answer's exact values are in the conformance list (tests/test_conformance.py)."""
import json
import random
import sqlite3

import pytest

from conftest import EDITION, one, pg_connect, run_sessions, sqlite_connect

psycopg2 = pytest.importorskip("psycopg2")

LIMITS = '{"limits": [{"burst": 100, "refill_per_minute": 0.000001}, {"period": "month", "quota": 1000}]}'



@pytest.fixture
def roles(pg_db):
    """An application role and a policy administrator (a member of rl_admin), used via SET ROLE."""
    conn, name = pg_db
    app, admin = f"app_{name}", f"ops_{name}"
    with conn.cursor() as cur:
        cur.execute(f"CREATE ROLE {app} NOLOGIN")
        cur.execute(f"CREATE ROLE {admin} NOLOGIN IN ROLE rl_admin")
    yield app, admin
    with conn.cursor() as cur:
        cur.execute("RESET ROLE")
        cur.execute(f"DROP ROLE {app}")
        cur.execute(f"DROP ROLE {admin}")


def test_only_rl_admin_changes_policies_and_resets_keys(pg_db, roles):
    conn, _ = pg_db
    app, admin = roles
    with conn.cursor() as cur:
        cur.execute(f"SET ROLE {admin}")
        cur.execute("SELECT rl_policy_set('login', %s)", (LIMITS,))
        cur.execute("SELECT count(*) FROM rl_policies")
        assert cur.fetchone() == (1,)
        cur.execute(f"SET ROLE {app}")
        cur.execute("SELECT rl_check('login', 'ann') ->> 'admitted', rl_take('raw', 1, 1) ->> 'admitted'")
        assert cur.fetchone() == ("true", "true")
        # an application role, or a query injected into it, cannot loosen its own limits
        for sql in ["SELECT rl_policy_set('login', '{\"limits\": [{\"burst\": 1e9, \"refill_per_minute\": 1e9}]}')",
                    "SELECT rl_policy_drop('login')", "SELECT rl_reset('raw')", "SELECT * FROM rl_policies",
                    "SELECT * FROM ratelimit.rl_policy"]:
            with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                cur.execute(sql)
        # it may record strikes and block (itself included), but never lift a block
        cur.execute("SELECT rl_block('mallory', NULL) ->> 'blocked', rl_penalize('mallory') ->> 'strikes'")
        assert cur.fetchone() == ("true", "1")
        for sql in ["SELECT rl_unblock('mallory')", "SELECT * FROM rl_blocks"]:
            with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                cur.execute(sql)
        cur.execute(f"SET ROLE {admin}")
        assert one(conn, "SELECT rl_reset('raw')") == 1
        assert one(conn, "SELECT subject FROM rl_blocks") == "mallory"
        assert one(conn, "SELECT rl_unblock('mallory')") is True
        assert one(conn, "SELECT rl_policy_drop('login')") is True
        cur.execute("RESET ROLE")


def test_sixteen_sessions_checking_one_subject_admit_exactly_the_limit(pg_store_db):
    conn, name = pg_store_db
    one(conn, "SELECT rl_policy_set('hot', %s)", (LIMITS,))
    admitted = [0] * 16

    def work(i, c):
        for _ in range(40):
            admitted[i] += one(c, "SELECT rl_check('hot', 'ann')")["admitted"]

    one(conn, "SELECT rl_stats_reset()")
    run_sessions(name, 16, work)
    assert sum(admitted) == 100
    # the counters of the whole server (the test cluster preloads the library) agree; the
    # SQL edition counts per session, and this one made no check
    with conn.cursor() as cur:
        cur.execute("SELECT rl_policy_stats() ->> 'scope', admitted, refused FROM rl_stats WHERE policy = 'hot'")
        assert cur.fetchone() == (("server", 100, 16 * 40 - 100) if EDITION == "native" else None)
    left = one(conn, "SELECT rl_check('hot', 'ann')")
    assert (left["admitted"], left["items"][0]["remaining"], left["items"][1]["used"]) == (False, 0, 100)


COUNTED = '{"limits": [{"burst": 2, "refill_per_minute": 0.000001}]}'


def counts(rows, policy):
    return next(tuple(r[1:]) for r in rows if r[0] == policy)


def test_sqlite_counts_every_outcome_per_process(tmp_path):
    path = str(tmp_path / "c.db")
    a, b = sqlite_connect(path), sqlite_connect(path)
    a.execute("SELECT rl_stats_reset()")
    a.execute("SELECT rl_policy_set('enforced', ?), rl_policy_set('shadowed', ?)",
              (COUNTED, COUNTED.replace("}]}", "}], \"shadow\": true}")))
    for conn in (a, b, a):  # two connections of one process share the counts
        conn.execute("SELECT rl_check('enforced', 'u'), rl_check('shadowed', 'u')").fetchall()
    a.execute("SELECT rl_block('v', NULL)")
    a.execute("SELECT rl_check('enforced', 'v'), rl_check('shadowed', 'v')").fetchall()
    rows = a.execute("SELECT * FROM rl_stats").fetchall()
    assert counts(rows, "enforced") == (2, 1, 0, 1)  # admitted, refused, would_refuse, refused_blocked
    assert counts(rows, "shadowed") == (4, 0, 2, 0)  # shadow admits, and counts what it would refuse
    assert json.loads(a.execute("SELECT rl_policy_stats()").fetchone()[0])["scope"] == "process"
    assert a.execute("SELECT rl_stats_reset()").fetchone()[0] == 2
    assert a.execute("SELECT count(*) FROM rl_stats").fetchone()[0] == 0


def refuse(conn, policy, subject, times):
    for _ in range(times):
        conn.execute("SELECT rl_check(?, ?)", (policy, subject)).fetchall()


def test_sqlite_lists_the_subjects_refused_most(tmp_path):
    """rl_top_refused and the view rl_refused: a space-saving summary of 64 subjects per
    policy, per process; a listed count is at most `error` above the true one."""
    path = str(tmp_path / "r.db")
    a, b = sqlite_connect(path), sqlite_connect(path)
    a.execute("SELECT rl_stats_reset()")
    a.execute("SELECT rl_policy_set('login', ?), rl_policy_set('api', ?)", (COUNTED, COUNTED))
    refuse(a, "login", "ip:1", 2 + 5)  # 2 admitted, 5 refused
    refuse(b, "login", "ip:2", 2 + 2)  # another connection of the process
    refuse(a, "api", "ip:1", 2 + 1)
    a.execute("SELECT rl_block('ip:3', NULL)")
    refuse(a, "login", "ip:3", 1)  # refused while blocked counts too
    top = json.loads(a.execute("SELECT rl_top_refused('login')").fetchone()[0])
    assert (top["policy"], top["scope"]) == ("login", "process")
    assert [(e["subject"], e["refusals"], e["error"]) for e in top["subjects"]] == [
        ("ip:1", 5, 0), ("ip:2", 2, 0), ("ip:3", 1, 0)]
    assert all(isinstance(e["last_refused_ms"], int) and e["last_refused_ms"] > 1.7e12 for e in top["subjects"])
    assert len(json.loads(a.execute("SELECT rl_top_refused('login', 1)").fetchone()[0])["subjects"]) == 1
    rows = a.execute("SELECT policy, subject, refusals, error FROM rl_refused ORDER BY policy, refusals DESC").fetchall()
    assert rows == [("api", "ip:1", 1, 0), ("login", "ip:1", 5, 0), ("login", "ip:2", 2, 0), ("login", "ip:3", 1, 0)]
    # past 64 subjects the least counted entry is replaced, and the bound still holds
    for i in range(100):
        refuse(a, "login", f"bot:{i}", 3)  # 2 admitted, 1 refused each
    refuse(a, "login", "ip:1", 20)
    truth = {"ip:1": 25, "ip:2": 2, "ip:3": 1, **{f"bot:{i}": 1 for i in range(100)}}
    listed = json.loads(a.execute("SELECT rl_top_refused('login', 64)").fetchone()[0])["subjects"]
    assert len(listed) == 64 and listed[0]["subject"] == "ip:1"
    assert all(e["refusals"] - e["error"] <= truth[e["subject"]] <= e["refusals"] for e in listed)
    with pytest.raises(sqlite3.Error, match="rl_top_refused: n must be an integer from 1 to 64, got 0"):
        a.execute("SELECT rl_top_refused('login', 0)")
    a.execute("SELECT rl_stats_reset()")
    assert a.execute("SELECT count(*) FROM rl_refused").fetchone()[0] == 0


# Subjects for the summary's replacement order: more than its 64 entries, refused again
# after others took their place, some with characters array and JSON texts quote, one
# longer than the 96 bytes an entry shows (cut at a character).
SUMMARY_SUBJECTS = [f"s:{i}" for i in range(90)] + ['q"{a,b}\\', "NULL", "é" * 60, "日本 語"]
ONE_SHOT = '{"limits": [{"burst": 1, "refill_per_minute": 0.000001}]}'


def summary_refusals():
    """A fixed order of refusals: each subject's first call admits (burst 1), every later
    one is refused and recorded."""
    rng = random.Random(58)
    order = [s for s in SUMMARY_SUBJECTS for _ in range(rng.randint(1, 4))]
    rng.shuffle(order)
    return order


def summary_model(refusals):
    """refused::RefusedSlots::record and ::top in Python: a known subject counts once more;
    a new one takes the first free entry, else the first entry with the least count (its
    count + 1, and that count as its error); listed by count, then by shown bytes."""
    entries = []
    for subject in refusals:
        known = next((e for e in entries if e[0] == subject), None)
        if known:
            known[1] += 1
        elif len(entries) < 64:
            entries.append([subject, 1, 0])
        else:
            i = min(range(64), key=lambda j: (entries[j][1], j))
            m = entries[i][1]
            entries[i] = [subject, m + 1, m]
    shown = [(e[0].encode()[:96].decode(errors="ignore"), e[1], e[2]) for e in entries]
    return sorted(shown, key=lambda e: (-e[1], e[0].encode()))


def record_summary(execute):
    """Runs the refusals through rl_check on policy 'summary'; returns rl_top_refused's 64."""
    execute("SELECT rl_stats_reset()")
    execute(f"SELECT rl_policy_set('summary', '{ONE_SHOT}')")
    for subject in SUMMARY_SUBJECTS:
        assert execute("SELECT rl_check('summary', %s)", subject)["admitted"] is True
    for subject in summary_refusals():
        assert execute("SELECT rl_check('summary', %s)", subject)["admitted"] is False
    listed = execute("SELECT rl_top_refused('summary', 64)")["subjects"]
    execute("SELECT rl_stats_reset()")
    return [(e["subject"], e["refusals"], e["error"]) for e in listed]


def test_sqlite_summary_replaces_entries_in_the_order_of_the_slots(tmp_path):
    conn = sqlite_connect(str(tmp_path / "s.db"))

    def execute(sql, *args):
        value = conn.execute(sql.replace("%s", "?"), args).fetchone()[0]
        return json.loads(value) if isinstance(value, str) and value.startswith("{") else value
    assert record_summary(execute) == summary_model(summary_refusals())


def test_postgres_summary_replaces_entries_in_the_order_of_the_slots(pg_db):
    """The native slots in shared memory and the SQL edition's session settings keep the
    same summary: the same entries replaced, the same counts and errors, the same order."""
    conn, _ = pg_db

    def execute(sql, *args):
        return one(conn, sql, args)
    assert record_summary(execute) == summary_model(summary_refusals())


ROUTE_LIMITS = '[{"key": "web:ai", "burst": 2, "refill_per_minute": 0.000001}, {"key": "web:ai", "period": "day", "quota": 100}]'


def test_sqlite_counts_explicit_limits_under_their_name(tmp_path):
    """rl_check_limits: rl_take_all's answer, its outcome counted under a name (a route's)
    in rl_stats and a refused subject in rl_refused, beside the policies'."""
    path = str(tmp_path / "n.db")
    a, b = sqlite_connect(path), sqlite_connect(path)
    a.execute("SELECT rl_stats_reset()")
    answers = [json.loads(conn.execute("SELECT rl_check_limits('POST /ai', 'ip:1', ?, 0)", (ROUTE_LIMITS,)).fetchone()[0])
               for conn in (a, b, a)]
    assert [r["admitted"] for r in answers] == [True, True, False]
    assert answers[2] == json.loads(a.execute("SELECT rl_take_all(?, 0)", (ROUTE_LIMITS,)).fetchone()[0])
    a.execute("SELECT rl_policy_set('login', ?)", (COUNTED,))
    refuse(a, "login", "ip:1", 3)
    rows = a.execute("SELECT * FROM rl_stats").fetchall()
    assert counts(rows, "POST /ai") == (2, 1, 0, 0) and counts(rows, "login") == (2, 1, 0, 0)
    assert a.execute("SELECT policy, subject, refusals FROM rl_refused ORDER BY policy").fetchall() == [
        ("POST /ai", "ip:1", 1), ("login", "ip:1", 1)]
    with pytest.raises(sqlite3.Error, match="rl_check_limits: name must not be empty"):
        a.execute("SELECT rl_check_limits('', 'ip:1', ?)", (ROUTE_LIMITS,))


def test_postgres_counts_explicit_limits_of_an_application_role_for_rl_admin(pg_db, roles):
    conn, _ = pg_db
    app, admin = roles
    with conn.cursor() as cur:
        cur.execute("SELECT rl_stats_reset()")
        cur.execute(f"SET ROLE {app}")
        for subject, calls in (("ip:1", 5), ("ip:2", 3)):
            for _ in range(calls):
                cur.execute("SELECT rl_check_limits('POST /ai', %s, %s)", (subject, ROUTE_LIMITS.replace("web:ai", subject)))
        cur.execute("SELECT rl_check_limits('POST /ai', 'ip:1', %s)", (ROUTE_LIMITS.replace("web:ai", "ip:1"),))
        assert cur.fetchone()[0]["admitted"] is False
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            cur.execute("SELECT * FROM rl_stats")
        cur.execute(f"SET ROLE {admin}")
        cur.execute("SELECT admitted, refused FROM rl_stats WHERE policy = 'POST /ai'")
        assert cur.fetchone() == (4, 5)
        cur.execute("SELECT subject, refusals, error FROM rl_refused WHERE policy = 'POST /ai' ORDER BY refusals DESC")
        assert cur.fetchall() == [("ip:1", 4, 0), ("ip:2", 1, 0)]
        cur.execute("SELECT rl_stats_reset()")


def test_postgres_lists_the_subjects_refused_most_to_rl_admin_only(pg_db, roles):
    conn, _ = pg_db
    app, admin = roles
    with conn.cursor() as cur:
        cur.execute("SELECT rl_stats_reset()")
        cur.execute("SELECT rl_policy_set('login', %s)", (COUNTED,))
        cur.execute(f"SET ROLE {app}")
        for subject, calls in (("ip:1", 6), ("ip:2", 3)):
            for _ in range(calls):
                cur.execute("SELECT rl_check('login', %s)", (subject,))
        for sql in ["SELECT * FROM rl_refused", "SELECT rl_top_refused('login')"]:
            with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                cur.execute(sql)
        cur.execute(f"SET ROLE {admin}")
        cur.execute("SELECT subject, refusals, error FROM rl_refused WHERE policy = 'login' ORDER BY refusals DESC")
        assert cur.fetchall() == [("ip:1", 4, 0), ("ip:2", 1, 0)]
        cur.execute("SELECT rl_top_refused('login', 1)")
        top = cur.fetchone()[0]
        assert top["scope"] == ("server" if EDITION == "native" else "session")
        assert [e["subject"] for e in top["subjects"]] == ["ip:1"]
        cur.execute("SELECT rl_stats_reset()")
        cur.execute("SELECT count(*) FROM rl_refused")
        assert cur.fetchone() == (0,)
        cur.execute("RESET ROLE")


def test_postgres_summary_is_exact_across_sessions(pg_db):
    """Sixteen sessions refused at once: with the library preloaded the server's summary
    counts every refusal (fewer than 64 subjects: no error); the SQL edition's is per session."""
    conn, name = pg_db
    one(conn, "SELECT rl_policy_set('flood', %s)", (COUNTED,))
    one(conn, "SELECT rl_stats_reset()")

    def work(i, c):
        for n in range(60):
            one(c, "SELECT rl_check('flood', %s)", (f"s{(i + n) % 8}",))

    run_sessions(name, 16, work)
    with conn.cursor() as cur:
        cur.execute("SELECT refused FROM rl_stats WHERE policy = 'flood'")
        refused = cur.fetchone()
        cur.execute("SELECT sum(refusals), max(error), count(*) FROM rl_refused WHERE policy = 'flood'")
        listed = cur.fetchone()
    if EDITION == "native":
        assert refused == (16 * 60 - 8 * 2,)
        assert listed == (16 * 60 - 8 * 2, 0, 8)
    else:
        assert refused is None and listed == (None, None, 0)


def test_postgres_counts_and_only_rl_admin_reads_or_resets_them(pg_db, roles):
    conn, _ = pg_db
    app, admin = roles
    with conn.cursor() as cur:
        cur.execute("SELECT rl_stats_reset()")
        cur.execute("SELECT rl_policy_set('enforced', %s), rl_policy_set('shadowed', %s)",
                    (COUNTED, COUNTED.replace("}]}", "}], \"shadow\": true}")))
        cur.execute(f"SET ROLE {app}")
        cur.execute("SELECT rl_check('enforced', 'u'), rl_check('enforced', 'u'), rl_check('enforced', 'u')")
        cur.execute("SELECT rl_check('shadowed', 'u'), rl_check('shadowed', 'u'), rl_check('shadowed', 'u')")
        for sql in ["SELECT * FROM rl_stats", "SELECT rl_stats_reset()", "SELECT rl_policy_stats()"]:
            with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                cur.execute(sql)
        cur.execute(f"SET ROLE {admin}")
        cur.execute("SELECT admitted, refused, would_refuse, refused_blocked FROM rl_stats WHERE policy = 'enforced'")
        assert cur.fetchone() == (2, 1, 0, 0)
        # a shadow policy admits, and counts what it would refuse
        cur.execute("SELECT admitted, refused, would_refuse, refused_blocked FROM rl_stats WHERE policy = 'shadowed'")
        assert cur.fetchone() == (3, 0, 1, 0)
        cur.execute("RESET ROLE")


def test_sqlite_lists_policies_and_blocks(sqlite_db):
    conn, _ = sqlite_db
    conn.execute("SELECT rl_policy_set('login', ?)", (LIMITS,))
    rows = conn.execute("SELECT name, definition FROM rl_policies").fetchall()
    assert [(n, json.loads(d)["limits"][1]["quota"]) for n, d in rows] == [("login", 1000)]
    conn.execute("SELECT rl_block('a', NULL), rl_block('b', 60), rl_block('c', 60, 0), rl_penalize('d')")
    rows = conn.execute("SELECT subject, strikes, blocked_until_ms IS NULL FROM rl_blocks ORDER BY 1").fetchall()
    assert rows == [("a", 0, 1), ("b", 0, 0)], "c's block ended long ago; d has a strike, no block"


def test_postgres_lists_blocks(pg_db):
    conn, _ = pg_db
    with conn.cursor() as cur:
        cur.execute("SET pg_ratelimit.allow_explicit_clock = on")
        cur.execute("SELECT rl_block('a', NULL), rl_block('b', 60), rl_block('c', 60, 0), rl_penalize('d')")
        cur.execute("SELECT subject, strikes, blocked_until_ms IS NULL FROM rl_blocks ORDER BY 1")
        assert cur.fetchall() == [("a", 0, True), ("b", 0, False)]


def test_a_read_only_transaction_checks_nothing_and_changes_no_policy(pg_db):
    from conftest import assert_refused_read_only

    conn, _ = pg_db
    with conn.cursor() as cur:
        cur.execute("SELECT rl_policy_set('login', %s)", (LIMITS,))
        cur.execute("BEGIN READ ONLY")
        for sql, function in (("SELECT rl_check('login', 'ann')", "rl_check"),
                              ("SELECT rl_policy_drop('login')", "rl_policy_drop")):
            assert_refused_read_only(cur, sql, function)
        cur.execute("ROLLBACK")


def test_policy_changes_roll_back(pg_db):
    _, name = pg_db
    tx = pg_connect(name, autocommit=False)
    one(tx, "SELECT rl_policy_set('login', %s)", (LIMITS,))
    tx.rollback()
    with pytest.raises(psycopg2.errors.UndefinedObject):
        one(tx, "SELECT rl_check('login', 'ann')")
    tx.rollback()
    tx.close()


def test_sqlite_sessions_share_policies(tmp_path):
    path = str(tmp_path / "p.db")
    admin, app = sqlite_connect(path), sqlite_connect(path)
    admin.execute("SELECT rl_policy_set('login', ?)", (LIMITS,))
    r = json.loads(app.execute("SELECT rl_check('login', 'ann', 1, NULL)").fetchone()[0])
    assert (r["admitted"], r["items"][0]["remaining"]) == (True, 99)


def bucket_policy(burst):
    return json.dumps({"limits": [{"burst": burst, "refill_per_minute": 0.000001}]})


def sqlite_query(conn, sql, *params):
    """One value of `sql` (written with %s placeholders), JSON decoded."""
    value = conn.execute(sql.replace("%s", "?"), params).fetchone()[0]
    return json.loads(value) if isinstance(value, str) else value


def follows_other_sessions(q, app, admin):
    """`app` checks a one-bucket policy often enough to hold it (and to take the
    one-statement path); every change `admin` makes applies to app's next check."""
    def check():
        r = q(app, "SELECT rl_check('p', 'ann')")
        return (r["admitted"], r["blocked"], r["items"][0]["remaining"])

    q(admin, "SELECT rl_policy_set('p', %s)", bucket_policy(100))
    assert [check() for _ in range(3)] == [(True, False, 99), (True, False, 98), (True, False, 97)]
    q(admin, "SELECT rl_policy_set('p', %s)", bucket_policy(10))
    assert check() == (True, False, 9)  # the stored 97 capped by the new burst
    q(admin, "SELECT rl_block('ann', 3600)")
    assert check() == (False, True, 9)
    q(admin, "SELECT rl_unblock('ann')")
    assert [check() for _ in range(2)] == [(True, False, 8), (True, False, 7)]
    q(admin, "SELECT rl_policy_drop('p')")
    with pytest.raises(Exception, match="there is no policy named 'p'"):
        check()
    q(admin, "SELECT rl_policy_set('p', %s)", bucket_policy(100))
    assert check() == (True, False, 6)
    q(admin, "SELECT rl_penalize('ann', 5)")  # a strike, no block: checks still pass
    assert [check() for _ in range(2)] == [(True, False, 5), (True, False, 4)]
    return check


def test_postgres_sessions_follow_policy_changes_blocks_and_rollbacks(pg_db):
    _, name = pg_db
    app, admin = pg_connect(name), pg_connect(name)

    def q(conn, sql, *params):
        return one(conn, sql, params)

    check = follows_other_sessions(q, app, admin)
    # app's own change, rolled back, is forgotten
    app.autocommit = False
    q(app, "SELECT rl_policy_set('p', %s)", bucket_policy(2))
    assert check() == (True, False, 1)
    app.rollback()
    assert check() == (True, False, 3)
    app.commit()
    # a repeatable-read transaction keeps the policy of its snapshot, then sees the change
    with app.cursor() as cur:
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    assert check() == (True, False, 2)
    q(admin, "SELECT rl_policy_set('p', %s)", bucket_policy(1))
    assert check() == (True, False, 1)
    app.commit()
    assert check() == (True, False, 0)
    assert check() == (False, False, 0)
    app.close()
    admin.close()


def test_sqlite_connections_follow_policy_changes_blocks_and_rollbacks(tmp_path):
    path = str(tmp_path / "p.db")
    app, admin = sqlite_connect(path), sqlite_connect(path)
    q = sqlite_query

    check = follows_other_sessions(q, app, admin)
    app.execute("BEGIN")
    q(app, "SELECT rl_policy_set('p', %s)", bucket_policy(2))
    assert check() == (True, False, 1)
    app.execute("ROLLBACK")
    assert check() == (True, False, 3)


def blocks_reach_warm_sessions(q, app, admin):
    """app's checks take the one-statement path (at the checks epoch, with the subjects
    under blocks known); a block another session records, by a penalty or directly,
    refuses app's very next check: with few subjects under strikes, and with more than a
    session lists (256), when each check finds the subject's strikes in its statement."""
    def check(subject="ann"):
        r = q(app, "SELECT rl_check('b', %s)", subject)
        return (r["admitted"], r["blocked"])

    q(admin, "SELECT rl_policy_set('b', %s)", bucket_policy(1000))
    for strikes_elsewhere in (0, 300):
        for i in range(strikes_elsewhere):
            q(admin, "SELECT rl_penalize(%s, 5)", f"s{i}")
        assert [check(), check(), check("bob"), check("bob")] == [(True, False)] * 4
        q(admin, "SELECT rl_penalize('ann', 1)")  # a free strike
        assert check() == (True, False)
        q(admin, "SELECT rl_penalize('ann', 1)")  # past the free one: blocked
        assert [check(), check("bob"), check()] == [(False, True), (True, False), (False, True)]
        q(admin, "SELECT rl_unblock('ann')")
        assert [check(), check()] == [(True, False)] * 2
        q(admin, "SELECT rl_block('ann', 60)")
        assert check() == (False, True)
        q(admin, "SELECT rl_unblock('ann')")
        assert check() == (True, False)


def test_postgres_blocks_reach_sessions_that_hold_the_policy(pg_db):
    _, name = pg_db
    app, admin = pg_connect(name), pg_connect(name)
    blocks_reach_warm_sessions(lambda conn, sql, *params: one(conn, sql, params), app, admin)
    # a block recorded earlier in the same statement (before the session takes in its own
    # invalidation) refuses too
    assert one(app, "SELECT rl_check('b', 'zed')")["admitted"] is True
    r = one(app, "WITH p AS MATERIALIZED (SELECT rl_penalize('zed', 0)) SELECT rl_check('b', 'zed') FROM p")
    assert (r["admitted"], r["blocked"]) == (False, True)
    app.close()
    admin.close()


def test_sqlite_blocks_reach_connections_that_hold_the_policy(tmp_path):
    path = str(tmp_path / "b.db")
    app, admin = sqlite_connect(path), sqlite_connect(path)
    q = sqlite_query

    # a warm check is one statement: the guarded UPDATE that tests the checks epoch
    q(admin, "SELECT rl_policy_set('b', %s)", bucket_policy(1000))
    assert q(app, "SELECT rl_check('b', 'ann')")["admitted"]
    statements = []
    app.set_trace_callback(statements.append)
    assert q(app, "SELECT rl_check('b', 'ann')")["admitted"]
    app.set_trace_callback(None)
    # (the statements a function runs are traced with a leading "-- ")
    assert [s.split()[1] for s in statements[1:]] == ["UPDATE"] and "checks_epoch" in statements[1]
    blocks_reach_warm_sessions(q, app, admin)
    # a block written into the table directly (a restore, say) moves the epoch as well
    row = q(admin, "SELECT entries FROM rl_entries WHERE kind = 'block' AND key = 's0'")
    blocked = json.dumps(dict(row, blocked_until=None))
    admin.execute("UPDATE rl_entries SET entries = ?, empty_at = 9223372036854775807 WHERE key = 'ann'", (blocked,))
    assert q(app, "SELECT rl_check('b', 'ann')")["blocked"] is True
    admin.execute("DELETE FROM rl_entries WHERE key = 'ann'")
    assert q(app, "SELECT rl_check('b', 'ann')")["admitted"] is True
    admin.execute("INSERT INTO rl_entries VALUES ('ann', 'block', ?, 9223372036854775807)", (blocked,))
    assert q(app, "SELECT rl_check('b', 'ann')")["blocked"] is True
    # and so does a policy changed directly
    admin.execute("UPDATE rl_policy SET definition = ? WHERE name = 'b'", (bucket_policy(0.5),))
    assert q(app, "SELECT rl_check('b', 'ann')")["admitted"] is False
