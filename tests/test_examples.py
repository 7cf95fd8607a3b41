"""The example HTTP service, on each engine, driven past its limit by a real HTTP client."""
import contextlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import ROOT, SQLITE_EXT, pg_database

SERVICE = os.path.join(ROOT, "examples", "service.py")
# the service runs on the web package (integrations/python), in scripts/setup.sh --pg's venv
WEB_PYTHON = os.environ.get("RL_WEB_PYTHON", "/opt/pg_ratelimit/web-venv/bin/python")


def web_python():
    ready = os.path.exists(WEB_PYTHON) and subprocess.run(
        [WEB_PYTHON, "-c", "import ratelimit_web, uvicorn"], capture_output=True).returncode == 0
    if not ready:
        if os.environ.get("RL_REQUIRE_PG") == "1":
            pytest.fail(f"{WEB_PYTHON} cannot import ratelimit_web and uvicorn (scripts/test.sh installs them)")
        pytest.skip("no venv with ratelimit_web and uvicorn (scripts/setup.sh --pg, then pip install ./integrations/python)")
    return WEB_PYTHON


def get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.headers, json.loads(r.read())  # names case-insensitive
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read())


def start_service(engine):
    # a generous check timeout: a slow moment of a shared test machine must not read as an outage
    proc = subprocess.Popen([web_python(), SERVICE, *engine, "--port", "0", "--check-timeout", "2",
                             "--burst", "3", "--per-minute", "0.001", "--daily", "4",
                             "--user", "alice:secret:free", "--user", "pat:pw:pro", "--user", "bob:b:free",
                             "--user", "carol:c:free"],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("listening on http://127.0.0.1:"), "the service did not start"
    return proc, int(line.rsplit(":", 1)[1])


@pytest.fixture(params=["sqlite", "postgres"])
def service(request, tmp_path):
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            engine = ["--sqlite", str(tmp_path / "app.db"), "--extension", SQLITE_EXT]
        else:
            engine = ["--postgres", f"dbname={stack.enter_context(pg_database('rl_example'))}"]
        proc, port = start_service(engine)
        stack.callback(proc.wait, timeout=10)
        stack.callback(proc.terminate)
        yield port


def test_service_limits_refunds_and_exempts_health(service):
    port = service
    status, headers, body = get(port, "/work?user=alice&password=secret")
    assert status == 200 and body["ok"] is True
    # w: 3 tokens at 0.001 a minute take 180,000 s to refill; the budget's period is a day
    assert headers["RateLimit-Policy"] == '"bucket-1";q=3;w=180000, "budget-2";q=4;w=86400'
    assert headers["X-RateLimit-Remaining"] == "2"
    # a failing handler gives the bucket token and the budget back
    status, _, body = get(port, "/work?user=alice&password=secret&fail=1")
    assert status == 500
    assert [get(port, "/work?user=alice&password=secret")[0] for _ in range(2)] == [200, 200]
    status, headers, body = get(port, "/work?user=alice&password=secret")
    assert status == 429
    assert body["detail"] == "Too Many Requests" and body["retry_after"] >= 1
    assert headers["Retry-After"] == str(body["retry_after"])
    assert int(headers["Retry-After"]) > 0
    assert headers["X-RateLimit-Remaining"] == "0"
    assert "RateLimit" in headers
    # the health endpoint is never limited, and another user has limits of their own
    assert all(get(port, "/health")[0] == 200 for _ in range(10))
    assert get(port, "/work?user=bob&password=b")[0] == 200
    # a cost no wait can admit: 413 without Retry-After, and nothing charged
    status, headers, body = get(port, "/work?user=carol&password=c&cost=5")
    assert (status, body["detail"], body["retry_after"]) == (413, "Cost Above Limit", None)
    assert "Retry-After" not in headers
    status, headers, _ = get(port, "/work?user=carol&password=c&cost=2")
    assert (status, headers["X-RateLimit-Remaining"]) == (200, "1")
    # a name without its password proves nothing: whatever names they claim, such requests
    # share their address's bucket
    assert [get(port, f"/work?user=nobody{i}")[0] for i in range(4)] == [200, 200, 200, 429]


def test_service_applies_policies_tiers_and_penalties(service):
    port = service
    # the tier comes from the user's row: pro has five times the webhook limits
    assert get(port, "/webhooks?user=alice&password=secret")[1]["RateLimit-Policy"] == '"webhooks-bucket";q=200;w=60'
    status, headers, body = get(port, "/webhooks?user=pat&password=pw")
    assert (status, body["tier"], headers["RateLimit-Policy"]) == (200, "pro", '"webhooks-bucket";q=1000;w=60')
    # wrong passwords: three free strikes, the fourth blocks, and the block refuses at once
    assert get(port, "/login?user=alice&password=secret")[0] == 200
    strikes = [get(port, "/login?user=alice&password=nope")[2]["strikes"] for _ in range(4)]
    assert strikes == [1, 2, 3, 4]
    status, headers, body = get(port, "/login?user=alice&password=secret")
    assert (status, body["detail"]) == (429, "Blocked")
    assert 115 <= int(headers["Retry-After"]) <= 120
    # the block is the subject's, for every policy; other users are untouched
    assert get(port, "/webhooks?user=alice&password=secret")[2]["detail"] == "Blocked"
    assert get(port, "/login?user=pat&password=pw")[0] == 200
    # the strict login policy: 5 at once, then 429 with the time until a token is back
    codes = [get(port, "/login?user=pat&password=pw")[0] for _ in range(5)]
    assert codes == [200, 200, 200, 200, 429]
