"""An operator's page: who is being limited right now. Policies with their limits and
counts, a chart of refusals over the last hour, the subjects refused most, the blocks in
force with an unblock button, the budgets near their quota (`near_fraction`, 0.8 by
default) and the memory store's fill, read from the database's own views and functions
(rl_stats, rl_refused, rl_blocks, rl_policies, rl_budgets_near, rl_memory_stats).

It is off until you mount it, and it needs two things of its own:

- `authorize(request) -> bool`: your decision, on an `AdminRequest` (method, path,
  headers, client address, and the framework's own request as `native`); anything but
  True answers 403.
- an administrator's database: a URL or libpq string whose role is a member of rl_admin
  (PostgreSQL), never the application's connection. Without rl_admin the page answers
  403 with the engine's words.

    admin = AdminView("postgresql://ops@db/app", authorize=lambda r: r.headers.get("x-ops") == TOKEN)
    app.mount("/ratelimit", admin.asgi)                    # Starlette, FastAPI
    application = DispatcherMiddleware(app, {"/ratelimit": admin.wsgi})   # Flask, any WSGI
    urlpatterns += [path("ratelimit/", view), path("ratelimit/<path:rest>", view)]  # view = django_view(admin)

The page has no external assets (it works offline), polls every few seconds, and unblocks
by a JSON POST (which a cross-site form cannot send). Its refusal chart is sampled by this
process every `sample_seconds` from its first request, the last hour kept in memory."""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from .cli import Database

Answer = Tuple[int, str, bytes]
HISTORY_SECONDS = 3600


@dataclass
class AdminRequest:
    method: str
    path: str
    headers: Dict[str, str] = field(default_factory=dict)
    client: Optional[str] = None
    native: Any = None


def _json(status: int, value: Any) -> Answer:
    return status, "application/json", json.dumps(value).encode()


class AdminView:
    def __init__(self, database: str, authorize: Callable[[AdminRequest], bool], sample_seconds: float = 10.0,
                 top: int = 20, extension: Optional[str] = None, near_fraction: float = 0.8):
        if not callable(authorize):
            raise TypeError("AdminView needs an authorize(request) callable: the page is never open to everyone")
        self.database, self.authorize, self.sample_seconds, self.top = database, authorize, sample_seconds, top
        self.extension = extension  # SQLite: libratelimit (default: the sqlite-ratelimit package's)
        self.near_fraction = near_fraction  # budgets listed from this share of their quota up
        self._db: Optional[Database] = None
        self._lock = threading.Lock()
        self._history: List[Tuple[float, Dict[str, int]]] = []
        self._sampler: Optional[threading.Thread] = None
        self._closed = threading.Event()

    # -- the database, one connection used under a lock
    def _query(self, f):
        with self._lock:
            if self._db is None:
                self._db = Database(self.database, self.extension)
            try:
                return f(self._db)
            except Exception:
                try:
                    self._db.conn.close()
                finally:
                    self._db = None
                raise

    def state(self) -> Dict[str, Any]:
        def read(db: Database):
            stats = db.value("SELECT rl_policy_stats()")
            definitions = {name: json.loads(d) if isinstance(d, str) else d
                           for name, d in db.rows("SELECT name, definition FROM rl_policies ORDER BY name")}
            refused = [{"policy": p, "subject": s, "refusals": n, "error": e, "last_refused_ms": t}
                       for p, s, n, e, t in db.rows("SELECT policy, subject, refusals, error, last_refused_ms "
                                                     "FROM rl_refused ORDER BY refusals DESC, policy, subject")]
            blocks = [{"subject": s, "strikes": k, "blocked_until_ms": u}
                      for s, k, u in db.rows("SELECT subject, strikes, blocked_until_ms FROM rl_blocks ORDER BY subject")]
            near = db.value("SELECT rl_budgets_near(?, ?)", (self.near_fraction, self.top))
            try:
                memory = db.value("SELECT rl_memory_stats()")
            except Exception:  # noqa: BLE001 - SQLite and the SQL edition have no memory store
                memory = None
            return stats, definitions, refused, blocks, near, memory

        stats, definitions, refused, blocks, near, memory = self._query(read)
        self._sample(stats)
        names = sorted(set(definitions) | set(stats["policies"]))
        policies = [{"name": n, "limits": (definitions.get(n) or {}).get("limits", []),
                     "shadow": bool((definitions.get(n) or {}).get("shadow")),
                     "counts": stats["policies"].get(n)} for n in names]
        with self._lock:
            history = [[round(t * 1000), dict(c)] for t, c in self._history]
        return {"scope": stats["scope"], "policies": policies, "refused": refused[:self.top], "blocks": blocks,
                "near": near, "memory": memory, "history": history, "sample_seconds": self.sample_seconds}

    def _sample(self, stats: Optional[Dict[str, Any]] = None) -> None:
        if stats is None:
            stats = self._query(lambda db: db.value("SELECT rl_policy_stats()"))
        now = time.time()
        totals = {p: c["refused"] + c["refused_blocked"] for p, c in stats["policies"].items()}
        with self._lock:
            if self._history and now - self._history[-1][0] < self.sample_seconds / 2:
                return
            self._history.append((now, totals))
            while self._history and now - self._history[0][0] > HISTORY_SECONDS:
                self._history.pop(0)

    def _start_sampler(self) -> None:
        with self._lock:
            if self._sampler is not None:
                return
            self._sampler = threading.Thread(target=self._sample_forever, name="ratelimit-admin-sampler", daemon=True)
        self._sampler.start()

    def _sample_forever(self) -> None:
        while not self._closed.wait(self.sample_seconds):
            try:
                self._sample()
            except Exception:  # noqa: BLE001 - the next sample tries again
                pass

    def close(self) -> None:
        """Stops the sampler and closes the connection."""
        self._closed.set()
        with self._lock:
            if self._db is not None:
                self._db.conn.close()
                self._db = None

    def unblock(self, subject: str) -> bool:
        return bool(self._query(lambda db: db.value("SELECT rl_unblock(?)", (subject,))))

    # -- one request, whatever the framework
    def handle(self, request: AdminRequest, body: bytes = b"") -> Answer:
        try:
            allowed = self.authorize(request) is True
        except Exception:  # noqa: BLE001 - a failing check never opens the page
            allowed = False
        if not allowed:
            return _json(403, {"error": "forbidden"})
        self._start_sampler()
        path = "/" + request.path.strip("/")
        try:
            if request.method in ("GET", "HEAD") and path == "/":
                return 200, "text/html; charset=utf-8", PAGE.encode()
            if request.method in ("GET", "HEAD") and path == "/state":
                return _json(200, self.state())
            if request.method == "POST" and path == "/unblock":
                if not request.headers.get("content-type", "").startswith("application/json"):
                    return _json(415, {"error": "send the subject as JSON: {\"subject\": \"...\"}"})
                subject = json.loads(body or b"{}").get("subject")
                if not isinstance(subject, str) or not subject:
                    return _json(400, {"error": "subject must be a non-empty string"})
                return _json(200, {"subject": subject, "unblocked": self.unblock(subject)})
        except Exception as e:  # noqa: BLE001 - the engine's words, with its status
            message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            denied = getattr(e, "sqlstate", None) == "42501" or "permission denied" in message
            return _json(403 if denied else 500, {"error": message})
        return _json(404, {"error": f"no {request.method} {path} here"})

    # -- the adapters
    async def asgi(self, scope, receive, send) -> None:
        """An ASGI app (Starlette's Mount, FastAPI's app.mount)."""
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        root = scope.get("root_path", "")
        path = scope["path"][len(root):] if scope["path"].startswith(root) else scope["path"]
        request = AdminRequest(scope["method"], path, headers, (scope.get("client") or [None])[0], scope)
        import anyio

        status, kind, out = await anyio.to_thread.run_sync(self.handle, request, body)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind.encode()), (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else out})

    def wsgi(self, environ, start_response):
        """A WSGI app (Flask through DispatcherMiddleware, any WSGI server)."""
        headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
        if environ.get("CONTENT_TYPE"):
            headers["content-type"] = environ["CONTENT_TYPE"]
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        request = AdminRequest(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), headers,
                               environ.get("REMOTE_ADDR"), environ)
        status, kind, out = self.handle(request, body)
        reasons = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 415: "Unsupported Media Type",
                   500: "Internal Server Error"}
        start_response(f"{status} {reasons.get(status, '')}", [("Content-Type", kind), ("Cache-Control", "no-store")])
        return [b"" if environ["REQUEST_METHOD"] == "HEAD" else out]


def django_view(admin: AdminView):
    """A Django view of the page: route it as `path("ratelimit/", view)` and
    `path("ratelimit/<path:rest>", view)`."""
    from django.http import HttpResponse
    from django.views.decorators.csrf import csrf_exempt

    @csrf_exempt  # unblocking takes a JSON body, which a cross-site form cannot send
    def view(request, rest: str = ""):
        headers = {k.lower(): v for k, v in request.headers.items()}
        req = AdminRequest(request.method, rest, headers, request.META.get("REMOTE_ADDR"), request)
        status, kind, out = admin.handle(req, request.body)
        response = HttpResponse(out, status=status, content_type=kind)
        response["Cache-Control"] = "no-store"
        return response

    return view


# The page, one file shared by the web packages (integrations/spec/admin.html; each package
# ships a copy, which tests/test_monitoring.py holds equal to it).
PAGE = (Path(__file__).parent / "admin.html").read_text(encoding="utf-8")

