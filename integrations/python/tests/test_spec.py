"""The behaviour spec every web package shares (integrations/spec/cases.json): its rule
cases against ratelimit_web.rules, and its HTTP cases through raw sockets against every
framework's server of the test application (ASGI under uvicorn, Flask and Django under
gunicorn, Django under uvicorn, Rack and Rails under puma), on SQLite and PostgreSQL. The
Node package's suite runs the same file (integrations/node/test/spec.test.js)."""
import json
import os
import socket

import pytest

from ratelimit_web.rules import (RateLimitRules, Route, _networks, client_address, database_of, normalize_identifier,
                                 normalize_path, refund_rule)
from routes import SPEC, token
from test_middleware import HERE, Server, db  # noqa: F401 (db: the fixture)

CASES = json.load(open(os.path.join(HERE, "..", "..", "spec", "cases.json")))
TRUSTED = _networks(SPEC["options"]["trusted_proxies"])


@pytest.mark.parametrize("case", CASES["address"], ids=lambda c: f"{c['peer']} {c['forwarded']}")
def test_client_addresses(case):
    assert client_address(case["peer"], case["forwarded"], TRUSTED, case.get("ipv6_prefix", 56)) == case["expect"]


@pytest.mark.parametrize("case", CASES["path"], ids=lambda c: repr(c["path"]))
def test_paths_as_routers_dispatch_them(case):
    got = normalize_path(case["path"], case_insensitive=case.get("case_insensitive", False),
                         formats=case.get("formats", False))
    assert got == case["expect"]


@pytest.mark.parametrize("case", CASES["match"], ids=lambda c: f"{c['method']} {c['path']}")
def test_route_matching(case):
    rules = RateLimitRules({r: Route(limits=[{"burst": 1, "refill_per_minute": 1}]) for r in case["routes"]},
                           skip=case.get("skip", ()), case_insensitive_paths=case.get("case_insensitive", False),
                           path_formats=case.get("formats", False))
    route = rules.match(case["method"], case["path"])
    assert (route.name if route else None) == case["expect"]


@pytest.mark.parametrize("case", CASES["identifier"], ids=lambda c: f"{c['input']!r:.20}x{c.get('repeat', 1)}")
def test_identifiers(case):
    value = case["input"] * case["repeat"] if "repeat" in case else case["input"]
    got = normalize_identifier(value, case_insensitive=case.get("case_insensitive", False))
    if "expect_length" in case:
        assert len(got) == case["expect_length"] and got.startswith(case["expect_prefix"])
    else:
        assert got == case["expect"]


@pytest.mark.parametrize("case", CASES["refund"], ids=lambda c: f"{c['refund_on']} {c['status']}")
def test_refunds(case):
    rules = RateLimitRules({"/r": Route(limits=[{"burst": 1, "refill_per_minute": 1}], refund_on=case["refund_on"],
                                        sensitive=case.get("sensitive", False))}, refund_on=case.get("middleware"))
    assert rules.refunds(rules.match("GET", "/r"), case["status"]) is case["expect"]
    assert refund_rule(None) is None


@pytest.mark.parametrize("case", CASES["database"], ids=lambda c: repr(c["db"]))
def test_what_a_database_string_names(case):
    exists = lambda path: case.get("file_exists", False) and path == case["db"]  # noqa: E731
    if case["expect"] is None:
        with pytest.raises(ValueError, match="names no database: a PostgreSQL one is postgresql://HOST/NAME or "
                                             "dbname=NAME, a SQLite one an existing file"):
            database_of(case["db"], exists)
    else:
        assert list(database_of(case["db"], exists)) == case["expect"]


@pytest.mark.parametrize("case", CASES["key"], ids=lambda c: f"{c['route']} {c['subject']!r}")
def test_the_keys_of_explicit_limits(case):
    from ratelimit_web.limiter import limit_key

    assert limit_key(case["route"], case["subject"], case["index"]) == case["expect"]


def test_the_keys_of_explicit_limits_are_the_engines_rl_key():
    """What every package writes is what rl_key('web', route, subject, index) answers, so
    an operator finds a route's rows with rl_key (here: the SQLite library)."""
    import sqlite3

    root = os.path.join(HERE, "..", "..", "..")
    conn = sqlite3.connect(":memory:")
    conn.enable_load_extension(True)
    conn.load_extension(os.environ.get("RATELIMIT_SQLITE_EXTENSION", os.path.join(root, "target", "release", "libratelimit")))
    for case in CASES["key"]:
        got = conn.execute("SELECT rl_key('web', ?, ?, ?)", (case["route"], case["subject"], str(case["index"]))).fetchone()
        assert got[0] == case["expect"], case


def test_limits_of_each_request_are_checked_as_the_fixed_ones_are():
    """A route's `limits` function: its answer is what the check, the refund and a charge
    use (the route itself is left as it was); an answer that is no list of limit objects is
    an error that names the route; startup skips what only a request can tell."""
    plans = {"ann": "month from 3 in Europe/Paris", "bob": "month from 20"}
    route = Route(limits=lambda user: [{"period": plans[user], "quota": 3}], name="/bill")
    assert route.for_request("ann").limits == [{"period": "month from 3 in Europe/Paris", "quota": 3}]
    assert route.for_request("bob").limits[0]["period"] == "month from 20" and callable(route.limits)
    fixed = Route(limits=[{"burst": 1, "refill_per_minute": 1}])
    assert fixed.for_request("ann") is fixed
    for wrong in ([], {"period": "month"}, ["month"], None):
        with pytest.raises(ValueError, match=r"^Route '/bill': limits\(request\): limits must be a list of limit objects"):
            Route(limits=lambda _: wrong, name="/bill").for_request("ann")
    with pytest.raises(ValueError, match=r"^Route: limits must be a list of limit objects"):
        Route(limits="month")
    rules = RateLimitRules({"/bill": route, "/fixed": fixed})
    assert [(kind, r.name) for kind, r in rules.startup_questions()] == [("limits", "/fixed")]


def test_the_spec_files_follow_their_schemas():
    """cases.json and app.json against cases.schema.json and app.schema.json, which refuse
    unknown fields: a misspelt field in a case is an error, not a check silently skipped."""
    import jsonschema

    from referencing import Registry, Resource

    spec = os.path.join(HERE, "..", "..", "spec")
    # app.schema.json's limits are limit.schema.json's, generated from the core's kinds
    with open(os.path.join(spec, "limit.schema.json")) as f:
        limit = json.load(f)
    jsonschema.Draft202012Validator.check_schema(limit)
    registry = Registry().with_resource("limit.schema.json", Resource.from_contents(limit))
    for name in ("cases", "app"):
        with open(os.path.join(spec, f"{name}.schema.json")) as f:
            schema = json.load(f)
        jsonschema.Draft202012Validator.check_schema(schema)
        with open(os.path.join(spec, f"{name}.json")) as f:
            jsonschema.Draft202012Validator(schema, registry=registry).validate(json.load(f))
    app = jsonschema.Draft202012Validator(json.load(open(os.path.join(spec, "app.schema.json"))), registry=registry)
    with open(os.path.join(spec, "app.json")) as f:
        bad = json.load(f)
    next(iter(bad["policies"].values()))["limits"][0]["fixed_window_secs"] = 1
    assert not app.is_valid(bad), "a limit with a field no kind has"
    for each_kind in ({"burst": 1, "refill_per_minute": 1}, {"period": "day", "quota": 1},
                      {"limit": 1, "window_seconds": 1}, {"limit": 1, "fixed_window_seconds": 1}):
        next(iter(bad["policies"].values()))["limits"] = [each_kind]
        assert app.is_valid(bad), each_kind
    with open(os.path.join(spec, "cases.schema.json")) as f:
        validator = jsonschema.Draft202012Validator(json.load(f))
    misspelt = json.loads(json.dumps(CASES))
    misspelt["http"][0]["steps"][0]["statsus"] = [200]
    assert not validator.is_valid(misspelt)


def test_unknown_policy_codes_are_the_specs():
    from ratelimit_web.limiter import UNKNOWN_POLICY_PREFIXES, UNKNOWN_POLICY_SQLSTATE

    assert UNKNOWN_POLICY_SQLSTATE == CASES["unknown_policy"]["sqlstate"]
    assert list(UNKNOWN_POLICY_PREFIXES) == CASES["unknown_policy"]["sqlite_prefixes"]


def test_the_ruby_rules_follow_the_spec_too():
    """The Ruby gem's rules against the same cases (integrations/ruby/test/spec_test.rb)."""
    import shutil
    import subprocess

    if not shutil.which("ruby"):
        from test_middleware import need_puma
        need_puma()
    ruby = os.path.join(HERE, "..", "..", "ruby")
    out = subprocess.run(["ruby", "-I", os.path.join(ruby, "lib"), os.path.join(ruby, "test", "spec_test.rb")],
                         capture_output=True, text=True)
    assert out.returncode == 0 and " 0 failures, 0 errors" in out.stdout, out.stdout + out.stderr


# -- HTTP, through raw sockets ---------------------------------------------------------

def exchange(port, method, target, headers, source="127.0.0.1"):
    """One request exactly as written (no client normalizes its path), on a connection of
    its own: (status, headers with lower-case names, body)."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if method in ("POST", "PUT", "PATCH"):
        lines.append("Content-Length: 0")
    with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0)) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("utf-8"))
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    got = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        got[name.strip().lower()] = value.strip()
    if got.get("transfer-encoding") == "chunked":
        body = dechunk(body)
    return int(status_line.split()[1]), got, body


def dechunk(body):
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2:]
    return out


def request_of(step):
    headers = dict(step.get("send", {}))
    if "as" in step:
        headers["Authorization"] = "Bearer " + token(step["as"], step.get("plan"))
    if "as_long" in step:
        headers["Authorization"] = "Bearer " + token("u" * step["as_long"])
    target = step["path"] + (f"?{step['query']}" if step.get("query") else "")
    source = SPEC["trusted_proxy_address"] if step.get("via") == "proxy" else "127.0.0.1"
    return step.get("method", "GET"), target, headers, source


def run_case(port, case):
    """Runs one HTTP case's steps in order; fails naming the step that did otherwise."""
    runs_before = json.loads(exchange(port, "GET", "/runs", {})[2])
    for n, step in enumerate(case["steps"], 1):
        where = f"{case['name']}: step {n} {step}"
        if "runs" in step:
            after = json.loads(exchange(port, "GET", "/runs", {})[2])
            ran = after.get(step["runs"], 0) - runs_before.get(step["runs"], 0)
            if "expect" in step:
                assert ran == step["expect"], f"{where}: the handler ran {ran} times"
            if "at_most" in step:
                assert ran <= step["at_most"], f"{where}: the handler ran {ran} times"
            continue
        method, target, headers, source = request_of(step)
        statuses = []
        for i in range(step.get("repeat", 1)):
            status, got, body = exchange(port, method, target, headers, source)
            statuses.append(status)
            assert status != 500 or step["path"].startswith(tuple(SPEC["fails_on_purpose"])), f"{where}: 500 {body[:300]!r}"
            if "status" in step:
                assert status == step["status"], f"{where}: answer {i + 1} was {status} {body[:200]!r}"
            if "status_not" in step:
                assert status != step["status_not"], f"{where}: answer {i + 1} was {status}"
            for name, value in step.get("headers", {}).items():
                assert got.get(name.lower()) == value, f"{where}: {name} was {got.get(name.lower())!r}"
            for name in step.get("no_headers", ()):
                assert name.lower() not in got, f"{where}: has {name}: {got[name.lower()]}"
            for name, most in step.get("headers_within", {}).items():
                value = got.get(name.lower(), "")
                assert value.isdigit() and 1 <= int(value) <= most, f"{where}: {name} was {value!r}"
            if "body" in step and method != "HEAD":
                answer = json.loads(body)
                for key, value in step["body"].items():
                    assert answer.get(key) == value, f"{where}: body {answer}"
            if "body_within" in step and method != "HEAD":
                answer = json.loads(body)
                for key, most in step["body_within"].items():
                    assert isinstance(answer.get(key), int) and 1 <= answer[key] <= most, f"{where}: body {answer}"
        if "statuses" in step:
            assert statuses == step["statuses"], f"{where}: answered {statuses}"


FRAMEWORKS = ["asgi", "flask", "django", "django-async", "rack", "rails"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_http_cases(db, framework):
    if framework in ("rack", "rails"):
        from test_middleware import need_puma
        need_puma()
    server = Server(db, timeout=5.0, framework=framework)
    try:
        for case in CASES["http"]:
            run_case(server.port, case)
    finally:
        server.output()
