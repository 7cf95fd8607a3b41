// The test application (integrations/spec/app.json: its policies, routes and options, the
// same as the Python and Ruby packages'), run by the tests in a child process, configured
// by environment: RL_WEB_ENGINE (sqlite or postgres), RL_WEB_DB (a file, or a database
// name), RL_WEB_EXTENSION (SQLite's libratelimit), RL_WEB_TIMEOUT_MS (the limiter's
// timeout; else its default), the opt-in defenses RL_WEB_REFUSAL_CACHE and
// RL_WEB_MAX_IN_FLIGHT, RL_WEB_EXTRA_POLICY (a route /extra limited by that policy, which
// may not exist), RL_WEB_EXTRA_LIMITS (one of those explicit limits) and RL_WEB_LOG (a file
// the limiters' log lines are appended to, synchronously; else stderr). Serves the routes
// twice: through the Express middleware, and through withRateLimit (Fetch API, as in
// Next.js route handlers) on a node:http server that hands it the socket's address in
// X-Real-IP, as nginx in front would. Prints both ports.
"use strict";
const http = require("node:http");
const express = require("express");
const { rateLimit, withRateLimit, normalizePath, peers, PostgresLimiter, PrometheusMetrics, SqliteLimiter, charge, refund } = require("..");
const promClient = require("prom-client");
const { SPEC, signedIn } = require("./support");

const timeout = process.env.RL_WEB_TIMEOUT_MS ? { timeoutMs: Number(process.env.RL_WEB_TIMEOUT_MS) } : {};
const limiter = process.env.RL_WEB_ENGINE === "sqlite"
  ? SqliteLimiter.open(process.env.RL_WEB_DB, { extension: process.env.RL_WEB_EXTENSION, ...timeout })
  : new PostgresLimiter(new (require("pg").Pool)({ database: process.env.RL_WEB_DB, max: 8, connectionTimeoutMillis: 1000 }), timeout);
// pg emits errors of idle clients when the server goes away: the next check sees them
if (limiter.pool) limiter.pool.on("error", () => {});

const authorization = (req) => (typeof req.get === "function" ? req.get("authorization") : req.headers.get("authorization"));
// identify_by_query: the route's own identify, a query parameter of Express's req or a Fetch Request
const byQuery = (name) => (req) => (req.query ? req.query[name] : new URL(req.url).searchParams.get(name) ?? undefined);
// period_by_query: the route's limits as a function of the request, each budget with the
// period that query parameter holds, when it holds one (a customer's own billing period)
const periodByQuery = (name, limits) => (req) => {
  const period = byQuery(name)(req);
  return limits.map((l) => (period && "period" in l ? { ...l, period } : l));
};
const routes = Object.fromEntries(Object.entries(SPEC.routes).map(([pattern, r]) => [pattern,
  { ...r, refundOn: r.refund_on, ...(r.identify_by_query ? { identify: byQuery(r.identify_by_query) } : {}),
    ...(r.period_by_query ? { limits: periodByQuery(r.period_by_query, r.limits) } : {}) }]));
if (process.env.RL_WEB_EXTRA_POLICY) routes["/extra"] = { policy: process.env.RL_WEB_EXTRA_POLICY };
if (process.env.RL_WEB_EXTRA_LIMITS) routes["/extra"] = { limits: JSON.parse(process.env.RL_WEB_EXTRA_LIMITS) };
const options = {
  limiter,
  ...(process.env.RL_WEB_LOG ? { log: (line) => require("node:fs").appendFileSync(process.env.RL_WEB_LOG, line + "\n") } : {}),
  identify: (req) => {
    const [user] = signedIn(authorization(req));
    return user ? `user:${user}` : undefined;
  },
  tier: (req) => signedIn(authorization(req))[1],
  trustedProxies: SPEC.options.trusted_proxies,
  skip: SPEC.options.skip,
  refusalCache: Number(process.env.RL_WEB_REFUSAL_CACHE ?? 0),
  maxInFlight: process.env.RL_WEB_MAX_IN_FLIGHT ? Number(process.env.RL_WEB_MAX_IN_FLIGHT) : undefined,
  routes,
};
const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));
const runs = {};
const ran = (path) => (runs[normalizePath(path)] = (runs[normalizePath(path)] ?? 0) + 1);

// each server its own registry, so that their figures stay apart
const expressMetrics = new PrometheusMetrics({ register: new promClient.Registry() });
const fetchMetrics = new PrometheusMetrics({ register: new promClient.Registry() });
const app = express();
const limited = rateLimit({ ...options, metrics: expressMetrics });
app.use(limited);
app.get("/counts", (req, res) => res.json(limited.counters));
app.get("/runs", (req, res) => res.json(runs));
app.get("/metrics", async (req, res) => res.type("text/plain").send(await expressMetrics.register.metrics()));
app.get("/slow", async (req, res) => {
  await sleep(Number(req.query.seconds ?? 0.5) * 1000);
  res.json({ ok: true });
});
app.all(["/fail", "/pfail", "/sms", "/refund/:order"], (req, res) => {
  ran(req.path);
  if (req.query.how === "503") return res.status(503).json({ ok: false });
  if (req.query.how === "ok") return res.json({ ok: true });
  throw new Error("the handler failed");
});
// the work, then its real cost charged (or an estimate's surplus refunded)
app.get(["/ai", "/pai", "/bill"], async (req, res) => {
  ran(req.path);
  if (req.query.tokens !== undefined) await charge(req, Number(req.query.tokens));
  if (req.query.refund !== undefined) await refund(req, Number(req.query.refund));
  res.json({ ok: true, path: req.path });
});
app.all("*", (req, res) => {
  ran(req.path);
  res.json({ ok: true, path: req.path });
});
app.use((err, req, res, next) => res.status(500).json({ error: err.message })); // quiet

const handler = withRateLimit({ ...options, metrics: fetchMetrics, peer: peers.header("x-real-ip") }, async (request) => {
  const url = new URL(request.url);
  if (url.pathname === "/counts") return Response.json(handler.counters);
  if (url.pathname === "/runs") return Response.json(runs);
  if (url.pathname === "/metrics") return new Response(await fetchMetrics.register.metrics());
  if (url.pathname === "/slow") {
    await sleep(Number(url.searchParams.get("seconds") ?? 0.5) * 1000);
    return Response.json({ ok: true });
  }
  ran(url.pathname);
  const handlerPath = normalizePath(url.pathname);
  if (handlerPath === "/ai" || handlerPath === "/pai" || handlerPath === "/bill") {
    if (url.searchParams.has("tokens")) await charge(request, Number(url.searchParams.get("tokens")));
    if (url.searchParams.has("refund")) await refund(request, Number(url.searchParams.get("refund")));
  }
  if (["/fail", "/pfail", "/sms"].includes(handlerPath) || handlerPath.startsWith("/refund/")) {
    if (url.searchParams.get("how") === "503") return Response.json({ ok: false }, { status: 503 });
    if (url.searchParams.get("how") === "ok") return Response.json({ ok: true });
    throw new Error("the handler failed");
  }
  return Response.json({ ok: true, path: url.pathname });
});
// node:http to Fetch and back; the socket's address in X-Real-IP, overwriting the
// client's, as a proxy in front does
const fetchServer = http.createServer(async (req, res) => {
  const headers = new Headers();
  for (const [name, value] of Object.entries(req.headers)) headers.set(name, [].concat(value).join(", "));
  headers.set("x-real-ip", req.socket.remoteAddress);
  try {
    const response = await handler(new Request(`http://${req.headers.host}${req.url}`, { method: req.method, headers }));
    res.writeHead(response.status, Object.fromEntries(response.headers));
    res.end(Buffer.from(await response.arrayBuffer()));
  } catch (e) {
    res.writeHead(500, { "content-type": "application/json" }).end(JSON.stringify({ error: e.message }));
  }
});

// Idle keep-alive connections last a minute: with Node's 5 s, a test that pauses (stopping
// PostgreSQL on a busy machine took that long) had its next request sent on a connection
// the server was closing at that moment, and fetch failed before the server saw it
const expressServer = app.listen(0, "127.0.0.1", () => {
  fetchServer.listen(0, "127.0.0.1", () => {
    console.log(`listening ${expressServer.address().port} ${fetchServer.address().port}`);
  });
});
for (const s of [expressServer, fetchServer]) Object.assign(s, { keepAliveTimeout: 60_000, headersTimeout: 65_000 });
