"""ratelimit-rls through Envoy's own client code: the RateLimitService stubs generated from
envoyproxy/data-plane-api (PyPI's xds-protos) and grpc.health.v1, against the built server
on SQLite and on PostgreSQL (the extension, and the SQL edition where it is installed).

Run by scripts/test.sh with the web venv's Python after `cargo build --release -p
ratelimit-rls`; PostgreSQL cases need the test cluster (PGHOST, RL_PG_DIR, RL_PG_BIN).
"""
import concurrent.futures
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
import urllib.request

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# built in a target folder of its own (scripts/package.sh says why)
BINARY = os.environ.get("RL_RLS_BINARY", os.path.join(ROOT, "target", "rls", "release", "ratelimit-rls"))
EXTENSION = os.path.join(ROOT, "target", "release", "libratelimit")
OK, OVER = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT

# envoyproxy/ratelimit's README examples 2 to 9 as its README configures them (example 1
# has the same form with one level), and ours for budgets, refunds and each failure mode:
# one file per domain, as the server reads a folder
EXAMPLES = os.path.join(ROOT, "rls", "config", "examples")


def bound_ports(lines):
    """The ports a server started on port 0 took, from its "serving" log line: nothing
    chosen beforehand, so no other process (or the other port) can take one in between.
    `lines` yields the log's lines as they come."""
    for line in lines:
        if b'"msg":"serving"' in line:
            record = json.loads(line)
            return int(record["grpc"].rsplit(":", 1)[1]), int(record["http"].rsplit(":", 1)[1])
    raise AssertionError("the server stopped before serving")


def descriptor(*entries, hits=None, negative=False):
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries])
    if hits is not None:
        d.hits_addend.value = hits
    if negative:
        # is_negative_hits (field 4, Envoy 1.36) postdates xds-protos 1.85: set as the wire
        # has it; the message keeps it as an unknown field and sends it on
        d = ratelimit_pb2.RateLimitDescriptor.FromString(d.SerializeToString() + b"\x20\x01")
    return d


class Database:
    def __init__(self, engine, tmp_path):
        self.engine = engine
        if engine == "sqlite":
            self.path = str(tmp_path / "rls.db")
            self.url = "sqlite:" + self.path
        else:
            import psycopg

            self.name = "rl_rls_" + tmp_path.name.replace("-", "_").lower()[-40:]
            with psycopg.connect(dbname="postgres", autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {self.name}")
                admin.execute(f"CREATE DATABASE {self.name}")
            host = os.environ["PGHOST"]
            port = os.environ.get("PGPORT", "5432")
            user = os.environ.get("PGUSER", "postgres")
            if engine == "postgres":
                with psycopg.connect(dbname=self.name, autocommit=True) as c:
                    c.execute("CREATE EXTENSION pg_ratelimit")
            else:
                # the SQL edition as a managed service's master user installs it (no
                # superuser), and the server connects as that user
                user = "owner_" + self.name
                with psycopg.connect(dbname="postgres", autocommit=True) as admin:
                    admin.execute(f"DROP ROLE IF EXISTS {user}")
                    admin.execute(f"CREATE ROLE {user} LOGIN CREATEDB CREATEROLE")
                    admin.execute(f"ALTER DATABASE {self.name} OWNER TO {user}")
                own = os.path.join(os.environ.get("RL_PG_BIN", ""), "psql")  # the server's major's psql, if any
                subprocess.run([own if os.path.exists(own) else "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-U", user,
                                "-d", self.name,
                                "-f", sql_edition_script()], check=True, capture_output=True)
            self.url = f"host={host} port={port} user={user} dbname={self.name}"

    def close(self):
        if self.engine != "sqlite":
            import psycopg

            with psycopg.connect(dbname="postgres", autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
                admin.execute(f"DROP ROLE IF EXISTS owner_{self.name}")

    def sql(self, statement, *args):
        if self.engine == "sqlite":
            c = sqlite3.connect(self.path, timeout=30)
            c.enable_load_extension(True)
            c.load_extension(EXTENSION)
            try:
                return c.execute(statement, args).fetchone()[0]
            finally:
                c.close()
        import psycopg

        with psycopg.connect(dbname=self.name, autocommit=True) as c:
            return c.execute(statement.replace("?", "%s"), args).fetchone()[0]


ENGINES = ["sqlite"] + (["postgres", "postgres-sql"] if os.environ.get("PGHOST") else [])


def dist_file(pattern, mode):
    """dist/<pattern with this version>, built by scripts/package.sh <mode> when missing."""
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        version = next(line.split('"')[1] for line in f if line.startswith("version ="))
    path = os.path.join(ROOT, "dist", pattern.format(version=version))
    if not os.path.exists(path):
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "package.sh"), mode], check=True,
                       stdout=subprocess.DEVNULL)
    return path


def sql_edition_script():
    """The SQL edition's plain script, as scripts/package.sh --sql writes it."""
    return dist_file("pg_ratelimit_sql-{version}.sql", "--sql")


@pytest.fixture(params=ENGINES)
def db(request, tmp_path):
    database = Database(request.param, tmp_path)
    yield database
    database.close()


class Server:
    def __init__(self, db, config_dir, env=None, args=()):
        self.log = open(os.path.join(config_dir, "..", "server.log"), "wb")
        self.proc = subprocess.Popen(
            [BINARY, "--config", str(config_dir), "--database", db.url, "--grpc", "127.0.0.1:0",
             "--http", "127.0.0.1:0", "--reload-seconds", "0.2", "--pool", "8", *args],
            stdout=self.log, stderr=subprocess.STDOUT,
            # a generous statement timeout on a machine running the whole suite (the default
            # is below Envoy's 20 ms; the timeout's own test sets it)
            env={"RLS_STATEMENT_TIMEOUT_MS": "5000", **os.environ, **(env or {})})
        try:
            self.grpc_port, self.http_port = bound_ports(self.log_lines())
        except AssertionError as e:
            raise AssertionError(f"{e}: {self.text()}") from None
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = rls_pb2_grpc.RateLimitServiceStub(self.channel)
        health = health_pb2_grpc.HealthStub(self.channel)
        deadline = time.time() + 30
        while True:
            try:
                status = health.Check(health_pb2.HealthCheckRequest(service="envoy.service.ratelimit.v3.RateLimitService"),
                                      timeout=1).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass
            assert self.proc.poll() is None, self.text()
            assert time.time() < deadline, "the server did not become healthy: " + self.text()
            time.sleep(0.1)

    def log_lines(self, seconds=30):
        """The log's lines as the server writes them, until it exits or `seconds` pass."""
        deadline, seen = time.time() + seconds, 0
        while time.time() < deadline:
            lines = self.text().encode().splitlines(keepends=True)
            complete = [line for line in lines if line.endswith(b"\n")]
            yield from complete[seen:]
            seen = len(complete)
            if self.proc.poll() is not None:
                return
            time.sleep(0.05)
        raise AssertionError("the server did not say it was serving")

    def text(self):
        self.log.flush()
        with open(self.log.name, "rb") as f:
            return f.read().decode(errors="replace")

    def ask(self, domain, *descriptors, hits=0, timeout=10):
        return self.stub.ShouldRateLimit(
            rls_pb2.RateLimitRequest(domain=domain, descriptors=list(descriptors), hits_addend=hits), timeout=timeout)

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def stop(self):
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(timeout=20)
        return self.proc.returncode


def examples_server(db, tmp_path, *names, env=None):
    """A server on some of the example files (all of them when none is named)."""
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    for name in names or os.listdir(EXAMPLES):
        shutil.copy(os.path.join(EXAMPLES, name), config_dir / name)
    s = Server(db, config_dir, env=env)
    s.config_dir = config_dir
    s.db = db
    return s


@pytest.fixture
def server(db, tmp_path):
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    for name in os.listdir(EXAMPLES):
        shutil.copy(os.path.join(EXAMPLES, name), config_dir / name)
    s = Server(db, config_dir)
    s.config_dir = config_dir
    s.db = db
    yield s
    s.stop()


def metric(text, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    prefix = f"{name}{{{want}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    return 0.0


def test_the_reference_readme_examples(server):
    # example 2: five marketing messages a day to one number, a hundred of any kind
    marketing = descriptor(("message_type", "marketing"), ("to_number", "2061111111"))
    anything = descriptor(("to_number", "2061111111"))
    for _ in range(5):
        r = server.ask("messaging", marketing, anything)
        assert r.overall_code == OK
    r = server.ask("messaging", marketing, anything)
    assert r.overall_code == OVER
    assert [s.code for s in r.statuses] == [OVER, OK]
    assert r.statuses[0].current_limit.requests_per_unit == 5
    assert r.statuses[0].current_limit.unit == rls_pb2.RateLimitResponse.RateLimit.DAY
    # as the reference counts: the refused call still counts on the 100 a day (with
    # STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT it would not)
    assert r.statuses[1].limit_remaining == 94
    assert 0 < r.statuses[0].duration_until_reset.seconds <= 86400
    # another number has its own five
    assert server.ask("messaging", descriptor(("message_type", "marketing"), ("to_number", "2062222222"))).overall_code == OK

    # example 3: the most specific match; a limit of 0 refuses every call
    r = server.ask("edge_proxy_per_ip", descriptor(("remote_address", "50.0.0.5")))
    assert r.overall_code == OVER and r.statuses[0].current_limit.requests_per_unit == 0
    r = server.ask("edge_proxy_per_ip", descriptor(("remote_address", "50.0.0.1")), hits=10)
    assert r.overall_code == OK and r.statuses[0].current_limit.requests_per_unit == 10
    assert server.ask("edge_proxy_per_ip", descriptor(("remote_address", "50.0.0.1")), hits=10).overall_code == OVER
    assert server.ask("edge_proxy_per_ip", descriptor(("remote_address", "50.0.0.2")), hits=10).overall_code == OK
    # beside a refusal without the database the others are counted, as the reference counts
    r = server.ask("edge_proxy_per_ip", descriptor(("remote_address", "50.0.0.5")), descriptor(("remote_address", "50.0.0.3")))
    assert [s.code for s in r.statuses] == [OVER, OK] and r.statuses[1].limit_remaining == 9
    assert server.ask("edge_proxy_per_ip", descriptor(("remote_address", "50.0.0.3")), hits=9).overall_code == OK

    # example 4: a two-entry descriptor matches only a two-level configuration
    r = server.ask("example4", descriptor(("key", "value")))
    assert r.overall_code == OK and not r.statuses[0].HasField("current_limit")
    r = server.ask("example4", descriptor(("key", "value"), ("subkey", "subvalue")))
    assert r.statuses[0].current_limit.requests_per_unit == 300

    # example 5: unlimited answers OK with LimitRemaining at MaxUint32
    r = server.ask("internal", descriptor(("ldap", "x")), descriptor(("azure", "y")))
    assert r.overall_code == OK
    assert r.statuses[0].limit_remaining == 2**32 - 1 and not r.statuses[0].HasField("current_limit")
    assert r.statuses[1].current_limit.requests_per_unit == 100 and r.statuses[1].limit_remaining == 99

    # example 6: shadow mode never refuses (and counts what it would have)
    a = descriptor(("service", "auth-service"), ("user", "user-a"))
    b = descriptor(("service", "auth-service"), ("user", "user-b"))
    assert server.ask("example6", a, hits=11).overall_code == OK
    assert server.ask("example6", b, hits=21).overall_code == OVER
    # the shadow rule refuses nothing; user-b is still over (its refused 21 hits were
    # counted in this second, as the reference counts them)
    r = server.ask("example6", a, b, hits=11)
    assert [s.code for s in r.statuses] == [OK, OVER] and r.statuses[1].limit_remaining == 0

    # example 7: replaces
    one = descriptor(("key_1", "value_1"), ("user", "bkthomps"))
    two = descriptor(("key_2", "value_2"), ("user", "bkthomps"))
    r = server.ask("example7", one, two)
    assert not r.statuses[0].HasField("current_limit") and r.statuses[1].current_limit.requests_per_unit == 10
    r = server.ask("example7", one)
    assert r.statuses[0].current_limit.requests_per_unit == 5 and r.statuses[0].current_limit.name == "specific_limit"

    # example 8 and 9: detailed metrics, wildcards
    for v in ("unspecified_value", "unspecified_value2", "value1"):
        server.ask("example8", descriptor(("key1", v)))
    assert server.ask("example9", descriptor(("key1", "value1")), hits=20).overall_code == OK
    assert server.ask("example9", descriptor(("key1", "value2")), hits=20).overall_code == OK
    assert server.ask("example9", descriptor(("key1", "value2"))).overall_code == OVER
    assert server.ask("example9", descriptor(("key1", "other"))).statuses[0].HasField("current_limit") is False

    m = server.metrics()
    assert metric(m, "ratelimit_service_rate_limit_total_hits", domain="messaging",
                  key="message_type_marketing.to_number") == 7
    assert metric(m, "ratelimit_service_rate_limit_over_limit", domain="messaging",
                  key="message_type_marketing.to_number") == 1
    # within the limit 6 times (5, and one more number's first); near it (under 20 % left) once
    assert metric(m, "ratelimit_service_rate_limit_within_limit", domain="messaging",
                  key="message_type_marketing.to_number") == 6
    assert metric(m, "ratelimit_service_rate_limit_near_limit", domain="messaging",
                  key="message_type_marketing.to_number") == 1
    # the reference's split: of the first 11 hits on 10, 1 over; of the next 11 (the bucket
    # refilling 10 a second between the calls), up to all 11
    assert 2 <= metric(m, "ratelimit_service_rate_limit_shadow_mode", domain="example6", key="service.user_user-a") <= 12
    for key in ("key1_unspecified_value", "key1_unspecified_value2", "key1_value1"):
        assert metric(m, "ratelimit_service_rate_limit_total_hits", domain="example8", key=key) == 1, key
    assert metric(m, "ratelimit_service_rate_limit_total_hits", domain="example9", key="key1_value*") == 41
    assert "ratelimit_service_should_rate_limit_seconds_count" in m
    assert server.stop() == 0
    assert '"msg":"stopped"' in server.text()


def test_headers_envoy_adds_to_the_response(server):
    r = server.ask("api", descriptor(("burst", "ann")), hits=5)
    headers = {h.key: h.value for h in r.response_headers_to_add}
    assert headers["RateLimit-Policy"].startswith('"api-bucket";q=5;w=3600'), headers
    assert headers["RateLimit"].startswith('"api-bucket";r=0;'), headers
    assert "Retry-After" not in headers
    r = server.ask("api", descriptor(("burst", "ann")))
    headers = {h.key: h.value for h in r.response_headers_to_add}
    # the refused hit is counted, as the reference counts it: the next one waits for two
    # refills of 720 s
    assert r.overall_code == OVER and 1300 <= int(headers["Retry-After"]) <= 1440, headers
    assert r.statuses[0].limit_remaining == 0 and 1300 <= r.statuses[0].duration_until_reset.seconds <= 1440


def test_exact_totals_under_32_concurrent_streams(db, tmp_path):
    """32 clients, each on its own channel, ask for a user's daily budget and the shared
    one of 200 in one call: exactly 200 calls are admitted, and with
    STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT the user budgets were charged for those only."""
    server = examples_server(db, tmp_path, "api.yaml", env={"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"})
    try:
        concurrent_streams(server, charged_for_users=200)
    finally:
        server.stop()


def test_exact_totals_when_concurrent_calls_are_charged_in_batches(db, tmp_path):
    """The same 32 clients, counting as the reference does: every call is charged (the user
    budgets 320 in all), calls that arrive together are charged in one statement (two
    workers, so most batches hold several calls), and each call is answered with the count
    its own hits made: exactly 200 calls see the shared budget within its 200."""
    server = examples_server(db, tmp_path, "api.yaml", env={"RLS_BATCH_WORKERS": "2"})
    try:
        concurrent_streams(server, charged_for_users=320)
        used = server.db.sql("SELECT CAST(json_extract(rl_budget(?, 'day', 200, 0), '$.used') AS int)"
                             if server.db.engine == "sqlite" else "SELECT (rl_budget(?, 'day', 200, 0)->>'used')::int",
                             'envoy:["api","everyone","all","day"]')
        assert used == 320
        m = server.metrics()
        calls = metric(m, "ratelimit_service_charged_calls_total")
        statements = metric(m, "ratelimit_service_charge_statements_total")
        assert calls == 320 and statements < calls, (calls, statements)  # some statements carried several calls
    finally:
        server.stop()


def concurrent_streams(server, charged_for_users):
    users = [f"u{i}" for i in range(32)]

    def client(user):
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
            stub = rls_pb2_grpc.RateLimitServiceStub(ch)
            admitted = 0
            for _ in range(10):
                r = stub.ShouldRateLimit(rls_pb2.RateLimitRequest(
                    domain="api", descriptors=[descriptor(("user", user)), descriptor(("everyone", "all"))]), timeout=30)
                admitted += r.overall_code == OK
            return admitted

    barrier = threading.Barrier(32)

    def run(user):
        barrier.wait()
        return client(user)

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        counts = list(pool.map(run, users))
    assert sum(counts) == 200, counts
    charged = sum(server.db.sql("SELECT CAST(json_extract(rl_budget(?, 'day', 1000, 0), '$.used') AS int)"
                                if server.db.engine == "sqlite" else
                                "SELECT (rl_budget(?, 'day', 1000, 0)->>'used')::int",
                                'envoy:["api","user","%s","day"]' % u) for u in users)
    assert charged == charged_for_users


def test_refunds_and_checks_that_charge_nothing(server):
    tokens = lambda **kw: descriptor(("tokens", "team-1"), **kw)
    assert server.ask("api", tokens(), hits=40).statuses[0].limit_remaining == 10
    # a check (hits_addend 0) charges nothing and says whether the count is past the limit
    r = server.ask("api", tokens(hits=0))
    assert r.overall_code == OK and r.statuses[0].limit_remaining == 10
    # past the limit: refused, and counted as the reference counts it (51 of 50 used)
    assert server.ask("api", tokens(hits=11)).overall_code == OVER
    r = server.ask("api", tokens(hits=0))
    assert r.overall_code == OVER and r.statuses[0].limit_remaining == 0
    # is_negative_hits gives back (the model's answer was shorter than reserved)
    r = server.ask("api", tokens(hits=25, negative=True))
    assert r.overall_code == OK and r.statuses[0].limit_remaining == 24
    assert server.ask("api", tokens(hits=24)).statuses[0].limit_remaining == 0
    r = server.ask("api", tokens(hits=0))
    assert r.overall_code == OK and r.statuses[0].limit_remaining == 0
    assert server.ask("api", tokens(hits=1)).overall_code == OVER


def test_a_domain_counted_in_fixed_windows_as_the_reference_counts(db, tmp_path):
    """`algorithm: fixed` at a file's top counts every rule of the domain as the reference
    does: each hit, refused or not, in a window of one unit aligned to the Unix epoch, the
    count starting again at the window's start; the reset is the time to the window's end.
    A rule that names its own algorithm keeps it."""
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "exact.yaml").write_text(
        "domain: exact\nalgorithm: fixed\ndescriptors:\n"
        "  - key: ip\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"
        "  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: bucket}\n")
    server = Server(db, config_dir)
    try:
        for attempt in range(3):  # a run that crosses an hour's end runs again, on a new key
            hour = int(time.time()) // 3600
            answers = [server.ask("exact", descriptor(("ip", f"10.0.0.{attempt}")), hits=h) for h in (1, 1, 1, 1, 0, 2)]
            after = time.time()
            if int(after) // 3600 == hour:
                break
        codes = [a.overall_code for a in answers]
        assert codes == [OK, OK, OK, OVER, OVER, OVER]
        remaining = [a.statuses[0].limit_remaining for a in answers]
        assert remaining == [2, 1, 0, 0, 0, 0]
        # every hit counted, refused ones too: 4 after the fourth, 6 after the last
        to_the_hour = (hour + 1) * 3600 - after
        for a in answers:
            assert to_the_hour - 2 <= a.statuses[0].duration_until_reset.seconds <= to_the_hour + 2
        # the bucket rule of the same file refills instead: its reset is a third of an hour
        r = server.ask("exact", descriptor(("user", "u")), hits=3)
        assert r.overall_code == OK and r.statuses[0].duration_until_reset.seconds == 3600
    finally:
        server.stop()


def test_a_changed_file_is_reloaded_and_a_bad_one_keeps_the_last_good(server):
    d = descriptor(("azure", "z"))
    assert server.ask("internal", d).statuses[0].current_limit.requests_per_unit == 100
    path = server.config_dir / "internal.yaml"
    path.write_text(path.read_text().replace("100", "3"))
    deadline = time.time() + 30
    while server.ask("internal", d).statuses[0].current_limit.requests_per_unit != 3:
        assert time.time() < deadline, server.text()
        time.sleep(0.1)
    path.write_text("domain: internal\ndescriptors:\n  - key: azure\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
    deadline = time.time() + 30
    while metric(server.metrics(), "ratelimit_service_config_loads_total", result="error") < 1:
        assert time.time() < deadline, server.text()
        time.sleep(0.1)
    assert server.ask("internal", d).statuses[0].current_limit.requests_per_unit == 3
    assert "internal.yaml: invalid rate limit unit 'fortnight'" in server.text()


def test_a_configmap_swap_is_reloaded(db, tmp_path):
    """A Kubernetes ConfigMap volume: each file is a symlink through `..data`, itself a
    symlink that the kubelet swaps to a new folder in one rename; dot names are not config."""
    mount = tmp_path / "mount"
    mount.mkdir()

    def publish(version, requests):
        folder = mount / f"..2026_{version}"
        folder.mkdir()
        (folder / "internal.yaml").write_text(
            f"domain: internal\ndescriptors:\n  - key: azure\n    rate_limit: {{unit: minute, requests_per_unit: {requests}}}\n")
        os.symlink(folder.name, mount / "..data_tmp")
        os.rename(mount / "..data_tmp", mount / "..data")

    publish(1, 100)
    os.symlink("..data/internal.yaml", mount / "internal.yaml")
    (mount / ".internal.yaml.swp").write_text("not: yaml: at all")
    server = Server(db, mount)
    try:
        d = descriptor(("azure", "z"))
        assert server.ask("internal", d).statuses[0].current_limit.requests_per_unit == 100
        publish(2, 7)
        deadline = time.time() + 30
        while server.ask("internal", d).statuses[0].current_limit.requests_per_unit != 7:
            assert time.time() < deadline, server.text()
            time.sleep(0.1)
    finally:
        server.stop()


def stop_postgres():
    subprocess.run(["runuser", "-u", "postgres", "--", os.environ["RL_PG_BIN"] + "/pg_ctl", "-D",
                    os.path.join(os.environ["RL_PG_DIR"], "data"), "-m", "fast", "-w", "stop"],
                   check=True, capture_output=True)


def start_postgres():
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "pg_cluster.sh"), "start"], check=True, capture_output=True)


def test_the_database_stopped_and_started(server):
    if server.db.engine == "sqlite":
        pytest.skip("PostgreSQL's case")
    if not (os.environ.get("RL_PG_DIR") and os.environ.get("RL_PG_BIN")):
        pytest.skip("needs RL_PG_DIR and RL_PG_BIN to stop and start the cluster")
    d = descriptor(("k", "v"))
    assert server.ask("envoy_decides", d).overall_code == OK
    stop_postgres()
    try:
        assert server.ask("open", d).overall_code == OK
        assert server.ask("closed", d).overall_code == OVER
        with pytest.raises(grpc.RpcError) as e:
            server.ask("envoy_decides", d)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert metric(server.metrics(), "ratelimit_service_errors_total", kind="unreachable") >= 3
    finally:
        start_postgres()
    deadline = time.time() + 30
    while True:
        try:
            r = server.ask("envoy_decides", d)
            break
        except grpc.RpcError:
            assert time.time() < deadline, server.text()
            time.sleep(0.2)
    assert r.overall_code == OK and r.statuses[0].limit_remaining == 3


def test_bad_requests_are_named(server):
    with pytest.raises(grpc.RpcError) as e:
        server.ask("", descriptor(("k", "v")))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "domain must not be empty" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        server.ask("api")
    assert "descriptors must not be empty" in e.value.details()
    # an unknown domain has no limits, as in the reference
    assert server.ask("nobody", descriptor(("k", "v"))).overall_code == OK


def test_a_rule_that_names_a_policy_with_the_tier_from_an_entry(server):
    server.db.sql("SELECT rl_policy_set(?, ?)", "api_calls",
                  json.dumps({"limits": [{"period": "day", "quota": 2}], "tiers": {"free": 1, "pro": 3}}))
    free = descriptor(("plan", "free"), ("user", "ann"))
    pro = descriptor(("plan", "pro"), ("user", "bob"))
    for _ in range(2):
        assert server.ask("tiers", free).overall_code == OK
    r = server.ask("tiers", free)
    assert r.overall_code == OVER and r.statuses[0].current_limit.name == "api_calls"
    assert r.statuses[0].current_limit.requests_per_unit == 2
    assert r.statuses[0].current_limit.unit == rls_pb2.RateLimitResponse.RateLimit.DAY
    # the pro tier's multiplier: 6 a day; with the org's 4 a day in the same call, the fifth
    # call is refused by the org's budget and, as the reference counts, the policy's hit
    # stays counted
    org = descriptor(("org", "acme"))
    for _ in range(4):
        assert server.ask("tiers", pro, org).overall_code == OK
    r = server.ask("tiers", pro, org)
    assert [s.code for s in r.statuses] == [OK, OVER]
    r = server.ask("tiers", pro)
    assert r.overall_code == OK and r.statuses[0].limit_remaining == 0
    # negative hits give back through rl_refund_check (the refused third call was counted)
    r = server.ask("tiers", descriptor(("plan", "free"), ("user", "ann"), hits=2, negative=True))
    assert r.overall_code == OK
    assert server.ask("tiers", free).overall_code == OK
    # a policy that does not exist is the caller's error, named
    server.db.sql("SELECT rl_policy_drop(?)", "api_calls")
    with pytest.raises(grpc.RpcError) as e:
        server.ask("tiers", free)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "api_calls" in e.value.details()


def test_the_deb_as_installed(tmp_path):
    """dist/ratelimit-rls_<version>_amd64.deb (scripts/package.sh --rls): its dependencies are
    met here, and its binary, configured through the environment as its systemd unit does,
    answers from its own example folder."""
    deb = dist_file("ratelimit-rls_{version}_amd64.deb", "--rls")
    depends = subprocess.run(["dpkg-deb", "-f", deb, "Depends"], check=True, capture_output=True, text=True).stdout
    for package in [d.split()[0] for d in depends.split(",")]:
        subprocess.run(["dpkg", "-s", package], check=True, capture_output=True)
    root = tmp_path / "root"
    subprocess.run(["dpkg-deb", "-x", deb, str(root)], check=True)
    unit = (root / "lib/systemd/system/ratelimit-rls.service").read_text()
    assert "EnvironmentFile=/etc/default/ratelimit-rls" in unit and "ExecStart=/usr/bin/ratelimit-rls" in unit
    defaults = dict(line.split("=", 1) for line in (root / "etc/default/ratelimit-rls").read_text().splitlines()
                    if line and not line.startswith("#"))
    assert set(defaults) == {"RLS_CONFIG", "RLS_DATABASE_URL", "RLS_GRPC", "RLS_HTTP"}
    assert sorted(os.listdir(root / "etc/ratelimit-rls/examples")) == sorted(os.listdir(EXAMPLES))
    assert os.listdir(root / "etc/ratelimit-rls/config") == []
    conffiles = subprocess.run(["dpkg-deb", "-I", deb, "conffiles"], check=True, capture_output=True, text=True).stdout
    assert "/etc/ratelimit-rls/examples/tiers.yaml" in conffiles.split()
    env = dict(os.environ, RLS_CONFIG=str(root / "etc/ratelimit-rls/examples"),
               RLS_DATABASE_URL="sqlite:" + str(tmp_path / "deb.db"), RLS_GRPC="127.0.0.1:0",
               RLS_HTTP="127.0.0.1:0")
    proc = subprocess.Popen([str(root / "usr/bin/ratelimit-rls")], env=env, stderr=subprocess.PIPE)
    try:
        port, _ = bound_ports(iter(proc.stderr.readline, b""))
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            grpc.channel_ready_future(ch).result(timeout=30)
            r = rls_pb2_grpc.RateLimitServiceStub(ch).ShouldRateLimit(
                rls_pb2.RateLimitRequest(domain="internal", descriptors=[descriptor(("azure", "a"))]), timeout=10)
            assert r.overall_code == OK and r.statuses[0].limit_remaining == 99
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    checked = subprocess.run([str(root / "usr/bin/ratelimit-rls"), "--check",
                              str(root / "etc/ratelimit-rls/examples")], capture_output=True, text=True)
    assert checked.returncode == 0 and "13 domain(s)" in checked.stdout and "messaging" in checked.stdout, checked
    bad = tmp_path / "bad.yaml"
    bad.write_text("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n")
    checked = subprocess.run([str(root / "usr/bin/ratelimit-rls"), "--check", str(bad)], capture_output=True, text=True)
    assert checked.returncode == 2 and "bad.yaml" in checked.stderr and "requests_per_unit" in checked.stderr, checked
    help_text = subprocess.run([str(root / "usr/bin/ratelimit-rls"), "--help"], capture_output=True, text=True)
    assert help_text.returncode == 0 and "RLS_DATABASE_URL" in help_text.stdout


def a_descriptor_of(rules, entries=()):
    """The entries of the first path in a configuration's descriptors that ends at a rule
    with a limit: each key with its value (a wildcard's `*` as "x", no value as "x")."""
    for node in rules:
        here = [*entries, (node["key"], str(node.get("value") or "x").replace("*", "x"))]
        limit = node.get("rate_limit")
        if limit and not limit.get("unlimited") and limit.get("requests_per_unit", 1) != 0:
            return here
        deeper = a_descriptor_of(node.get("descriptors") or (), here)
        if deeper:
            return deeper
    return None


def gateway_guide_sql():
    """The ```sql blocks of docs/guides/gateways.md, as written."""
    with open(os.path.join(ROOT, "docs", "guides", "gateways.md")) as f:
        return [re.sub(r"(?m)^\s*--.*$", "", b) for b in re.findall(r"```sql\n(.*?)```", f.read(), re.S)]


@pytest.mark.parametrize("example", sorted(os.listdir(EXAMPLES)))
def test_every_shipped_example_answers_as_shipped_to_the_guides_first_request(db, tmp_path, example):
    """Each file of rls/config/examples (the .deb's /etc/ratelimit-rls/examples) on a fresh
    database, as the guide's first hour has it: whatever policies it names set by the
    guide's own SQL, then `ratelimit-rls --probe` with a descriptor its rules count."""
    import yaml

    with open(os.path.join(EXAMPLES, example)) as f:
        text = f.read()
    config = yaml.safe_load(text)
    for block in gateway_guide_sql():  # the guide's policies that this file names
        if any(f"policy: {name}" in text for name in re.findall(r"rl_policy_set\('(\w+)'", block)):
            db.sql(block.strip().rstrip(";"))
    s = examples_server(db, tmp_path, example)
    try:
        entries = a_descriptor_of(config["descriptors"])
        assert entries, f"{example}: no rule to ask"
        probe = subprocess.run([BINARY, "--probe", config["domain"], ",".join(f"{k}={v}" for k, v in entries),
                                "--grpc", f"127.0.0.1:{s.grpc_port}"], capture_output=True, text=True, timeout=30)
        assert probe.returncode == 0, f"{example}: {probe.stdout}{probe.stderr}\n{s.text()}"
        answer = json.loads(probe.stdout)
        assert answer["overall_code"] == "OK" and [st["code"] for st in answer["statuses"]] == ["OK"], answer
    finally:
        s.stop()


def test_the_probe_says_over_limit_and_no_answer_by_its_exit_status(tmp_path):
    db = Database("sqlite", tmp_path)
    s = examples_server(db, tmp_path, "edge_proxy_per_ip.yaml")
    try:
        ask = [BINARY, "--probe", "edge_proxy_per_ip", "remote_address=50.0.0.5", "--grpc", f"127.0.0.1:{s.grpc_port}"]
        over = subprocess.run(ask, capture_output=True, text=True, timeout=30)
        assert over.returncode == 1 and json.loads(over.stdout)["overall_code"] == "OVER_LIMIT", over
    finally:
        s.stop()
    gone = subprocess.run(ask, capture_output=True, text=True, timeout=30)
    assert gone.returncode == 2 and "no rate limit service at" in json.loads(gone.stderr)["error"], gone


def test_a_port_in_use_is_named_at_start_and_port_0_takes_a_free_one(tmp_path):
    """Both ports are bound before the server says it serves: a taken --grpc or --http
    stops the start with the flag and the address named (exit 2, no "serving" line), and
    port 0 takes a free port that the "serving" line names (the tests' servers use it)."""
    db = Database("sqlite", tmp_path)
    s = examples_server(db, tmp_path, "edge_proxy_per_ip.yaml")
    try:
        assert s.grpc_port and s.http_port and s.grpc_port != s.http_port
        for flag, taken in [("--grpc", s.grpc_port), ("--http", s.http_port)]:
            other = "--http" if flag == "--grpc" else "--grpc"
            run = subprocess.run([BINARY, "--config", EXAMPLES, "--database", db.url, flag, f"127.0.0.1:{taken}",
                                  other, "127.0.0.1:0"], capture_output=True, text=True, timeout=30)
            assert run.returncode == 2, run
            assert '"msg":"serving"' not in run.stderr, run.stderr
            assert f"{flag} 127.0.0.1:{taken}: " in json.loads(run.stderr.splitlines()[-1])["error"], run.stderr
        assert s.ask("edge_proxy_per_ip", descriptor(("remote_address", "50.0.0.6"))).overall_code == OK
    finally:
        s.stop()


def test_a_database_without_the_functions_cannot_decide(tmp_path):
    """A database that lacks the functions (or the grant to run them) gets the domain's
    on_database_error, not INVALID_ARGUMENT: no call of the client's is wrong."""
    if not os.environ.get("PGHOST"):
        pytest.skip("PostgreSQL's case")
    import psycopg

    name = "rl_rls_bare_" + tmp_path.name.replace("-", "_").lower()[-30:]
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    db = Database.__new__(Database)
    db.engine, db.name = "postgres", name
    db.url = (f"host={os.environ['PGHOST']} port={os.environ.get('PGPORT', '5432')} "
              f"user={os.environ.get('PGUSER', 'postgres')} dbname={name}")
    server = examples_server(db, tmp_path, "closed.yaml", "envoy_decides.yaml")
    try:
        assert server.ask("closed", descriptor(("k", "v"))).overall_code == OVER
        with pytest.raises(grpc.RpcError) as e:
            server.ask("envoy_decides", descriptor(("k", "v")))
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "42883" in e.value.details()
    finally:
        server.stop()
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
