"""An operator's page: who is being limited right now. Policies with their limits and
counts, a chart of refusals over the last hour, the subjects refused most, the blocks in
force with an unblock button, and the memory store's fill, read from the database's own
views (rl_stats, rl_refused, rl_blocks, rl_policies, rl_memory_stats).

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
                 top: int = 20, extension: Optional[str] = None):
        if not callable(authorize):
            raise TypeError("AdminView needs an authorize(request) callable: the page is never open to everyone")
        self.database, self.authorize, self.sample_seconds, self.top = database, authorize, sample_seconds, top
        self.extension = extension  # SQLite: libratelimit (default: the sqlite-ratelimit package's)
        self._db: Optional[Database] = None
        self._lock = threading.Lock()
        self._history: List[Tuple[float, Dict[str, int]]] = []
        self._sampler: Optional[threading.Thread] = None

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
            try:
                memory = db.value("SELECT rl_memory_stats()")
            except Exception:  # noqa: BLE001 - SQLite and the SQL edition have no memory store
                memory = None
            return stats, definitions, refused, blocks, memory

        stats, definitions, refused, blocks, memory = self._query(read)
        self._sample(stats)
        names = sorted(set(definitions) | set(stats["policies"]))
        policies = [{"name": n, "limits": (definitions.get(n) or {}).get("limits", []),
                     "shadow": bool((definitions.get(n) or {}).get("shadow")),
                     "counts": stats["policies"].get(n)} for n in names]
        with self._lock:
            history = [[round(t * 1000), dict(c)] for t, c in self._history]
        return {"scope": stats["scope"], "policies": policies, "refused": refused[:self.top], "blocks": blocks,
                "memory": memory, "history": history, "sample_seconds": self.sample_seconds}

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
        while True:
            time.sleep(self.sample_seconds)
            try:
                self._sample()
            except Exception:  # noqa: BLE001 - the next sample tries again
                pass

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


PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Rate limits: who is being limited</title>
<style>
body { font: 15px/1.45 system-ui, sans-serif; margin: 1.5rem auto; max-width: 72rem; padding: 0 1rem; color: #1b1f24; }
h1 { font-size: 1.4rem; margin: 0 0 .25rem; } h2 { font-size: 1.1rem; margin: 1.6rem 0 .5rem; }
table { border-collapse: collapse; width: 100%; } caption { text-align: left; color: #57606a; padding-bottom: .3rem; }
th, td { text-align: left; padding: .3rem .6rem; border-bottom: 1px solid #d0d7de; } td.n, th.n { text-align: right; }
button { font: inherit; padding: .2rem .7rem; border: 1px solid #8c959f; border-radius: .3rem; background: #f6f8fa; cursor: pointer; }
button:focus-visible { outline: 3px solid #0969da; outline-offset: 2px; }
#status { min-height: 1.4em; color: #57606a; } .bad { color: #cf222e; } svg { display: block; }
.meter { height: .6rem; background: #eaeef2; border-radius: .3rem; overflow: hidden; max-width: 20rem; }
.meter span { display: block; height: 100%; background: #0969da; }
</style>
</head>
<body>
<main>
<h1>Who is being limited</h1>
<p id="status" role="status" aria-live="polite">Loading…</p>
<section aria-labelledby="h-policies"><h2 id="h-policies">Policies</h2>
<table><caption>Counts of rl_check since the last reset (<span id="scope"></span>)</caption>
<thead><tr><th scope="col">Policy</th><th scope="col">Limits</th><th scope="col" class="n">Admitted</th>
<th scope="col" class="n">Refused</th><th scope="col" class="n">Refused while blocked</th>
<th scope="col" class="n">Shadow would refuse</th></tr></thead><tbody id="policies"></tbody></table></section>
<section aria-labelledby="h-chart"><h2 id="h-chart">Refusals over the last hour</h2>
<div id="chart"></div></section>
<section aria-labelledby="h-refused"><h2 id="h-refused">Subjects refused most</h2>
<table><caption>Refusals are at most “error” above the true count</caption>
<thead><tr><th scope="col">Policy</th><th scope="col">Subject</th><th scope="col" class="n">Refusals</th>
<th scope="col" class="n">Error</th><th scope="col">Last refused</th></tr></thead><tbody id="refused"></tbody></table></section>
<section aria-labelledby="h-blocks"><h2 id="h-blocks">Blocked now</h2>
<table><thead><tr><th scope="col">Subject</th><th scope="col" class="n">Strikes</th><th scope="col">Until</th>
<th scope="col"><span class="visually-hidden">Action</span></th></tr></thead><tbody id="blocks"></tbody></table></section>
<section aria-labelledby="h-memory"><h2 id="h-memory">Memory store</h2><div id="memory"></div></section>
</main>
<script>
"use strict";
const base = location.pathname.replace(/\\/?$/, "/");
const $ = (id) => document.getElementById(id);
function cell(text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; return td; }
function row(cells) { const tr = document.createElement("tr"); cells.forEach((c) => tr.appendChild(c)); return tr; }
function empty(body, columns, text) { body.replaceChildren(row([Object.assign(cell(text), { colSpan: columns })])); }
function when(ms) { return ms == null ? "until unblocked" : new Date(ms).toLocaleString(); }
function limits(list) {
  return list.map((l) => l.burst !== undefined ? `${l.burst} burst, ${l.refill_per_minute}/min`
    : l.quota !== undefined ? `${l.quota} per ${l.period}` : `${l.limit} per ${l.window_seconds} s`).join("; ");
}
function chart(history) {
  const box = $("chart");
  if (history.length < 2) { box.textContent = "Samples appear as this page stays open (one every few seconds)."; return; }
  const policies = [...new Set(history.flatMap(([, c]) => Object.keys(c)))].sort();
  const w = 720, h = 160, t0 = history[0][0], t1 = history[history.length - 1][0];
  const series = policies.map((p) => history.slice(1).map(([t, c], i) => [t, Math.max(0, ((c[p] || 0) - (history[i][1][p] || 0)) / Math.max(1, (t - history[i][0]) / 1000))]));
  const top = Math.max(1e-9, ...series.flat().map(([, v]) => v));
  const colours = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#57606a"];
  const x = (t) => 40 + (w - 50) * (t - t0) / Math.max(1, t1 - t0), y = (v) => h - 20 - (h - 30) * v / top;
  const lines = series.map((s, i) => `<polyline fill="none" stroke="${colours[i % colours.length]}" stroke-width="2" points="${s.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ")}"/>`).join("");
  const legend = policies.map((p, i) => `<tspan fill="${colours[i % colours.length]}">■ </tspan><tspan>${p.replace(/[<&>]/g, "")}  </tspan>`).join("");
  const summary = policies.map((p, i) => `${p}: ${series[i][series[i].length - 1][1].toFixed(2)} refusals per second now`).join("; ");
  box.innerHTML = `<svg role="img" aria-label="Refusals per second by policy. ${summary.replace(/["<&>]/g, "")}" width="${w}" height="${h + 20}" viewBox="0 0 ${w} ${h + 20}">
    <line x1="40" y1="${h - 20}" x2="${w - 10}" y2="${h - 20}" stroke="#d0d7de"/><text x="0" y="14" font-size="11">${top.toFixed(2)}/s</text>
    <text x="0" y="${h - 20}" font-size="11">0</text>${lines}<text x="40" y="${h + 12}" font-size="12">${legend}</text></svg>`;
}
async function unblock(subject, button) {
  button.disabled = true;
  const answer = await fetch(base + "unblock", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ subject }) });
  const body = await answer.json();
  $("status").textContent = answer.ok ? (body.unblocked ? `Unblocked ${subject}.` : `${subject} was not blocked.`) : `Could not unblock ${subject}: ${body.error}`;
  $("status").className = answer.ok ? "" : "bad";
  await refresh();
}
async function refresh() {
  let s;
  try {
    const answer = await fetch(base + "state", { headers: { Accept: "application/json" } });
    s = await answer.json();
    if (!answer.ok) throw new Error(s.error || answer.status);
  } catch (e) { $("status").textContent = `Could not read the state: ${e.message}`; $("status").className = "bad"; return; }
  $("scope").textContent = s.scope === "server" ? "the whole server" : `this page's ${s.scope} only`;
  const policies = $("policies");
  if (!s.policies.length) empty(policies, 6, "No policy yet."); else policies.replaceChildren(...s.policies.map((p) => row([
    cell(p.name + (p.shadow ? " (shadow)" : "")), cell(limits(p.limits)),
    ...["admitted", "refused", "refused_blocked", "would_refuse"].map((k) => cell(p.counts ? p.counts[k] : 0, "n"))])));
  const refused = $("refused");
  if (!s.refused.length) empty(refused, 5, "Nobody refused since the last reset."); else refused.replaceChildren(...s.refused.map((r) => row([
    cell(r.policy), cell(r.subject), cell(r.refusals, "n"), cell(r.error, "n"), cell(new Date(r.last_refused_ms).toLocaleTimeString())])));
  const blocks = $("blocks");
  if (!s.blocks.length) empty(blocks, 4, "Nobody is blocked."); else blocks.replaceChildren(...s.blocks.map((b) => {
    const button = document.createElement("button");
    button.type = "button"; button.textContent = "Unblock"; button.dataset.subject = b.subject;
    button.setAttribute("aria-label", `Unblock ${b.subject}`);
    button.addEventListener("click", () => unblock(b.subject, button));
    const action = document.createElement("td"); action.appendChild(button);
    return row([cell(b.subject), cell(b.strikes, "n"), cell(when(b.blocked_until_ms)), action]);
  }));
  if (s.memory) {
    const fill = s.memory.in_use / Math.max(1, s.memory.capacity);
    $("memory").innerHTML = `<p>${s.memory.in_use.toLocaleString()} of ${s.memory.capacity.toLocaleString()} buckets (${(100 * fill).toFixed(1)} %), ${s.memory.evicted_early.toLocaleString()} replaced early</p>
      <div class="meter" role="meter" aria-label="Memory store fill" aria-valuemin="0" aria-valuemax="100" aria-valuenow="${(100 * fill).toFixed(1)}"><span style="width:${(100 * fill).toFixed(1)}%"></span></div>`;
  } else { $("memory").textContent = "No memory store here (SQLite and the SQL edition keep every bucket in tables)."; }
  chart(s.history);
  if ($("status").textContent === "Loading…" || $("status").className === "bad" && !$("status").textContent.startsWith("Could not unblock")) {
    $("status").textContent = `Updated ${new Date().toLocaleTimeString()}.`; $("status").className = "";
  }
  document.body.dataset.loaded = "yes";
}
refresh();
setInterval(refresh, 3000);
</script>
<style>.visually-hidden { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); }</style>
</body>
</html>
"""
