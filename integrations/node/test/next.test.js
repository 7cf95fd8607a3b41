// The Next.js 16 app in examples/next-app, built with `next build` and served by
// `next start`, hit by real HTTP clients: limits in proxy.ts and in route handlers, on
// SQLite and (when a cluster is up: PGHOST) PostgreSQL. The app's packages come from
// `npm ci` there (scripts/test.sh), ratelimit-web copied from this folder.
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { execFileSync, spawn } = require("node:child_process");
const net = require("node:net");
const path = require("node:path");
const { limitKey } = require("..");
const { EXTENSION, ENGINES, database, hammer, get, statusesOf } = require("./support");

const APP = path.join(__dirname, "..", "examples", "next-app");
const NEXT = path.join(APP, "node_modules", "next", "dist", "bin", "next");
// generous: the exact counts must never fall back (as in the Express tests)
const quiet = { ...process.env, NEXT_TELEMETRY_DISABLED: "1", RATELIMIT_CHECK_TIMEOUT_MS: "5000" };

test.before(() => {
  execFileSync(process.execPath, [NEXT, "build"], { cwd: APP, env: quiet, stdio: ["ignore", "ignore", "inherit"] });
});

const freePort = () => new Promise((resolve) => {
  const probe = net.createServer().listen(0, "127.0.0.1", () => {
    const { port } = probe.address();
    probe.close(() => resolve(port));
  });
});

/** `next start` on the app's database; resolves once it answers. */
async function nextStart(db) {
  const port = await freePort();
  const env = db.engine === "sqlite"
    ? { ...quiet, RATELIMIT_SQLITE: db.name, RATELIMIT_EXTENSION: EXTENSION }
    : { ...quiet, PGDATABASE: db.name };
  const child = spawn(process.execPath, [NEXT, "start", "-p", String(port), "-H", "127.0.0.1"], { cwd: APP, env, stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  child.stdout.on("data", (d) => (log += d));
  child.stderr.on("data", (d) => (log += d));
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`next start exited ${child.exitCode}: ${log}`);
    try {
      if ((await fetch(base + "/health")).ok) break;
    } catch {}
    if (Date.now() > deadline) throw new Error(`next start did not answer: ${log}`);
    await new Promise((ok) => setTimeout(ok, 100));
  }
  return {
    base,
    stop: async () => {
      child.kill();
      if (child.exitCode === null) await new Promise((r) => child.once("exit", r));
      return log;
    },
  };
}

for (const engine of ENGINES) {
  test(`${engine}: next start admits exactly the limit, in proxy.ts and in a route handler`, async () => {
    const db = await database(engine);
    const app = await nextStart(db);
    try {
      for (const [url, burst] of [[app.base + "/api/hello", 300], [app.base + "/limited", 200]]) {
        const responses = await hammer(url, 8, 60, { "x-user": "ann" });
        const admitted = responses.filter((r) => r.status === 200);
        assert.equal(admitted.length, burst, url);
        assert.equal(responses.length - admitted.length, 8 * 60 - burst, url);
        assert.ok(responses.every((r) => r.status === 200 || r.status === 429), url);
        // every admission the database's (a fallback admission has no headers), each with its
        // own remaining count: the headers reach the client
        assert.ok(admitted.every((r) => r.headers.get("x-ratelimit-remaining") !== null), url);
        const remaining = admitted.map((r) => Number(r.headers.get("x-ratelimit-remaining"))).sort((a, b) => a - b);
        assert.deepEqual(remaining, Array.from({ length: burst }, (_, i) => i), url);
        for (const r of responses) assert.equal(r.headers.get("x-ratelimit-limit"), String(burst), url);
        const { r, body } = await get(url, { "x-user": "ann" });
        assert.equal(r.status, 429);
        assert.deepEqual(Object.keys(body), ["detail", "limit", "remaining", "reset", "retry_after"]);
        assert.equal(body.detail, "Too Many Requests");
        assert.equal(body.retry_after, Number(r.headers.get("retry-after")));
        // another subject has a bucket of its own
        assert.equal((await get(url, { "x-user": "bob" })).r.status, 200);
      }
    } finally {
      await app.stop();
      await db.close();
    }
  });

  test(`${engine}: next start limits tiers, policies and client addresses apart; unmatched paths never`, async () => {
    const db = await database(engine);
    const app = await nextStart(db);
    try {
      assert.deepEqual(await statusesOf(app.base + "/api/small/a", 7, { "x-user": "cy" }), [...Array(5).fill(200), 429, 429]);
      assert.deepEqual(await statusesOf(app.base + "/api/small/b", 12, { "x-user": "di", "x-plan": "pro" }), [...Array(10).fill(200), 429, 429]);
      assert.deepEqual(await statusesOf(app.base + "/login", 4, { "x-user": "ed" }, { method: "POST" }), [200, 200, 200, 429]);
      // nobody signed in: the client address, as a trusted local proxy reports it
      assert.deepEqual(await statusesOf(app.base + "/api/small/x", 6, { "x-forwarded-for": "203.0.113.9" }), [...Array(5).fill(200), 429]);
      assert.deepEqual(await statusesOf(app.base + "/api/small/x", 1, { "x-forwarded-for": "203.0.113.10" }), [200]);
      for (let i = 0; i < 50; i++) {
        const { r } = await get(app.base + "/health");
        assert.equal(r.status, 200);
        assert.equal(r.headers.get("x-ratelimit-limit"), null);
      }
    } finally {
      await app.stop();
      await db.close();
    }
  });

  test(`${engine}: a route handler that fails under next start gives back what it took`, async () => {
    const db = await database(engine);
    const app = await nextStart(db);
    try {
      const statuses = [];
      for (const url of [...Array(6).fill("/fail"), ...Array(6).fill("/fail?how=503")]) {
        const r = await fetch(app.base + url, { headers: { "x-user": "fay" } });
        await r.arrayBuffer(); // Next.js answers a throw with an empty 500
        statuses.push(r.status);
      }
      assert.deepEqual(statuses, [...Array(6).fill(500), ...Array(6).fill(503)]); // the burst of 2 never ran out
      assert.equal(Number(await db.sql("SELECT rl_peek(?, 2, 0.000001, 0) ->> 'remaining'", limitKey("/fail", "user:fay", 0))), 2);
      assert.deepEqual(await statusesOf(app.base + "/fail?how=ok", 3, { "x-user": "fay" }), [200, 200, 429]);
    } finally {
      const log = await app.stop();
      assert.match(log, /the handler failed/); // Next.js logged the throw it answered 500 for
      await db.close();
    }
  });

  test(`${engine}: under next start, a proxy route whose policy is missing is logged and answers a JSON 500`, async () => {
    const db = await database(engine);
    await db.sql("SELECT rl_policy_drop(?)", "web_login");
    const app = await nextStart(db);
    try {
      for (let i = 0; i < 3; i++) {
        const { r, body } = await get(app.base + "/login", { "x-user": "gus" }, { method: "POST" });
        assert.equal(r.status, 500);
        assert.deepEqual(body, { detail: "Rate Limit Policy Missing", route: "POST /login", policy: "web_login" });
      }
      assert.equal((await get(app.base + "/api/hello", { "x-user": "gus" })).r.status, 200); // the rest serves
    } finally {
      const log = await app.stop();
      // Next.js reports the startup check's rejection and keeps serving (it does not exit)
      assert.match(log, /unhandledRejection: Error: ratelimit-web: route "POST \/login": there is no policy named "web_login" in the database/);
      await db.close();
    }
  });
}
