"""An operator's page: who is being limited right now. Policies with their limits and
counts, a chart of refusals over the last hour, the subjects refused most, the blocks in
force with an unblock button, the budgets near their quota (`near_fraction`, 0.8 by
default) and the memory store's fill, read from the database's own views and functions
(rl_stats, rl_refused, rl_blocks, rl_policies, rl_budgets_near, rl_memory_stats).

It is off until you mount it, and it needs two things of its own:

- `authorize(request) -> bool`: your decision, on an `AdminRequest` (method, path,
  headers, client address, and the framework's own request as `native`), made before any
  body is read; anything but True answers 403. `header_token(name, token)` makes one that
  compares a header with a secret in constant time, and refuses to be made without one.
- an administrator's database: a URL or libpq string whose role is a member of rl_admin
  (PostgreSQL), never the application's connection. Without rl_admin the page answers
  403 with the engine's words.

    admin = AdminView("postgresql://ops@db/app",
                      authorize=header_token("x-ops-token", os.environ["RATELIMIT_OPS_TOKEN"]))
    app.mount("/ratelimit", admin.asgi)                    # Starlette, FastAPI
    application = DispatcherMiddleware(app, {"/ratelimit": admin.wsgi})   # Flask, any WSGI
    urlpatterns += [path("ratelimit/", view), path("ratelimit/<path:rest>", view)]  # view = django_view(admin)

The page has no external assets (it works offline), polls every few seconds, and unblocks
by a JSON POST (which a cross-site form cannot send) of at most MAX_BODY_BYTES; a larger
body is refused (413) unread, a malformed one answers 400 with the reason. It lists at most
`blocks` blocks (100) and says how many there are. Its refusal chart is sampled by this
process every `sample_seconds` from its first request, the last hour kept in memory."""
from __future__ import annotations

import hmac
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from .cli import Database

Answer = Tuple[int, str, bytes]
HISTORY_SECONDS = 3600
#: The largest body the page reads (an unblock's `{"subject": ...}`); a larger one is
#: refused with 413 before it is read.
MAX_BODY_BYTES = 4096


@dataclass
class AdminRequest:
    method: str
    path: str
    headers: Dict[str, str] = field(default_factory=dict)
    client: Optional[str] = None
    native: Any = None


def _json(status: int, value: Any) -> Answer:
    return status, "application/json", json.dumps(value).encode()


def _too_large() -> Answer:
    return _json(413, {"error": f"the body is larger than {MAX_BODY_BYTES} bytes"})


def header_token(header: str, token: Optional[str]) -> Callable[["AdminRequest"], bool]:
    """An `authorize` that admits a request whose header `header` equals `token`, compared
    in constant time. A missing or empty token is an error here, at startup: the page
    never opens because a variable was unset."""
    if not isinstance(token, str) or not token:
        raise ValueError(f"header_token({header!r}): the token is missing or empty, so the page would be open to all")
    name, expected = header.lower(), token.encode()

    def authorize(request: "AdminRequest") -> bool:
        return hmac.compare_digest(request.headers.get(name, "").encode(), expected)

    return authorize


def _declared_length(value: Optional[str]) -> Optional[int]:
    """A Content-Length header's number, None when absent; -1 when it is no number."""
    if value is None or value == "":
        return None
    return int(value) if value.isdigit() else -1


def _subject_of(body: bytes) -> Tuple[Optional[str], Optional[Answer]]:
    """The subject of an unblock's body, or the 400 that says what is wrong with it."""
    try:
        value = json.loads(body.decode("utf-8")) if body else None
    except UnicodeDecodeError:
        return None, _json(400, {"error": "the body is not UTF-8"})
    except ValueError as e:
        return None, _json(400, {"error": f"the body is not JSON: {e}"})
    if not isinstance(value, dict):
        return None, _json(400, {"error": 'send the subject as a JSON object: {"subject": "..."}'})
    subject = value.get("subject")
    if not isinstance(subject, str) or not subject:
        return None, _json(400, {"error": "subject must be a non-empty string"})
    return subject, None


class AdminView:
    def __init__(self, database: str, authorize: Callable[[AdminRequest], bool], sample_seconds: float = 10.0,
                 top: int = 20, extension: Optional[str] = None, near_fraction: float = 0.8, blocks: int = 100):
        if not callable(authorize):
            raise TypeError("AdminView needs an authorize(request) callable: the page is never open to everyone")
        self.database, self.authorize, self.sample_seconds, self.top = database, authorize, sample_seconds, top
        self.blocks = blocks  # blocks listed at most (the page says how many there are)
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
                                                     "FROM rl_refused ORDER BY refusals DESC, policy, subject LIMIT ?",
                                                     (self.top,))]
            blocks = [{"subject": s, "strikes": k, "blocked_until_ms": u}
                      for s, k, u in db.rows("SELECT subject, strikes, blocked_until_ms FROM rl_blocks "
                                             "ORDER BY subject LIMIT ?", (self.blocks,))]
            blocks_total = len(blocks) if len(blocks) < self.blocks else db.value("SELECT count(*) FROM rl_blocks")
            near = db.value("SELECT rl_budgets_near(?, ?)", (self.near_fraction, self.top))
            try:
                memory = db.value("SELECT rl_memory_stats()")
            except Exception:  # noqa: BLE001 - SQLite and the SQL edition have no memory store
                memory = None
            return stats, definitions, refused, blocks, blocks_total, near, memory

        stats, definitions, refused, blocks, blocks_total, near, memory = self._query(read)
        self._sample(stats)
        names = sorted(set(definitions) | set(stats["policies"]))
        policies = [{"name": n, "limits": (definitions.get(n) or {}).get("limits", []),
                     "shadow": bool((definitions.get(n) or {}).get("shadow")),
                     "counts": stats["policies"].get(n)} for n in names]
        with self._lock:
            history = [[round(t * 1000), dict(c)] for t, c in self._history]
        return {"scope": stats["scope"], "policies": policies, "refused": refused[:self.top], "blocks": blocks,
                "blocks_total": int(blocks_total), "near": near, "memory": memory, "history": history, "sample_seconds": self.sample_seconds}

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

    # -- one request, whatever the framework: decided on its method, path and headers
    # before any body is read (`admit`), then, for an unblock, on its bounded body
    def admit(self, request: AdminRequest) -> Optional[Answer]:
        """The answer to a request, decided before its body is read; None for an
        authorized unblock, whose body (at most MAX_BODY_BYTES) `unblock_answer` takes."""
        try:
            allowed = self.authorize(request) is True
        except Exception:  # noqa: BLE001 - a failing check never opens the page
            allowed = False
        if not allowed:
            return _json(403, {"error": "forbidden"})
        path = "/" + request.path.strip("/")
        if request.method == "POST" and path == "/unblock":
            if not request.headers.get("content-type", "").startswith("application/json"):
                return _json(415, {"error": "send the subject as JSON: {\"subject\": \"...\"}"})
            declared = _declared_length(request.headers.get("content-length"))
            if declared == -1:
                return _json(400, {"error": "Content-Length is not a number"})
            if declared is not None and declared > MAX_BODY_BYTES:
                return _too_large()
            return None
        self._start_sampler()
        return self._guarded(lambda: self._read_only(request, path))

    def _read_only(self, request: AdminRequest, path: str) -> Answer:
        if request.method in ("GET", "HEAD") and path == "/":
            return 200, "text/html; charset=utf-8", PAGE.encode()
        if request.method in ("GET", "HEAD") and path == "/state":
            return _json(200, self.state())
        return _json(404, {"error": f"no {request.method} {path} here"})

    def unblock_answer(self, body: bytes) -> Answer:
        """An authorized unblock's answer, from its body."""
        if len(body) > MAX_BODY_BYTES:
            return _too_large()
        subject, problem = _subject_of(body)
        if problem is not None:
            return problem
        self._start_sampler()
        return self._guarded(lambda: _json(200, {"subject": subject, "unblocked": self.unblock(subject)}))

    @staticmethod
    def _guarded(answer: Callable[[], Answer]) -> Answer:
        try:
            return answer()
        except Exception as e:  # noqa: BLE001 - the engine's words, with its status
            message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            denied = getattr(e, "sqlstate", None) == "42501" or "permission denied" in message
            return _json(403 if denied else 500, {"error": message})

    def handle(self, request: AdminRequest, body: bytes = b"") -> Answer:
        """One request whose body is at hand (the adapters read it only once `admit` let
        them)."""
        answer = self.admit(request)
        return answer if answer is not None else self.unblock_answer(body)

    # -- the adapters
    async def asgi(self, scope, receive, send) -> None:
        """An ASGI app (Starlette's Mount, FastAPI's app.mount)."""
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        root = scope.get("root_path", "")
        path = scope["path"][len(root):] if scope["path"].startswith(root) else scope["path"]
        request = AdminRequest(scope["method"], path, headers, (scope.get("client") or [None])[0], scope)
        import anyio

        answer = await anyio.to_thread.run_sync(self.admit, request)
        if answer is None:
            chunks, size = [], 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    answer = _too_large()
                    break
                chunks.append(chunk)
                if not message.get("more_body"):
                    break
            if answer is None:
                answer = await anyio.to_thread.run_sync(self.unblock_answer, b"".join(chunks))
        status, kind, out = answer
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind.encode()), (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else out})

    def wsgi(self, environ, start_response):
        """A WSGI app (Flask through DispatcherMiddleware, any WSGI server)."""
        headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
        for name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            if environ.get(name):
                headers[name.replace("_", "-").lower()] = environ[name]
        request = AdminRequest(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), headers,
                               environ.get("REMOTE_ADDR"), environ)
        answer = self.admit(request)
        if answer is None:
            # admit refused a length above the bound; without one, a server that ends the
            # stream itself (chunked input) is read up to one byte past it
            length = _declared_length(headers.get("content-length"))
            if length is None and environ.get("wsgi.input_terminated"):
                length = MAX_BODY_BYTES + 1
            answer = self.unblock_answer(environ["wsgi.input"].read(length) if length else b"")
        status, kind, out = answer
        reasons = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 413: "Content Too Large",
                   415: "Unsupported Media Type", 500: "Internal Server Error"}
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
        answer = admin.admit(req)
        if answer is None:  # an authorized unblock: its body, never more than the bound
            answer = admin.unblock_answer(request.read(MAX_BODY_BYTES + 1))
        status, kind, out = answer
        response = HttpResponse(out, status=status, content_type=kind)
        response["Cache-Control"] = "no-store"
        return response

    return view


# The page, one file shared by the web packages (integrations/spec/admin.html; each package
# ships a copy, which tests/test_monitoring.py holds equal to it).
PAGE = (Path(__file__).parent / "admin.html").read_text(encoding="utf-8")

