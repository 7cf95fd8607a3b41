"""ratelimit-rls as a gateway meets it: no client input makes a call fail open, costs sent
after the response are always counted (Envoy Gateway's and Envoy AI Gateway's shapes),
configuration pushed over xDS as Envoy Gateway pushes it, a slow or stopped database met
within the statement timeout and said by the health services, and bounded metric labels.
Through Envoy's generated client, against the built server, on every engine."""
import concurrent.futures
import json
import os
import queue
import subprocess
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf import any_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from test_rls import (EXAMPLES, OK, OVER, Server, db, descriptor, examples_server, metric,  # noqa: F401
                      start_postgres, stop_postgres)  # noqa: F401 (db: the engines' fixture)

HEALTH_NAMES = ["", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"]


def serve(db, tmp_path, files, env=None):
    config_dir = tmp_path / "config"
    config_dir.mkdir(exist_ok=True)
    for name, text in files.items():
        (config_dir / name).write_text(text)
    server = Server(db, config_dir, env=env)
    server.db = db
    return server


TOKENS = """domain: ai
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000}
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: route
    rate_limit: {unit: week, requests_per_unit: 1000}
  - key: burst
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: plan
    descriptors:
      - key: user
        rate_limit: {policy: tokens, tier_key: plan}
"""


@pytest.mark.parametrize("mode", ["reference", "stop"])
def test_costs_sent_after_the_response_are_always_counted(db, tmp_path, mode):
    """Envoy AI Gateway and Envoy Gateway's cost-based limits check on the request (hits 0)
    and send the real cost after the response (apply_on_stream_done): four responses of
    1,500 tokens against a budget with 100 left are all counted, into debt, and later
    requests wait until it is paid back; in both counting modes. A calendar budget (and a
    policy's) counts every token; a bucket's or a window's debt is at most one unit's
    limit, so that a client that keeps sending waits about one unit, as the reference's
    counter lasts one unit."""
    env = {"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"} if mode == "stop" else None
    db.sql("SELECT rl_policy_set(?, ?)", "tokens", json.dumps({"limits": [{"period": "day", "quota": 1000}]}))
    server = serve(db, tmp_path, {"ai.yaml": TOKENS}, env)
    try:
        for key in ("user", "route", "model"):
            d = lambda **kw: descriptor((key, "ann"), **kw)
            r = server.ask("ai", d(hits=0))
            assert r.overall_code == OK and r.statuses[0].limit_remaining == 1000, key
            server.ask("ai", d(hits=900))
            assert server.ask("ai", d(hits=0)).statuses[0].limit_remaining == 100, key
            for _ in range(4):  # the responses, after the work
                server.ask("ai", d(hits=1500))
            r = server.ask("ai", d(hits=0))
            assert r.overall_code == OVER and r.statuses[0].limit_remaining == 0, key
        # what the database holds: the budget counted every token
        used = db.sql("SELECT CAST(json_extract(rl_budget(?, 'day', 1000, 0), '$.used') AS int)"
                      if db.engine == "sqlite" else "SELECT (rl_budget(?, 'day', 1000, 0)->>'used')::int",
                      'envoy:["ai","user","ann","day"]')
        assert used == 900 + 4 * 1500
        # a bucket's debt is at most one unit's limit: a client that keeps sending waits
        # about one unit, as the reference's counter lasts one unit
        for _ in range(10):
            server.ask("ai", descriptor(("burst", "bo"), hits=3))
        r = server.ask("ai", descriptor(("burst", "bo"), hits=0))
        assert r.overall_code == OVER and r.statuses[0].duration_until_reset.seconds <= 4800
        # a policy: checked on the request (rl_peek_check), charged after the response
        p = lambda **kw: descriptor(("plan", "free"), ("user", "cy"), **kw)
        assert server.ask("ai", p(hits=0)).overall_code == OK
        server.ask("ai", p(hits=900))
        for _ in range(4):
            server.ask("ai", p(hits=1500))
        assert server.ask("ai", p(hits=0)).overall_code == OVER
        used = db.sql("SELECT CAST(json_extract(rl_peek_check(?, ?, 0), '$.items[0].used') AS int)"
                      if db.engine == "sqlite" else "SELECT (rl_peek_check(?, ?, 0)->'items'->0->>'used')::int",
                      "tokens", "cy")
        assert used == 900 + 4 * 1500
    finally:
        server.stop()


def test_no_client_input_makes_a_call_fail(db, tmp_path):
    """Envoy lets a failed call through (failure_mode_deny: false), so whatever a client can
    put in a request is OK or OVER_LIMIT, never an error: long values, a long policy subject,
    an unknown tier, too many descriptors, hits past any counter's range, a check of a
    policy. A limit used up stays used up whatever else the call carries."""
    db.sql("SELECT rl_policy_set(?, ?)", "api_calls", json.dumps({"limits": [{"period": "day", "quota": 2}],
                                                                 "tiers": {"pro": 3}}))
    server = examples_server(db, tmp_path, "api.yaml", "tiers.yaml")
    try:
        jwt = "eyJ" + "x" * 4000
        r = server.ask("api", descriptor(("user", jwt)))
        assert r.overall_code == OK and r.statuses[0].limit_remaining == 999
        assert server.ask("api", descriptor(("user", jwt))).statuses[0].limit_remaining == 998
        # a used-up limit beside a long value: still refused
        for _ in range(5):
            server.ask("api", descriptor(("burst", "ann")))
        r = server.ask("api", descriptor(("burst", "ann")), descriptor(("user", "y" * 70_000)))
        assert r.overall_code == OVER and [s.code for s in r.statuses] == [OVER, OK]
        # a long subject and an unknown tier on a policy rule
        r = server.ask("tiers", descriptor(("plan", "pro"), ("user", "z" * 5000)))
        assert r.overall_code == OK and r.statuses[0].current_limit.requests_per_unit == 6
        r = server.ask("tiers", descriptor(("plan", "platinum"), ("user", "dan")))
        assert r.overall_code == OK and r.statuses[0].current_limit.requests_per_unit == 2
        # a check of a policy (hits 0) reads and charges nothing
        for _ in range(3):
            r = server.ask("tiers", descriptor(("plan", "free"), ("user", "eve"), hits=0))
            assert r.overall_code == OK and r.statuses[0].limit_remaining == 2
        # too many descriptors: over the limit, at once, whatever their number
        r = server.ask("api", *[descriptor(("user", f"u{i}")) for i in range(65)])
        assert r.overall_code == OVER and len(r.statuses) == 65
        started = time.monotonic()
        r = server.ask("api", *[descriptor(("user", f"v{i}")) for i in range(60_000)], timeout=30)
        assert r.overall_code == OVER and time.monotonic() - started < 5
        assert server.ask("api", descriptor(("user", "u1"))).statuses[0].limit_remaining == 999  # nothing counted
        # hits past any counter's range: over the limit
        assert server.ask("api", descriptor(("tokens", "t")), hits=2**32 - 1).overall_code == OVER
        for hits in (10**15 + 1, 2**64 - 1):
            r = server.ask("api", descriptor(("tokens", f"t{hits}"), hits=hits))
            assert r.overall_code == OVER, hits
        r = server.ask("tiers", descriptor(("plan", "free"), ("user", "fay"), hits=2**64 - 1))
        assert r.overall_code == OVER
        assert "ratelimit_service_errors_total{kind=\"refused\"}" not in server.metrics()
    finally:
        server.stop()


def test_detailed_metric_labels_are_bounded(db, tmp_path):
    server = serve(db, tmp_path, {"d.yaml": "domain: d\ndescriptors:\n  - key: k\n    detailed_metric: true\n"
                                            "    rate_limit: {unit: second, requests_per_unit: 100}\n"},
                   env={"RLS_MAX_METRIC_KEYS": "20"})
    try:
        for i in range(40):
            server.ask("d", descriptor(("k", f"value-{i}")))
        m = server.metrics()
        keys = {line.split('key="')[1].split('"')[0] for line in m.splitlines()
                if line.startswith("ratelimit_service_rate_limit_total_hits{")}
        assert len(keys) == 21 and "_other" in keys
        assert metric(m, "ratelimit_service_rate_limit_total_hits", domain="d", key="_other") == 20
    finally:
        server.stop()


# --- configuration pushed over xDS --------------------------------------------------------

TYPE_URL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
UNITS = {"SECOND": 1, "MINUTE": 2, "HOUR": 3, "DAY": 4, "MONTH": 5, "YEAR": 6, "WEEK": 7}


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(tag, wire, payload):
    key = _varint(tag << 3 | wire)
    if wire == 0:
        return key + _varint(payload)
    return key + _varint(len(payload)) + payload


def rate_limit_config(name, domain, descriptors):
    """ratelimit.config.ratelimit.v3.RateLimitConfig in protobuf's wire format (xds-protos
    has no Python module for it): descriptors are (key, value, (requests_per_unit, unit))."""
    body = _field(1, 2, name.encode()) + _field(2, 2, domain.encode())
    for key, value, (n, unit) in descriptors:
        policy = _field(1, 0, UNITS[unit]) + _field(2, 0, n)
        d = _field(1, 2, key.encode()) + (_field(2, 2, value.encode()) if value else b"") + _field(3, 2, policy)
        body += _field(3, 2, d)
    return any_pb2.Any(type_url=TYPE_URL, value=body)


class ManagementServer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """An xDS management server of state-of-the-world pushes, as Envoy Gateway runs one:
    each push is every RateLimitConfig; the answers (ACK or NACK) are kept."""

    def __init__(self):
        self.pushes = queue.Queue()
        self.answers = queue.Queue()
        self.nodes = []
        self.version = 0

    def push(self, *configs):
        self.version += 1
        self.pushes.put(discovery_pb2.DiscoveryResponse(version_info=str(self.version), resources=list(configs),
                                                        type_url=TYPE_URL, nonce=f"n{self.version}"))
        return str(self.version)

    def StreamAggregatedResources(self, request_iterator, context):
        def read():
            for request in request_iterator:
                self.nodes.append(request.node.id)
                if request.response_nonce:
                    self.answers.put(request)

        threading.Thread(target=read, daemon=True).start()
        while context.is_active():
            try:
                yield self.pushes.get(timeout=0.2)
            except queue.Empty:
                pass


def test_configuration_pushed_over_xds(db, tmp_path):
    """CONFIG_TYPE=GRPC_XDS_SOTW, as Envoy Gateway configures its rate limit service: a
    pushed config is loaded and acknowledged, a changed one replaces it, a bad one is
    refused with its error (the last good one stays), and a withdrawn one is gone."""
    management = ManagementServer()
    grpc_server = grpc.server(concurrent.futures.ThreadPoolExecutor(4))
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(management, grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    empty = tmp_path / "unused"
    empty.mkdir()
    server = Server(db, empty, env={"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": f"127.0.0.1:{port}",
                                    "CONFIG_GRPC_XDS_NODE_ID": "eg-ratelimit", "RLS_CONFIG": ""})
    try:
        def answer(version):
            a = management.answers.get(timeout=20)
            assert a.type_url == TYPE_URL and a.response_nonce == f"n{version}"
            return a

        v = management.push(rate_limit_config("eg-default", "gateway", [("user", "", (2, "MINUTE"))]))
        a = answer(v)
        assert a.version_info == v and not a.HasField("error_detail")
        assert "eg-ratelimit" in management.nodes
        d = descriptor(("user", "ann"))
        assert [server.ask("gateway", d).overall_code for _ in range(3)] == [OK, OK, OVER]
        v = management.push(rate_limit_config("eg-default", "gateway", [("user", "", (5, "MINUTE"))]),
                            rate_limit_config("eg-other", "other", [("ip", "10.0.0.1", (1, "SECOND"))]))
        assert answer(v).version_info == v
        r = server.ask("gateway", descriptor(("user", "bo")))
        assert r.statuses[0].current_limit.requests_per_unit == 5
        assert server.ask("other", descriptor(("ip", "10.0.0.1"))).statuses[0].current_limit.requests_per_unit == 1
        good = v
        v = management.push(rate_limit_config("eg-broken", "", []))
        a = answer(v)
        assert a.version_info == good and a.error_detail.message == "eg-broken: config file cannot have empty domain"
        assert server.ask("gateway", descriptor(("user", "cy"))).statuses[0].current_limit.requests_per_unit == 5
        v = management.push()
        assert answer(v).version_info == v
        r = server.ask("gateway", descriptor(("user", "dee")))
        assert r.overall_code == OK and not r.statuses[0].HasField("current_limit")
        loads = {line.split()[0]: float(line.split()[1]) for line in server.metrics().splitlines()
                 if line.startswith("ratelimit_service_config_load_")}
        assert loads["ratelimit_service_config_load_success"] >= 3 and loads["ratelimit_service_config_load_error"] == 1
    finally:
        server.stop()
        grpc_server.stop(0)


# --- a slow or stopped database ------------------------------------------------------------

def health(server):
    stub = health_pb2_grpc.HealthStub(server.channel)
    return {name: health_pb2.HealthCheckResponse.ServingStatus.Name(
        stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status) for name in HEALTH_NAMES}


def wait_for_health(server, status, seconds):
    deadline = time.time() + seconds
    while set(health(server).values()) != {status}:
        assert time.time() < deadline, health(server)
        time.sleep(0.2)


def healthcheck(server):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/healthcheck", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_locked_table_is_met_within_the_statement_timeout(db, tmp_path):
    """With one table locked, a call waits no longer than the statement timeout: the domain's
    on_database_error answers (open: OK, closed: OVER_LIMIT, envoy_decides: UNAVAILABLE),
    the abandoned statements are cancelled on the server (none left waiting), and calls
    decide again once the lock is gone."""
    if db.engine == "sqlite":
        pytest.skip("PostgreSQL's case: the SQLite file is the server's own")
    import psycopg

    server = examples_server(db, tmp_path, "open.yaml", "closed.yaml", "envoy_decides.yaml",
                             env={"RLS_STATEMENT_TIMEOUT_MS": "300"})
    locker = psycopg.connect(dbname=db.name)
    try:
        locker.execute("LOCK TABLE ratelimit.rl_budget IN ACCESS EXCLUSIVE MODE")
        # under 6 s: the 300 ms timeout with room for a busy machine, and short of the
        # 10 s the call would wait without it
        for domain, want in (("open", OK), ("closed", OVER)):
            started = time.monotonic()
            r = server.ask(domain, descriptor(("k", "v")), timeout=10)
            assert r.overall_code == want and time.monotonic() - started < 6, domain
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            server.ask("envoy_decides", descriptor(("k", "v")), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "statement timeout" in e.value.details()
        assert time.monotonic() - started < 6
        # Envoy gives up first (its own short timeout): the statement is cancelled too
        with pytest.raises(grpc.RpcError):
            server.ask("envoy_decides", descriptor(("k", "w")), timeout=0.05)
        deadline = time.time() + 30
        while True:
            with psycopg.connect(dbname="postgres", autocommit=True) as c:
                waiting = c.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
                                    (db.name,)).fetchone()[0]
            if waiting == 0:
                break
            assert time.time() < deadline, f"{waiting} statements still wait for the lock"
            time.sleep(0.1)
    finally:
        locker.rollback()
        locker.close()
    try:
        r = server.ask("envoy_decides", descriptor(("k", "v")))
        assert r.overall_code == OK
    finally:
        server.stop()


def test_health_says_not_serving_while_the_database_is_down(db, tmp_path):
    if db.engine == "sqlite":
        pytest.skip("PostgreSQL's case")
    if not (os.environ.get("RL_PG_DIR") and os.environ.get("RL_PG_BIN")):
        pytest.skip("needs RL_PG_DIR and RL_PG_BIN to stop and start the cluster")
    server = examples_server(db, tmp_path, "open.yaml")
    try:
        assert set(health(server).values()) == {"SERVING"} and healthcheck(server) == 200
        stop_postgres()
        try:
            wait_for_health(server, "NOT_SERVING", 15)
            assert healthcheck(server) == 503
        finally:
            start_postgres()
        wait_for_health(server, "SERVING", 30)
        assert healthcheck(server) == 200
    finally:
        server.stop()


def test_version():
    from test_rls import BINARY
    done = subprocess.run([BINARY, "--version"], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0 and done.stdout.startswith("ratelimit-rls 0.")
