// The application the tests run in a child process, configured by environment:
// RL_WEB_ENGINE (sqlite or postgres), RL_WEB_DB (a file, or a database name),
// RL_WEB_EXTENSION (SQLite's libratelimit), RL_WEB_TIMEOUT_MS, the opt-in defenses
// RL_WEB_REFUSAL_CACHE and RL_WEB_MAX_IN_FLIGHT, and RL_WEB_EXTRA_POLICY (a route /extra
// limited by that policy, which may not exist). Serves the same routes
// twice: through the Express middleware, and through withRateLimit (Fetch API, as in
// Next.js route handlers) on a plain node:http server. Prints both ports.
"use strict";
const http = require("node:http");
const express = require("express");
const { rateLimit, withRateLimit, PostgresLimiter, PrometheusMetrics, SqliteLimiter } = require("..");
const promClient = require("prom-client");

const NEVER_REFILLS = 1e-6; // tokens per minute: a run sees exactly the burst
const limiter = process.env.RL_WEB_ENGINE === "sqlite"
  ? SqliteLimiter.open(process.env.RL_WEB_DB, { extension: process.env.RL_WEB_EXTENSION })
  : new PostgresLimiter(new (require("pg").Pool)({ database: process.env.RL_WEB_DB, max: 8, connectionTimeoutMillis: 1000 }));
// pg emits errors of idle clients when the server goes away: the next check sees them
if (limiter.pool) limiter.pool.on("error", () => {});

const options = {
  limiter,
  identify: (req) => {
    const user = typeof req.get === "function" ? req.get("x-user") : req.headers.get("x-user");
    return user ? `user:${user}` : undefined;
  },
  tier: (req) => (typeof req.get === "function" ? req.get("x-plan") : req.headers.get("x-plan")) ?? undefined,
  trustedProxies: ["127.0.0.1/32"],
  checkTimeoutMs: Number(process.env.RL_WEB_TIMEOUT_MS ?? 50),
  skip: ["/health", "/ready", "/counts", "/metrics"],
  refusalCache: Number(process.env.RL_WEB_REFUSAL_CACHE ?? 0),
  maxInFlight: process.env.RL_WEB_MAX_IN_FLIGHT ? Number(process.env.RL_WEB_MAX_IN_FLIGHT) : undefined,
  routes: {
    "/exact": { limits: [{ burst: 300, refill_per_minute: NEVER_REFILLS }] },
    "/policy": { policy: "web_exact" },
    "/login": { policy: "web_login", sensitive: true },
    "GET /api/*": { limits: [{ burst: 5, refill_per_minute: NEVER_REFILLS }, { period: "day", quota: 8 }], tiers: { free: 1, pro: 2 } },
    "/fail": { limits: [{ burst: 2, refill_per_minute: NEVER_REFILLS }] },
    "/pfail": { policy: "web_fail" },
    "/open": { limits: [{ burst: 40, refill_per_minute: NEVER_REFILLS }] },
    "/retry": { limits: [{ burst: 1, refill_per_minute: 60 }] },
    "/big": { limits: [{ burst: 5, refill_per_minute: 60 }], cost: 10 },
    "/slow": { limits: [{ burst: 1000, refill_per_minute: NEVER_REFILLS }] },
    "/flood": { policy: "web_flood" },
    "/gone": { policy: "web_gone" },
    ...(process.env.RL_WEB_EXTRA_POLICY ? { "/extra": { policy: process.env.RL_WEB_EXTRA_POLICY } } : {}),
  },
};
const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));

// each server its own registry, so that their figures stay apart
const expressMetrics = new PrometheusMetrics({ register: new promClient.Registry() });
const fetchMetrics = new PrometheusMetrics({ register: new promClient.Registry() });
const app = express();
const limited = rateLimit({ ...options, metrics: expressMetrics });
app.use(limited);
app.get("/counts", (req, res) => res.json(limited.counters));
app.get("/metrics", async (req, res) => res.type("text/plain").send(await expressMetrics.register.metrics()));
app.get("/slow", async (req, res) => {
  await sleep(Number(req.query.seconds ?? 0.5) * 1000);
  res.json({ ok: true });
});
app.all(["/fail", "/pfail"], (req, res) => {
  if (req.query.how === "503") return res.status(503).json({ ok: false });
  if (req.query.how === "ok") return res.json({ ok: true });
  throw new Error("the handler failed");
});
app.all("*", (req, res) => res.json({ ok: true, path: req.path }));
app.use((err, req, res, next) => res.status(500).json({ error: err.message })); // quiet

const handler = withRateLimit({ ...options, metrics: fetchMetrics }, async (request) => {
  const url = new URL(request.url);
  if (url.pathname === "/counts") return Response.json(handler.counters);
  if (url.pathname === "/metrics") return new Response(await fetchMetrics.register.metrics());
  if (url.pathname === "/slow") {
    await sleep(Number(url.searchParams.get("seconds") ?? 0.5) * 1000);
    return Response.json({ ok: true });
  }
  if (url.pathname === "/fail" || url.pathname === "/pfail") {
    if (url.searchParams.get("how") === "503") return Response.json({ ok: false }, { status: 503 });
    if (url.searchParams.get("how") === "ok") return Response.json({ ok: true });
    throw new Error("the handler failed");
  }
  return Response.json({ ok: true, path: url.pathname });
});
// node:http to Fetch and back, as Next.js does (the peer appended to X-Forwarded-For)
const fetchServer = http.createServer(async (req, res) => {
  const headers = new Headers();
  for (const [name, value] of Object.entries(req.headers)) headers.set(name, [].concat(value).join(", "));
  const forwarded = headers.get("x-forwarded-for");
  headers.set("x-forwarded-for", (forwarded ? forwarded + ", " : "") + req.socket.remoteAddress.replace(/^::ffff:/, ""));
  try {
    const response = await handler(new Request(`http://${req.headers.host}${req.url}`, { method: req.method, headers }));
    res.writeHead(response.status, Object.fromEntries(response.headers));
    res.end(Buffer.from(await response.arrayBuffer()));
  } catch (e) {
    res.writeHead(500, { "content-type": "application/json" }).end(JSON.stringify({ error: e.message }));
  }
});

const expressServer = app.listen(0, "127.0.0.1", () => {
  fetchServer.listen(0, "127.0.0.1", () => {
    console.log(`listening ${expressServer.address().port} ${fetchServer.address().port}`);
  });
});
