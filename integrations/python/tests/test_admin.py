"""The operator's page (ratelimit_web.admin) on SQLite and PostgreSQL: served by uvicorn
(ASGI), wsgiref (WSGI), Django's view and the Node package's Express middleware, the
ASGI, Django (a project of its own, with Django's CSRF middleware) and Express forms
loaded in headless Chromium (Debian's chromium,
driven over the DevTools protocol): the page shows the policies, the subjects refused most
and the blocks, an unblock button lifts a block, the screenshot is kept, an unauthorised
request gets 403, and the application's own role (not in rl_admin) cannot unblock.
RL_BLESS=1 saves the PostgreSQL run's screenshot as docs/monitoring/admin-page.png."""
import base64
import json
import os
import shutil
import socket
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import httpx
import pytest

from ratelimit_web.admin import AdminView
from test_middleware import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
EXTENSION = os.environ.get("RATELIMIT_SQLITE_EXTENSION", os.path.join(ROOT, "target", "release", "libratelimit"))
SCREENSHOT = os.path.join(ROOT, "docs", "monitoring", "admin-page.png")
POLICY = '{"limits": [{"burst": 2, "refill_per_minute": 0.001}]}'
# a policy of every kind of limit, which the page reads as the core's table of kinds says
EVERY_KIND = ('{"limits": [{"burst": 5, "refill_per_minute": 60}, {"period": "month from 15", "quota": 1000}, '
              '{"limit": 100, "window_seconds": 60}, {"limit": 10, "fixed_window_seconds": 1}]}')
EVERY_KIND_ROW = ["every kind", "5 burst, 60/min; 1000 per month from 15; 100 per 60 s; 10 per fixed 1 s", "0", "0", "0", "0"]
ENGINES = ["sqlite"] + (["postgres"] if os.environ.get("PGHOST") else [])
TOKEN = "ops=let-me-in"


def authorized(request):
    return TOKEN in request.headers.get("cookie", "")


class App:
    """The application's database with some refusals and blocks, and the database URL an
    administrator's page uses (PostgreSQL: a role in rl_admin; `app_url`: the application's
    role, which is not)."""

    def __init__(self, engine, tmp_path):
        self.engine = engine
        if engine == "sqlite":
            self.url = self.app_url = str(tmp_path / "app.db")
            conn = sqlite3.connect(self.url, isolation_level=None)
            conn.enable_load_extension(True)
            conn.load_extension(EXTENSION)
            run = lambda sql, *a: conn.execute(sql, a).fetchall()  # noqa: E731
        else:
            import psycopg

            name = "rl_admin_" + tmp_path.name.replace("-", "_").lower()[-30:]
            self.ops, self.app = f"ops_{name}", f"app_{name}"
            with psycopg.connect(dbname="postgres", autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {name}")
                admin.execute(f"CREATE DATABASE {name}")
                for role in (self.ops, self.app):
                    admin.execute(f"DROP ROLE IF EXISTS {role}")
                admin.execute(f"CREATE ROLE {self.ops} LOGIN IN ROLE rl_admin")
                admin.execute(f"CREATE ROLE {self.app} LOGIN")
            self.name = name
            conn = psycopg.connect(f"dbname={name}", autocommit=True)
            conn.execute("CREATE EXTENSION pg_ratelimit")
            self.url, self.app_url = f"dbname={name} user={self.ops}", f"dbname={name} user={self.app}"
            run = lambda sql, *a: conn.execute(sql.replace("?", "%s"), a).fetchall()  # noqa: E731
        self.run = run
        run("SELECT rl_policy_set('login', ?)", POLICY)
        run("SELECT rl_policy_set('every kind', ?)", EVERY_KIND)
        run("SELECT rl_stats_reset()")
        # the page's process counts what it sees: on SQLite and without preload that is
        # this process's own checks, which these are
        for subject, calls in (("ip:203.0.113.9", 6), ("ip:198.51.100.7", 3)):
            for _ in range(calls):
                run("SELECT rl_check('login', ?)", subject)
        # a route with explicit limits (no policy), checked as the middleware checks it
        # (rl_check_limits): its refusals show beside the policies'
        from ratelimit_web import Route, SyncPostgresLimiter, SyncSQLiteLimiter

        limiter = (SyncSQLiteLimiter(self.url, extension=EXTENSION) if engine == "sqlite"
                   else SyncPostgresLimiter(self.app_url, min_size=1, max_size=1, timeout=10))
        route = Route(name="POST /ai", limits=[{"burst": 2, "refill_per_minute": 0.001}])
        assert [limiter.check(route, "user:bob", None, 1).admitted for _ in range(3)] == [True, True, False]
        if engine != "sqlite":
            limiter.close()
        run("SELECT rl_block('ip:192.0.2.66', NULL)")
        run("SELECT rl_block('user:mallory', 3600)")
        run("SELECT rl_spend('team:7', 'month', 100, 93)")  # near its quota
        run("SELECT rl_spend('team:8', 'month', 100, 20)")  # not

    def blocked(self):
        return sorted(r[0] for r in self.run("SELECT subject FROM rl_blocks"))


@pytest.fixture(params=ENGINES)
def app(request, tmp_path):
    return App(request.param, tmp_path)


def serve_asgi(admin):
    """The page mounted at /ratelimit of a Starlette app under uvicorn, in a thread."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    site = Starlette(routes=[Route("/", lambda r: PlainTextResponse("the application")),
                             Mount("/ratelimit", app=admin.asgi)])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(site, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(600):
        if server.started:
            break
        time.sleep(0.05)
    else:
        pytest.fail("uvicorn did not start in 30 s")
    return server, thread, f"http://127.0.0.1:{port}/ratelimit/"


class Browser:
    """Headless Chromium over the DevTools protocol (its WebSocket, spoken with the
    standard library)."""

    def __init__(self):
        chromium = shutil.which("chromium")
        if not chromium:
            pytest.fail("chromium missing (scripts/setup.sh --pg installs Debian's)")
        self.profile = tempfile.mkdtemp(prefix="rl_chromium_")
        self.proc = subprocess.Popen([chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
                                      "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
                                      "--window-size=1280,1000", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        for _ in range(600):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            time.sleep(0.05)
        port = int(open(port_file).read().split()[0])
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        url = next(p for p in pages if p["type"] == "page")["webSocketDebuggerUrl"]
        host_port, path = url[len("ws://"):].split("/", 1)
        self.sock = socket.create_connection(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {host_port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        response = b""
        while b"\r\n\r\n" not in response:
            response += self.sock.recv(4096)
        assert b" 101 " in response.split(b"\r\n")[0], response
        self.buffer = response.split(b"\r\n\r\n", 1)[1]
        self.next_id = 0

    def _read(self, n):
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("chromium closed the DevTools connection")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def _message(self):
        data = b""
        while True:
            first, second = self._read(2)
            length = second & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._read(8))[0]
            data += self._read(length)
            if first & 0x80:
                return json.loads(data)

    def call(self, method, **params):
        self.next_id += 1
        payload = json.dumps({"id": self.next_id, "method": method, "params": params}).encode()
        mask = os.urandom(4)
        header = bytes([0x81]) + (bytes([0x80 | len(payload)]) if len(payload) < 126
                                  else bytes([0x80 | 126]) + struct.pack(">H", len(payload)) if len(payload) < 65536
                                  else bytes([0x80 | 127]) + struct.pack(">Q", len(payload)))
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
        while True:
            message = self._message()
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def js(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression, seconds=15):
        for _ in range(int(seconds * 10)):
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"the page never made {expression} true; it shows:\n{self.js('document.body.innerText')}")

    def close(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


NODE_SERVER = r"""
// node -e: process.argv[1] is the first argument after the script
const [, pkg, database, extension] = process.argv;
const express = require(pkg + "/node_modules/express");
const { AdminView } = require(pkg);
const admin = new AdminView({ database, extension, sampleSeconds: 0.5,
                              authorize: (r) => (r.headers.cookie || "").includes("ops=let-me-in") });
const site = express();
site.use("/ratelimit", admin.express);
// the Fetch API form too, on a port of its own (node:http to a Request and back)
const http = require("http");
const fetchServer = http.createServer(async (req, res) => {
  const headers = new Headers();
  for (const [name, value] of Object.entries(req.headers)) headers.set(name, [].concat(value).join(", "));
  const body = ["GET", "HEAD"].includes(req.method) ? undefined : require("stream").Readable.toWeb(req);
  const response = await admin.fetch(new Request(`http://${req.headers.host}${req.url}`,
                                                 { method: req.method, headers, body, duplex: "half" }), "/ratelimit");
  res.writeHead(response.status, Object.fromEntries(response.headers));
  res.end(Buffer.from(await response.arrayBuffer()));
});
const server = site.listen(0, "127.0.0.1", () =>
  fetchServer.listen(0, "127.0.0.1", () => console.log(server.address().port, fetchServer.address().port)));
"""


def serve_node(app):
    """The same page from the Node package (AdminView.express), in a node process."""
    package = os.path.join(ROOT, "integrations", "node")
    if not os.path.exists(os.path.join(package, "dist", "admin.js")):
        pytest.fail("integrations/node is not built (bash scripts/package.sh --sqlite builds it)")
    proc = subprocess.Popen(["node", "-e", NODE_SERVER, package, app.url, EXTENSION], stdout=subprocess.PIPE, text=True)
    express_port, fetch_port = proc.stdout.readline().split()
    proc.fetch_url = f"http://127.0.0.1:{fetch_port}/ratelimit/"
    return proc, f"http://127.0.0.1:{express_port}/ratelimit/"


def serve_django(app):
    """The same page as a Django view in a project of its own (django_admin_site.py: Django's
    WSGI handler with the CSRF and security middleware), in its own process."""
    proc = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "django_admin_site.py"), app.url,
                             EXTENSION], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}/ratelimit/"


@pytest.mark.parametrize("served_by", ["python", "node", "django"])
def test_the_page_in_chromium_lists_refusals_and_unblocks(app, served_by):
    if served_by == "python":
        admin = AdminView(app.url, extension=EXTENSION, authorize=authorized, sample_seconds=0.5)
        server, thread, url = serve_asgi(admin)
    elif served_by == "node":
        node, url = serve_node(app)
    else:
        node, url = serve_django(app)
    # SQLite counts per process: a page in another process (node, django) sees none of this one's checks
    counted = not (app.engine == "sqlite" and served_by != "python")
    browser = Browser()
    try:
        browser.call("Network.enable")
        browser.call("Network.setCookie", name="ops", value="let-me-in", url=url)
        browser.call("Page.navigate", url=url)
        browser.wait_for("document.body && document.body.dataset.loaded === 'yes'")
        text = browser.js("document.body.innerText")
        assert "login" in text and "2 burst" in text
        refused = browser.js("[...document.querySelectorAll('#refused tr')].map(r => r.innerText.split('\\t').slice(0, 4).join(' '))")
        rows = browser.js("[...document.querySelectorAll('#policies tr')].map(r => [...r.cells].map(td => td.innerText))")
        if counted:
            assert refused[:3] == ["login ip:203.0.113.9 4 0", "POST /ai user:bob 1 0", "login ip:198.51.100.7 1 0"]
            assert rows == [["POST /ai", "its own (no policy of this name)", "2", "1", "0", "0"],  # the route
                            EVERY_KIND_ROW,
                            ["login", "2 burst, 0.001/min", "4", "5", "0", "0"]]  # admitted 2 + 2, refused 4 + 1
        else:
            assert refused == ["Nobody refused since the last reset."] and rows == [EVERY_KIND_ROW, ["login", "2 burst, 0.001/min", "0", "0", "0", "0"]]
        # where the counts are not the server's, the page says so and how to change it
        note = browser.js("[document.getElementById('scope-note').hidden, document.getElementById('scope-note').innerText]")
        if app.engine == "postgres":
            assert note == [True, ""], note  # the test cluster preloads pg_ratelimit
        else:
            assert note[0] is False and "SQLite keeps them in each process" in note[1], note
        near = browser.js("[...document.querySelectorAll('#near tr')].map(r => r.innerText.split('\\t').slice(0, 5).join(' '))")
        assert near == ["team:7 month 93 100 93.0 %"], near
        # the chart appears once the page has two samples
        browser.wait_for("document.querySelector('#chart svg') !== null")
        # keyboard: the unblock buttons are reachable and named
        labels = browser.js("[...document.querySelectorAll('#blocks button')].map(b => b.getAttribute('aria-label'))")
        assert labels == ["Unblock ip:192.0.2.66", "Unblock user:mallory"]
        shot = base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
        assert shot.startswith(b"\x89PNG") and len(shot) > 20_000, "a screenshot of the drawn page"
        if app.engine == "postgres" and served_by == "python" and os.environ.get("RL_BLESS") == "1":
            with open(SCREENSHOT, "wb") as f:  # the picture docs/monitoring/README.md shows
                f.write(shot)
        browser.js("document.querySelector('#blocks button[data-subject=\"ip:192.0.2.66\"]').focus()")
        browser.js("document.activeElement.click()")
        browser.wait_for("document.getElementById('status').innerText.includes('Unblocked ip:192.0.2.66')")
        browser.wait_for("document.querySelectorAll('#blocks button').length === 1")
        assert app.blocked() == ["user:mallory"]
        # without the cookie: 403, and the page is not served
        browser.call("Network.clearBrowserCookies")
        browser.call("Page.navigate", url=url)
        browser.wait_for("document.body && document.body.innerText.includes('forbidden')")
    finally:
        browser.close()
        if served_by == "python":
            server.should_exit = True
            thread.join(timeout=10)
            admin.close()
        else:
            node.kill()
            node.wait()


def test_unauthorised_requests_get_403_and_the_applications_role_cannot_unblock(app):
    admin = AdminView(app.url, extension=EXTENSION, authorize=authorized)
    server, thread, url = serve_asgi(admin)
    try:
        with httpx.Client() as client:
            for method, path in (("GET", ""), ("GET", "state"), ("POST", "unblock")):
                answer = client.request(method, url + path, json={"subject": "user:mallory"})
                assert answer.status_code == 403 and answer.json() == {"error": "forbidden"}
            ok = {"Cookie": TOKEN}
            assert client.get(url + "state", headers=ok).json()["blocks"][0]["subject"] == "ip:192.0.2.66"
            # a form post (what another site could make a browser send) is refused
            form = client.post(url + "unblock", headers=ok, data={"subject": "user:mallory"})
            assert form.status_code == 415 and app.blocked() == ["ip:192.0.2.66", "user:mallory"]
        if app.engine == "postgres":
            # the page configured with the application's own role: rl_admin's views and
            # rl_unblock are not its to use
            as_app = AdminView(app.app_url, authorize=lambda r: True)
            status, _, body = as_app.handle(_request("POST", "unblock"), b'{"subject": "user:mallory"}')
            assert status == 403 and "permission denied" in json.loads(body)["error"]
            assert as_app.handle(_request("GET", "state"))[0] == 403
            assert app.blocked() == ["ip:192.0.2.66", "user:mallory"]
            as_app.close()
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        admin.close()


def _request(method, path):
    from ratelimit_web.admin import AdminRequest

    return AdminRequest(method, path, {"content-type": "application/json"})


def test_the_wsgi_and_django_forms_of_the_page(app):
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    admin = AdminView(app.url, extension=EXTENSION, authorize=authorized)

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    httpd = make_server("127.0.0.1", 0, admin.wsgi, handler_class=Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{httpd.server_port}/"
    try:
        with httpx.Client() as client:
            assert client.get(url + "state").status_code == 403
            assert "<title>Rate limits" in client.get(url, headers={"Cookie": TOKEN}).text
            answer = client.post(url + "unblock", headers={"Cookie": TOKEN}, json={"subject": "user:mallory"})
            assert answer.json() == {"subject": "user:mallory", "unblocked": True}
    finally:
        httpd.shutdown()
    assert app.blocked() == ["ip:192.0.2.66"]

    # Django's view, called as Django calls it (RequestFactory: the view alone; the site's
    # own settings when test_django.py configured them first)
    from django.conf import settings

    if not settings.configured:
        settings.configure(ALLOWED_HOSTS=["testserver"], SECRET_KEY="test", DATABASES={}, INSTALLED_APPS=[])
        import django

        django.setup()
    from django.test import RequestFactory

    from ratelimit_web.admin import django_view

    view, factory = django_view(admin), RequestFactory()
    assert view(factory.get("/ratelimit/state"), "state").status_code == 403
    answer = view(factory.get("/ratelimit/state", HTTP_COOKIE=TOKEN), "state")
    assert [p["name"] for p in json.loads(answer.content)["policies"]] == ["POST /ai", "every kind", "login"]
    answer = view(factory.post("/ratelimit/unblock", data=json.dumps({"subject": "ip:192.0.2.66"}),
                               content_type="application/json", HTTP_COOKIE=TOKEN), "unblock")
    assert json.loads(answer.content) == {"subject": "ip:192.0.2.66", "unblocked": True}
    assert app.blocked() == []
    admin.close()


# -- a hostile client: bodies are refused before they are read, bounded, and checked -----

def serve_wsgi(admin):
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    httpd = make_server("127.0.0.1", 0, admin.wsgi, handler_class=Quiet)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_port}/"


def raw_post(url, headers, body, then_wait=5.0):
    """Sends a POST's head and the first part of its body, then reads the answer's status
    line without sending the rest: (status, seconds until it came), or (None, ...) when no
    answer came while the server waited for a body it had not been sent."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    path = "/" + url.split("//")[1].split("/", 1)[1] + "unblock"
    head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=then_wait) as sock:
        sock.sendall(head.encode() + body)
        try:
            first = sock.recv(64)
        except socket.timeout:
            return None, time.monotonic() - started
    line = first.split(b"\r\n", 1)[0].decode()
    return (int(line.split()[1]) if line.startswith("HTTP/") else None), time.monotonic() - started


@pytest.mark.parametrize("served_by", ["asgi", "wsgi", "django", "express", "fetch"])
def test_bodies_are_refused_unread_bounded_and_checked(app, served_by):
    """An unauthorised POST is answered 403 from its head alone; an authorised one that
    declares more than MAX_BODY_BYTES is answered 413 unread, one that sends more is cut off
    at the bound; a malformed body is a 400 that says why, never a 500."""
    from ratelimit_web.admin import MAX_BODY_BYTES

    admin = server = None
    if served_by == "asgi":
        admin = AdminView(app.url, extension=EXTENSION, authorize=authorized)
        server, thread, url = serve_asgi(admin)
    elif served_by == "wsgi":
        admin = AdminView(app.url, extension=EXTENSION, authorize=authorized)
        httpd, url = serve_wsgi(admin)
    elif served_by == "django":
        proc, url = serve_django(app)
    else:
        proc, url = serve_node(app)
        url = proc.fetch_url if served_by == "fetch" else url
    huge = {"Content-Length": str(48 * 1024 * 1024)}
    try:
        # 48 MB declared, 1 KB sent: the answer comes from the head
        status, took = raw_post(url, huge, b"x" * 1024)
        assert status == 403 and took < 3, (status, took)
        status, took = raw_post(url, {**huge, "Cookie": TOKEN}, b"x" * 1024)
        assert status == 413 and took < 3, (status, took)
        with httpx.Client(timeout=10) as client:
            ok = {"Cookie": TOKEN, "Content-Type": "application/json"}
            # a body past the bound, without Content-Length (chunked), where the server takes one
            if served_by in ("asgi", "express", "fetch"):
                chunks = (b"[" + b" " * 1024 for _ in range(4096))  # 4 MB, sent in pieces
                answer = client.post(url + "unblock", headers=ok, content=chunks)
                assert answer.status_code == 413, answer.text
            answer = client.post(url + "unblock", headers=ok, content=b'{"subject": "' + b"a" * MAX_BODY_BYTES + b'"}')
            assert answer.status_code == 413
            for body, why in ((b"{", "not JSON"), (b"[]", "JSON object"), (b'"ip:1"', "JSON object"),
                              (b"\xff\xfe{}", "not UTF-8"), (b'{"subject": 5}', "non-empty string"),
                              (b"", "JSON object"), (b'{"subject": ""}', "non-empty string")):
                answer = client.post(url + "unblock", headers=ok, content=body)
                assert answer.status_code == 400, (body, answer.status_code, answer.text)
                assert why in answer.json()["error"], (body, answer.json())
            answer = client.post(url + "unblock", headers=ok, content=b'{"subject": "user:mallory"}')
            assert answer.json() == {"subject": "user:mallory", "unblocked": True}
    finally:
        if served_by == "asgi":
            server.should_exit = True
            thread.join(timeout=10)
        elif served_by == "wsgi":
            httpd.shutdown()
        else:
            proc.kill()
            proc.wait()
        if admin is not None:
            admin.close()


def test_the_blocks_list_is_capped_and_says_how_many_there_are(app):
    for i in range(130):
        app.run("SELECT rl_block(?, 3600)", f"ip:10.0.{i // 256}.{i % 256}")
    admin = AdminView(app.url, extension=EXTENSION, authorize=lambda r: True)
    try:
        state = json.loads(admin.handle(_request("GET", "state"))[2])
        assert len(state["blocks"]) == 100 and state["blocks_total"] == 132
        assert [b["subject"] for b in state["blocks"]] == sorted(b["subject"] for b in state["blocks"])
        few = AdminView(app.url, extension=EXTENSION, authorize=lambda r: True, blocks=5)
        state = json.loads(few.handle(_request("GET", "state"))[2])
        assert len(state["blocks"]) == 5 and state["blocks_total"] == 132
        few.close()
    finally:
        admin.close()


def test_header_token_fails_closed():
    from ratelimit_web.admin import AdminRequest, header_token

    for missing in (None, ""):
        with pytest.raises(ValueError, match="missing or empty"):
            header_token("x-ops-token", missing)
    check = header_token("X-Ops-Token", "s3cret")
    assert check(AdminRequest("GET", "", {"x-ops-token": "s3cret"})) is True
    for given in ({}, {"x-ops-token": ""}, {"x-ops-token": "s3cre"}, {"x-ops-token": "s3cret "}):
        assert check(AdminRequest("GET", "", given)) is False
    # the module's documented example, as written: it names header_token and fails closed
    import ratelimit_web.admin as module

    assert 'authorize=header_token("x-ops-token", os.environ["RATELIMIT_OPS_TOKEN"])' in module.__doc__
