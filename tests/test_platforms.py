"""Managed PostgreSQL as its users meet it (docs/managed-postgres.md): each platform's roles
and default privileges emulated on our own cluster, the SQL edition installed as that
platform's installing role with psql, and the page's own blocks run as written. Then:
every function, view and table has exactly the privileges the edition intends, whatever
the platform granted by default; the browser's roles cannot lift blocks, rewrite policies
or read the state; installs are atomic and need neither CREATEROLE nor the database's
ownership. The native extension is checked under the same default privileges."""
import os
import re
import uuid

import pytest

from conftest import (EDITION, FUNCTIONS, INSTALL, ROOT, admin, pg_available, pg_connect, pg_database,
                      pg_tle_preloaded, run_plain_script, sql_edition_script_path)
from clusters import cluster

psycopg2 = pytest.importorskip("psycopg2")

DOC = os.path.join(ROOT, "docs", "managed-postgres.md")
# the public functions of each edition (the native one's also answers about its server)
APP = {"sql": [f for f in FUNCTIONS if f["kind"] not in ("internal", "server")],
       "native": [f for f in FUNCTIONS if f["kind"] != "internal"]}
ADMIN_VIEWS = ("rl_policies", "rl_blocks", "rl_stats", "rl_refused")
BROWSER_ROLES = ("anon", "authenticated", "service_role")
RELEASED = os.path.join(ROOT, "sql", "released", "edition")


def blocks(platform, language="sql"):
    """The ```language blocks under a platform's heading of docs/managed-postgres.md, as written."""
    text = open(DOC).read()
    start = text.index(f"\n## {platform}")
    end = text.find("\n## ", start + 1)
    return re.findall(rf"```{language}\n(.*?)```", text[start:end if end > 0 else None], re.S)


def signature(f, schema):
    types = ", ".join(p["type"] + ("[]" if p["variadic"] else "") for p in f["params"])
    return f"{schema}.{f['name']}({types})"


def grants(cur, schema):
    """Every object of an install and who besides its owner may use it, as
    {object: {(grantee, privilege), ...}}; grantee "PUBLIC" for everyone."""
    cur.execute("""
        WITH objects AS (
            SELECT 'schema ratelimit' AS name, nspacl AS acl, nspowner AS owner, 'n' AS type
            FROM pg_namespace WHERE nspname = 'ratelimit'
            UNION ALL SELECT 'table ' || c.oid::regclass::text, c.relacl, c.relowner, 'r' FROM pg_class c
            WHERE c.relnamespace = 'ratelimit'::regnamespace AND c.relkind IN ('r', 'v')
            UNION ALL SELECT 'view ' || c.oid::regclass::text, c.relacl, c.relowner, 'r' FROM pg_class c
            WHERE c.relnamespace = %s::regnamespace AND c.relname LIKE 'rl\\_%%'
            UNION ALL SELECT 'function ' || p.oid::regprocedure::text, p.proacl, p.proowner, 'f' FROM pg_proc p
            WHERE p.pronamespace IN ('ratelimit'::regnamespace, %s::regnamespace) AND p.proname LIKE 'rl\\_%%')
        SELECT o.name, CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END, a.privilege_type
        FROM objects o LEFT JOIN LATERAL aclexplode(coalesce(o.acl, acldefault(o.type::"char", o.owner))) a
             ON a.grantee <> o.owner""", (schema, schema))
    out = {}
    for name, grantee, privilege in cur.fetchall():
        out.setdefault(name, set())
        if grantee is not None:
            out[name].add((grantee, privilege))
    return out


def intended(cur, schema, admin_role=True, edition="sql"):
    """What grants() must find on an install of `edition` in `schema`."""
    cur.execute("SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.pronamespace = 'ratelimit'::regnamespace")
    want = {f"function {name}": set() for (name,) in cur.fetchall()}
    want["schema ratelimit"] = set()
    for table in ("rl_bucket", "rl_budget", "rl_entries", "rl_policy", "rl_usage", "rl_setting"):
        want[f"table ratelimit.{table}"] = set()
    qualified = "" if schema == "public" else f"{schema}."
    for view in ADMIN_VIEWS:
        want[f"view {qualified}{view}"] = {("rl_admin", "SELECT")} if admin_role else set()
    for f in APP[edition]:
        cur.execute("SELECT %s::regprocedure::text", (signature(f, schema),))
        name = f"function {cur.fetchone()[0]}"
        want[name] = ({("rl_admin", "EXECUTE")} if admin_role else set()) if f["admin_only"] else {("PUBLIC", "EXECUTE")}
    return want


def assert_exact_privileges(conn, schema="public", admin_role=True):
    with conn.cursor() as cur:
        assert grants(cur, schema) == intended(cur, schema, admin_role)


def assert_browser_roles_shut_out(conn, schema="public"):
    """As each of Supabase's browser roles: no administration function, view, state table or
    helper answers (42501); application functions answer."""
    with conn.cursor() as cur:
        for role in BROWSER_ROLES:
            cur.execute(f"SET ROLE {role}")
            for sql in (f"SELECT {schema}.rl_unblock('ip:1')", f"SELECT {schema}.rl_reset('k')",
                        f"""SELECT {schema}.rl_policy_set('p', '{{"limits": [{{"burst": 1, "refill_per_minute": 1}}]}}')""",
                        f"SELECT {schema}.rl_policy_drop('p')", f"SELECT {schema}.rl_stats_reset()",
                        f"SELECT * FROM {schema}.rl_blocks", f"SELECT * FROM {schema}.rl_policies",
                        f"SELECT * FROM {schema}.rl_stats", f"SELECT * FROM {schema}.rl_refused",
                        f"SELECT {schema}.rl_top_refused('p')", f"SELECT {schema}.rl_budgets_near(0)",
                        "SELECT * FROM ratelimit.rl_bucket",
                        "UPDATE ratelimit.rl_entries SET entries = ''", "SELECT ratelimit.rl__ceil_seconds(1)"):
                with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                    cur.execute(sql)
            cur.execute(f"SELECT {schema}.rl_take('k', 3, 60) ->> 'admitted'")
            assert cur.fetchone() == ("true",)
            cur.execute("RESET ROLE")


needs_pg = pytest.mark.skipif(not os.environ.get("PGHOST"), reason="PGHOST not set")
edition_pass = pytest.mark.skipif(INSTALL != "sql", reason="run in the SQL edition's pass (RL_PG_EDITION=sql)")


def role(prefix):
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def server_major():
    conn = pg_connect("postgres")
    with conn.cursor() as cur:
        cur.execute("SHOW server_version_num")
        major = int(cur.fetchone()[0]) // 10000
    conn.close()
    return major


def ensure_roles(*names):
    """Cluster-wide roles a platform has (created once; other tests' databases may use them)."""
    for name in names:
        admin(f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') THEN "
              f"CREATE ROLE {name} NOLOGIN NOINHERIT; END IF; END $$")


def supabase(name):
    """Supabase's initial schema on database `name`: its roles, the schema extensions and the
    installing role's default privileges. Returns the installing role (Supabase's postgres)."""
    owner = role("supabase_postgres")
    ensure_roles(*BROWSER_ROLES, "authenticator")
    admin(f"CREATE ROLE {owner} LOGIN CREATEROLE CREATEDB")
    admin(f"GRANT anon, authenticated, service_role TO authenticator")
    admin(f"GRANT authenticator TO {owner} WITH ADMIN OPTION")
    admin(f"ALTER DATABASE {name} OWNER TO {owner}")
    conn = pg_connect(name)
    with conn.cursor() as cur:
        cur.execute(f"CREATE SCHEMA extensions AUTHORIZATION {owner}")
        cur.execute(f"GRANT USAGE ON SCHEMA public, extensions TO {owner}, anon, authenticated, service_role")
        cur.execute(f"GRANT CREATE ON SCHEMA public TO {owner}")
        for schema in ("public", "extensions"):
            for kind in ("TABLES", "FUNCTIONS", "SEQUENCES"):
                cur.execute(f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA {schema} "
                            f"GRANT ALL ON {kind} TO {owner}, anon, authenticated, service_role")
    conn.close()
    return owner


def as_role(name, user):
    conn = psycopg2.connect(dbname=name, user=user)
    conn.autocommit = True
    return conn


def drop_role(name):
    admin(f"DROP ROLE IF EXISTS {name}")


@needs_pg
@edition_pass
@pytest.mark.parametrize("schema", ["extensions", "public"])
def test_supabase_default_privileges_give_the_browser_nothing(schema):
    with pg_database("rl_supabase", extension=False) as name:
        owner = supabase(name)
        try:
            options = ("-v", f"rl_schema={schema}") if schema != "public" else ()
            run_plain_script(name, owner, *options)
            conn = as_role(name, owner)
            assert_exact_privileges(conn, schema)
            assert_browser_roles_shut_out(pg_connect(name), schema)
            # the state lives in ratelimit whatever the schema of the functions
            with conn.cursor() as cur:
                cur.execute(f"SELECT {schema}.rl_take('owner-key', 3, 60) ->> 'remaining'")
                assert cur.fetchone() == ("2",)
                cur.execute("SELECT key FROM ratelimit.rl_bucket ORDER BY key")
                assert cur.fetchall() == [("k",), ("owner-key",)]
            conn.close()
        finally:
            admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            drop_role(owner)


@needs_pg
@edition_pass
def test_an_install_by_the_0_3_0_script_is_mended_by_this_one():
    """0.3.0 revoked only from PUBLIC, so Supabase's default privileges left anon able to
    lift blocks and read them: this release's script, run over that install, takes it back."""
    with pg_database("rl_supabase_old", extension=False) as name:
        owner = supabase(name)
        try:
            run_plain_script(name, owner, script=os.path.join(RELEASED, "pg_ratelimit_sql-0.3.0.sql"))
            conn = pg_connect(name)
            with conn.cursor() as cur:
                cur.execute("SET ROLE anon")
                cur.execute("SELECT rl_unblock('ip:1'), count(*) FROM rl_blocks")  # the hole, as reported
                assert cur.fetchone() == (False, 0)
                cur.execute("RESET ROLE")
            run_plain_script(name, owner)
            assert_browser_roles_shut_out(conn)
            with conn.cursor() as cur:
                assert grants(cur, "public")["view rl_blocks"] == {("rl_admin", "SELECT")}
            conn.close()
        finally:
            admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            drop_role(owner)


@needs_pg
@edition_pass
def test_supabase_pre_request_and_trigger_limit_as_the_request_role():
    """The page's blocks as written: the edition in extensions, direct calls for
    service_role only, the db-pre-request function and the trigger, each called as
    PostgREST would call them (SET ROLE, request.headers and request.jwt.claims)."""
    install, restrict, pre_request, configure, trigger = blocks("Supabase", "sh")[0], *blocks("Supabase")
    assert configure.startswith("ALTER ROLE authenticator SET pgrst.db_pre_request")
    assert "-v rl_schema=extensions" in install
    with pg_database("rl_supabase_recipes", extension=False) as name:
        owner = supabase(name)
        try:
            run_plain_script(name, owner, "-v", "rl_schema=extensions")
            conn = as_role(name, owner)
            with conn.cursor() as cur:
                for block in (restrict, pre_request, trigger):
                    cur.execute(block)
            conn.close()
            # Supabase's supautils lets its postgres role set PostgREST's settings on
            # authenticator; stock PostgreSQL lets a superuser
            superuser = pg_connect(name)
            superuser.cursor().execute(configure)
            superuser.close()
            request = pg_connect(name)
            with request.cursor() as cur:
                cur.execute("SET ROLE anon")
                with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                    cur.execute("SELECT extensions.rl_take('k', 3, 60)")
                cur.execute("SELECT set_config('request.headers', '{\"x-forwarded-for\": \"203.0.113.9, 10.0.0.1\"}', false)")
                for _ in range(30):
                    cur.execute("SELECT public.check_request()")
                with pytest.raises(psycopg2.Error) as refused:
                    cur.execute("SELECT public.check_request()")
                assert refused.value.pgcode == "PGRST"
                assert '"status" : 429' in refused.value.diag.message_detail
                cur.execute("RESET ROLE")
                # another client is not affected
                cur.execute("SET ROLE anon")
                cur.execute("SELECT set_config('request.headers', '{\"x-forwarded-for\": \"198.51.100.7\"}', false)")
                cur.execute("SELECT public.check_request()")
                # writes per user, in the trigger, as authenticated
                cur.execute("SET ROLE authenticated")
                cur.execute("SELECT set_config('request.jwt.claims', '{\"sub\": \"user-1\"}', false)")
                for i in range(3):
                    cur.execute("INSERT INTO public.comments (body) VALUES (%s)", (f"comment {i}",))
                with pytest.raises(psycopg2.errors.ProgramLimitExceeded) as too_many:
                    cur.execute("INSERT INTO public.comments (body) VALUES ('one more')")
                assert "too many comments" in str(too_many.value)
                cur.execute("RESET ROLE")
                cur.execute("SET ROLE service_role")
                cur.execute("SELECT extensions.rl_take('k', 3, 60) ->> 'admitted'")
                assert cur.fetchone() == ("true",)
            request.close()
            # a newer script over the install keeps the restriction
            run_plain_script(name, owner, "-v", "rl_schema=extensions")
            check = pg_connect(name)
            with check.cursor() as cur:
                cur.execute("SELECT has_function_privilege('anon', 'extensions.rl_take(text, float8, float8, float8, float8)', "
                            "'EXECUTE'), has_function_privilege('service_role', 'extensions.rl_take(text, float8, float8, "
                            "float8, float8)', 'EXECUTE')")
                assert cur.fetchone() == (False, True)
            check.close()
        finally:
            admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            drop_role(owner)


@needs_pg
@edition_pass
def test_restricted_callers_stay_restricted_through_a_newer_script():
    with pg_database("rl_restricted", extension=False) as name:
        owner, app = role("owner"), role("app")
        admin(f"CREATE ROLE {owner} LOGIN CREATEDB CREATEROLE")
        admin(f"CREATE ROLE {app} NOLOGIN")
        admin(f"ALTER DATABASE {name} OWNER TO {owner}")
        try:
            run_plain_script(name, owner)
            conn = as_role(name, owner)
            with conn.cursor() as cur:
                for f in APP["sql"]:
                    if not f["admin_only"]:
                        cur.execute(f"REVOKE EXECUTE ON FUNCTION {signature(f, 'public')} FROM PUBLIC")
                        cur.execute(f"GRANT EXECUTE ON FUNCTION {signature(f, 'public')} TO {app}")
                before = grants(cur, "public")
            run_plain_script(name, owner)
            with conn.cursor() as cur:
                assert grants(cur, "public") == before
                cur.execute("SELECT has_function_privilege('public', 'rl_take(text, float8, float8, float8, float8)', 'EXECUTE')")
                assert cur.fetchone() == (False,)
            conn.close()
        finally:
            admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            drop_role(owner)
            drop_role(app)


@needs_pg
@edition_pass
def test_an_object_in_the_way_is_named_and_nothing_is_left_behind():
    with pg_database("rl_in_the_way", extension=False) as name:
        owner = role("owner")
        admin(f"CREATE ROLE {owner} LOGIN CREATEDB CREATEROLE")
        admin(f"ALTER DATABASE {name} OWNER TO {owner}")
        try:
            conn = as_role(name, owner)
            with conn.cursor() as cur:
                cur.execute("CREATE TABLE public.rl_blocks (id int)")
            out = run_plain_script(name, owner, check=False)
            assert out.returncode != 0
            assert "public.rl_blocks exists and is not a view" in out.stderr or "rl_blocks exists and is not a view" in out.stderr
            with conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'ratelimit'")
                assert cur.fetchone() == (0,)
                cur.execute("SELECT count(*) FROM pg_proc WHERE proname LIKE 'rl\\_%'")
                assert cur.fetchone() == (0,)
            # and without ON_ERROR_STOP on the command line, as pasted: still nothing
            out = run_plain_script(name, owner, "-v", "ON_ERROR_STOP=0", check=False)
            with conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'ratelimit'")
                assert cur.fetchone() == (0,)
            conn.close()
        finally:
            admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            drop_role(owner)


@needs_pg
@edition_pass
@pytest.mark.parametrize("platform, group", [("rds", "rds_superuser"), ("cloudsql", "cloudsqlsuperuser"),
                                             ("azure", "azure_pg_admin")])
def test_a_managed_master_user_installs(platform, group):
    """RDS's master user (rds_superuser), Cloud SQL's postgres user (cloudsqlsuperuser; it
    does not own the application's database: CREATE on it and on public), Azure's
    administrator (azure_pg_admin): CREATEROLE and CREATEDB, no superuser."""
    with pg_database(f"rl_{platform}", extension=False) as name:
        admin(f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{group}') THEN "
              f"CREATE ROLE {group} NOLOGIN CREATEROLE CREATEDB; END IF; END $$")
        master = role(platform)
        admin(f"CREATE ROLE {master} LOGIN CREATEROLE CREATEDB IN ROLE {group}")
        if platform == "cloudsql":
            admin(f"GRANT CREATE ON DATABASE {name} TO {master}")
            conn = pg_connect(name)
            conn.cursor().execute(f"GRANT CREATE ON SCHEMA public TO {master}")
            conn.close()
        else:
            admin(f"ALTER DATABASE {name} OWNER TO {master}")
        try:
            install = blocks({"rds": "Amazon RDS", "cloudsql": "Google Cloud SQL", "azure": "Azure"}[platform], "sh")
            assert any("pg_ratelimit_sql-0.4.0.sql" in b for b in install) or platform == "rds"
            run_plain_script(name, master)
            conn = as_role(name, master)
            assert_exact_privileges(conn)
            with conn.cursor() as cur:
                cur.execute("SELECT rl_take('k', 3, 60, 1, 0) ->> 'remaining'")  # the owner's explicit clock
                assert cur.fetchone() == ("2",)
            conn.close()
        finally:
            admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            drop_role(master)


@needs_pg
@edition_pass
def test_neon_pg_write_all_data_reaches_the_state_as_the_page_says():
    if server_major() < 14:
        pytest.skip("pg_write_all_data is PostgreSQL 14's")
    with pg_database("rl_neon", extension=False) as name:
        admin("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'neon_superuser') THEN "
              "CREATE ROLE neon_superuser NOLOGIN CREATEROLE CREATEDB IN ROLE pg_read_all_data, pg_write_all_data; "
              "END IF; END $$")
        owner, app = role("neondb_owner"), role("app")
        admin(f"CREATE ROLE {owner} LOGIN CREATEROLE CREATEDB IN ROLE neon_superuser")
        admin(f"CREATE ROLE {app} LOGIN IN ROLE pg_write_all_data")
        admin(f"ALTER DATABASE {name} OWNER TO {owner}")
        try:
            run_plain_script(name, owner)
            assert_exact_privileges(as_role(name, owner))
            conn = as_role(name, app)
            with conn.cursor() as cur:
                cur.execute("SELECT rl_take('k', 1, 0.001) ->> 'admitted', rl_take('k', 1, 0.001) ->> 'admitted'")
                assert cur.fetchone() == ("true", "false")
                # what the page says plainly: no grant stops pg_write_all_data
                cur.execute("DELETE FROM ratelimit.rl_bucket")  # every limit reset; no WHERE: it may not read
                assert cur.rowcount == 1
                cur.execute("SELECT rl_take('k', 1, 0.001) ->> 'admitted'")
                assert cur.fetchone() == ("true",)
            conn.close()
        finally:
            admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            drop_role(owner)
            drop_role(app)


@needs_pg
@edition_pass
def test_a_superuser_install_warns_and_a_dedicated_owner_does_not():
    with pg_database("rl_superuser", extension=False) as name:
        out = run_plain_script(name, "postgres")
        assert "every rl_* function runs as a superuser" in out.stderr
    with pg_database("rl_dedicated", extension=False) as name:
        try:
            conn = pg_connect(name)
            with conn.cursor() as cur:
                # rl_admin exists on the test cluster already (the page's first line makes it)
                cur.execute(blocks("Crunchy Bridge")[0].replace("DATABASE app", f"DATABASE {name}")
                            .replace("CREATE ROLE rl_admin NOLOGIN;\n", ""))
            shell = blocks("Crunchy Bridge", "sh")[0]
            assert "-c 'SET ROLE ratelimit_owner' -f dist/pg_ratelimit_sql-0.4.0.sql" in shell
            out = run_plain_script(name, "postgres", "-c", "SET ROLE ratelimit_owner")
            assert "superuser" not in out.stderr
            with conn.cursor() as cur:
                cur.execute("SELECT proowner::regrole::text FROM pg_proc WHERE proname = 'rl_take'")
                assert cur.fetchone() == ("ratelimit_owner",)
            assert_exact_privileges(conn)
            conn.close()
        finally:
            admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            drop_role("ratelimit_owner")


@needs_pg
@edition_pass
def test_heroku_without_createrole_and_rl_admin_created_later(tmp_path):
    """Heroku's customer role owns its database but may not create roles, on a cluster with
    no rl_admin (a cluster of its own: rl_admin is the whole cluster's)."""
    port = 54390 + server_major() % 10
    with cluster(port) as c:
        c.sql("CREATE ROLE heroku_user LOGIN")
        c.sql("CREATE DATABASE app OWNER heroku_user")
        env = dict(PGHOST=c.folder, PGPORT=str(c.port))
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            assert blocks("Heroku", "sh")
            out = run_plain_script("app", "heroku_user")
            assert "may not create the role rl_admin" in out.stderr
            conn = psycopg2.connect(host=c.folder, port=c.port, dbname="app", user="heroku_user")
            conn.autocommit = True
            assert_exact_privileges(conn, admin_role=False)
            with conn.cursor() as cur:
                cur.execute("""SELECT rl_policy_set('login', '{"limits": [{"burst": 5, "refill_per_minute": 5}]}')""")
                cur.execute("SELECT rl_take('k', 3, 60, 1, 0) ->> 'remaining', count(*) FROM rl_blocks")
                assert cur.fetchone() == ("2", 0)
            # later: rl_admin made by a role that may, and the same script run again grants it
            c.sql("CREATE ROLE rl_admin NOLOGIN")
            c.sql("CREATE ROLE ops LOGIN IN ROLE rl_admin")
            out = run_plain_script("app", "heroku_user")
            assert "rl_admin" not in out.stderr
            assert_exact_privileges(conn, admin_role=True)
            ops = psycopg2.connect(host=c.folder, port=c.port, dbname="app", user="ops")
            with ops.cursor() as cur:
                cur.execute("SELECT rl_unblock('ip:1'), rl_take('k', 3, 60, 1, 0) ->> 'remaining'")
                assert cur.fetchone() == (False, "1")
            ops.close()
            conn.close()
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@needs_pg
@pytest.mark.skipif(EDITION != "native", reason="the native extension's pass")
def test_the_native_extension_under_supabase_default_privileges():
    """CREATE EXTENSION pg_ratelimit by a superuser whose default privileges grant ALL in
    public and extensions to Supabase's roles (and, globally, on tables to anon)."""
    with pg_database("rl_native_supabase", extension=False) as name:
        ensure_roles(*BROWSER_ROLES)
        conn = pg_connect(name)
        try:
            with conn.cursor() as cur:
                cur.execute("CREATE SCHEMA extensions")
                cur.execute("GRANT USAGE ON SCHEMA public, extensions TO anon, authenticated, service_role")
                for schema in ("public", "extensions"):
                    for kind in ("TABLES", "FUNCTIONS", "SEQUENCES"):
                        cur.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} "
                                    f"GRANT ALL ON {kind} TO anon, authenticated, service_role")
                cur.execute("ALTER DEFAULT PRIVILEGES GRANT ALL ON TABLES TO anon")
                cur.execute("ALTER DEFAULT PRIVILEGES GRANT ALL ON SCHEMAS TO anon")
                cur.execute("CREATE EXTENSION pg_ratelimit SCHEMA extensions")
                cur.execute("SET pg_ratelimit.allow_explicit_clock = off")
                assert grants(cur, "extensions") == intended(cur, "extensions", edition="native")
            assert_browser_roles_shut_out(conn, "extensions")
        finally:
            conn.close()


@needs_pg
def test_a_pg_tle_update_from_0_3_0_mends_privileges_and_keeps_restrictions():
    """RDS or Supabase with pg_tle: 0.3.0 registered and created in extensions under
    Supabase's default privileges (anon could lift blocks), rl_take restricted to
    service_role by the owner; this release's file registers the update path, and ALTER
    EXTENSION ... UPDATE takes the browser roles' grants back and keeps the restriction."""
    if INSTALL != "pg_tle" or not pg_tle_preloaded():
        pytest.skip("the pg_tle pass (RL_PG_EDITION=pg_tle, a cluster that preloads pg_tle)")
    with pg_database("rl_tle_supabase", extension=False) as name:
        owner = supabase(name)
        try:
            superuser = pg_connect(name)
            with superuser.cursor() as cur:
                cur.execute("CREATE EXTENSION IF NOT EXISTS pg_tle")
                cur.execute(f"GRANT pgtle_admin TO {owner}")
            superuser.close()
            conn = as_role(name, owner)
            take = "extensions.rl_take(text, float8, float8, float8, float8)"
            with conn.cursor() as cur:
                cur.execute("SELECT pgtle.install_extension('pg_ratelimit_sql', '0.3.0', 'pg_ratelimit 0.3.0', %s)",
                            (open(os.path.join(RELEASED, "pg_ratelimit_sql--0.3.0.sql")).read(),))
                cur.execute("CREATE EXTENSION pg_ratelimit_sql VERSION '0.3.0' SCHEMA extensions")
                cur.execute(f"REVOKE EXECUTE ON FUNCTION {take} FROM PUBLIC, anon, authenticated")
                cur.execute(f"GRANT EXECUTE ON FUNCTION {take} TO service_role")
                cur.execute("SELECT has_function_privilege('anon', 'extensions.rl_unblock(text, float8)', 'EXECUTE')")
                assert cur.fetchone() == (True,), "0.3.0's hole, as reported"
                cur.execute(open(sql_edition_script_path("pg_tle.sql")).read())
                cur.execute("ALTER EXTENSION pg_ratelimit_sql UPDATE")
                cur.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_ratelimit_sql'")
                assert cur.fetchone()[0] != "0.3.0"
                cur.execute(f"SELECT has_function_privilege('anon', '{take}', 'EXECUTE'), "
                            f"has_function_privilege('service_role', '{take}', 'EXECUTE')")
                assert cur.fetchone() == (False, True)
                found = grants(cur, "extensions")
            assert found[f"function extensions.rl_unblock(text,double precision)"] == {("rl_admin", "EXECUTE")}
            assert found["view extensions.rl_blocks"] == {("rl_admin", "SELECT")}
            assert found["table ratelimit.rl_entries"] == set()
            conn.close()
        finally:
            admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            drop_role(owner)


@needs_pg
def test_a_pg_tle_install_under_supabase_grants_has_exact_privileges():
    if INSTALL != "pg_tle" or not pg_tle_preloaded():
        pytest.skip("the pg_tle pass (RL_PG_EDITION=pg_tle, a cluster that preloads pg_tle)")
    with pg_database("rl_tle_exact", extension=False) as name:
        owner = supabase(name)
        try:
            superuser = pg_connect(name)
            with superuser.cursor() as cur:
                cur.execute("CREATE EXTENSION IF NOT EXISTS pg_tle")
                cur.execute(f"GRANT pgtle_admin TO {owner}")
            superuser.close()
            conn = as_role(name, owner)
            with conn.cursor() as cur:
                cur.execute(open(sql_edition_script_path("pg_tle.sql")).read())
                cur.execute("CREATE EXTENSION pg_ratelimit_sql SCHEMA extensions")
            assert_exact_privileges(conn, "extensions")
            conn.close()
            assert_browser_roles_shut_out(pg_connect(name), "extensions")
        finally:
            admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            drop_role(owner)
