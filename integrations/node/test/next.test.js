// The Next.js 16 app in examples/next-app, built with `next build` and served by
// `next start` behind a proxy that sets X-Real-IP (as nginx in front does, here a few lines
// of node:http), hit by real HTTP clients: limits in proxy.ts and in route handlers, on
// SQLite and (when a cluster is up: PGHOST) PostgreSQL; and the address rule attacked
// through the proxy and directly. The app's packages come from `npm ci` there
// (scripts/test.sh), ratelimit-web and sqlite-ratelimit linked from this checkout.
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { execFileSync, spawn } = require("node:child_process");
const http = require("node:http");
const net = require("node:net");
const path = require("node:path");
const { limitKey } = require("..");
const { EXTENSION, ENGINES, SPEC, database, hammer, get, statusesOf, auth } = require("./support");

const APP = path.join(__dirname, "..", "examples", "next-app");
const NEXT = path.join(APP, "node_modules", "next", "dist", "bin", "next");
const quiet = { ...process.env, NEXT_TELEMETRY_DISABLED: "1", SESSION_SECRET: SPEC.secret };

test.before(() => {
  execFileSync(process.execPath, [NEXT, "build"], { cwd: APP, env: quiet, stdio: ["ignore", "ignore", "inherit"] });
});

const freePort = () => new Promise((resolve) => {
  const probe = net.createServer().listen(0, "127.0.0.1", () => {
    const { port } = probe.address();
    probe.close(() => resolve(port));
  });
});

/** A reverse proxy as nginx with `proxy_set_header X-Real-IP $remote_addr` and
 * `X-Forwarded-For $proxy_add_x_forwarded_for` is: the client's X-Real-IP replaced by the
 * address it saw, that address appended to X-Forwarded-For. */
function frontProxy(target) {
  const proxy = http.createServer((req, res) => {
    const headers = { ...req.headers, "x-real-ip": req.socket.remoteAddress,
      "x-forwarded-for": [req.headers["x-forwarded-for"], req.socket.remoteAddress].filter(Boolean).join(", ") };
    const upstream = http.request({ host: "127.0.0.1", port: target, method: req.method, path: req.url, headers }, (answer) => {
      res.writeHead(answer.statusCode, answer.headers);
      answer.pipe(res);
    });
    upstream.on("error", (e) => res.writeHead(502).end(String(e)));
    req.pipe(upstream);
  });
  return new Promise((resolve) => proxy.listen(0, "127.0.0.1", () => resolve(proxy)));
}

/** `next start` on the app's database, behind the proxy; resolves once it answers. */
async function nextStart(db, settings = {}) {
  const port = await freePort();
  const env = db.engine === "sqlite"
    ? { ...quiet, ...settings, RATELIMIT_SQLITE: db.name }
    : { ...quiet, ...settings, DATABASE_URL: `postgresql:///${db.name}?host=${encodeURIComponent(process.env.PGHOST)}&port=${process.env.PGPORT}&user=${process.env.PGUSER ?? "postgres"}` };
  const child = spawn(process.execPath, [NEXT, "start", "-p", String(port), "-H", "127.0.0.1"], { cwd: APP, env, stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  child.stdout.on("data", (d) => (log += d));
  child.stderr.on("data", (d) => (log += d));
  // 'close' waits for the pipes to drain, which 'exit' does not.
  const closed = new Promise((r) => child.once("close", r));
  const direct = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`next start exited ${child.exitCode}: ${log}`);
    try {
      if ((await fetch(direct + "/health")).ok) break;
    } catch {}
    if (Date.now() > deadline) throw new Error(`next start did not answer: ${log}`);
    await new Promise((ok) => setTimeout(ok, 100));
  }
  const proxy = await frontProxy(port);
  return {
    base: `http://127.0.0.1:${proxy.address().port}`,
    direct,
    stop: async () => {
      proxy.close();
      child.kill();
      await closed;
      return log;
    },
  };
}

for (const engine of ENGINES) {
  test(`${engine}: next start admits what the limits allow, in proxy.ts and in a route handler`, async () => {
    const db = await database(engine);
    const app = await nextStart(db);
    try {
      // /api/*: 20 at once, 1 a second; /limited: 10 at once, 1 every 6 s
      for (const [url, burst, perSecond] of [[app.base + "/api/hello", 20, 1], [app.base + "/limited", 10, 1 / 6]]) {
        const started = Date.now();
        const responses = await hammer(url, 8, 10, auth("ann"));
        const seconds = (Date.now() - started) / 1000;
        const admitted = responses.filter((r) => r.status === 200);
        assert.ok(responses.every((r) => r.status === 200 || r.status === 429), url);
        // the burst, and no more than what refilled while the run lasted
        assert.ok(admitted.length >= burst && admitted.length <= burst + Math.ceil(seconds * perSecond), `${url}: ${admitted.length} in ${seconds} s`);
        // every admission the database's (a fallback admission has no headers)
        assert.ok(admitted.every((r) => r.headers.get("x-ratelimit-remaining") !== null), url);
        for (const r of responses) assert.equal(r.headers.get("x-ratelimit-limit"), String(burst), url);
        // refused again (a token may have refilled since the run: a few tries)
        let { r, body } = await get(url, auth("ann"));
        for (let i = 0; i < 3 && r.status !== 429; i++) ({ r, body } = await get(url, auth("ann")));
        assert.equal(r.status, 429);
        assert.deepEqual(Object.keys(body), ["detail", "limit", "remaining", "reset", "retry_after"]);
        assert.equal(body.retry_after, Number(r.headers.get("retry-after")));
        assert.equal((await get(url, auth("bob"))).r.status, 200, "another subject has a bucket of its own");
      }
      // a pro plan, as the signed-in session says (never a header the client writes)
      assert.deepEqual(await statusesOf(app.base + "/api/hello", 21, { ...auth("cy", "pro"), "x-plan": "free" }), Array(21).fill(200));
    } finally {
      await app.stop();
      await db.close();
    }
  });

  // The load test on Next.js: a burst of 2,000 failed sign-ins from 32 concurrent clients
  // (one address, through the proxy) at the login route, whose policy lets 5 failures
  // through and refills one a minute: exactly 5 reach the handler, each seeing its own
  // remaining count once, and no fallback is logged.
  test(`${engine}: a burst of 2,000 sign-ins from 32 clients under next start reaches the handler exactly 5 times`, async () => {
    const db = await database(engine);
    const app = await nextStart(db);
    let log;
    try {
      let left = 2000;
      const client = async () => {
        const out = [];
        while (left-- > 0) {
          const r = await fetch(app.base + "/login", { method: "POST", body: "password=wrong",
            headers: { "content-type": "application/x-www-form-urlencoded" } });
          await r.arrayBuffer();
          out.push(r);
        }
        return out;
      };
      const responses = (await Promise.all(Array.from({ length: 32 }, client))).flat();
      const reached = responses.filter((r) => r.status === 401);
      assert.equal(responses.length, 2000);
      assert.equal(reached.length, 5);
      assert.equal(responses.filter((r) => r.status === 429).length, 1995);
      assert.deepEqual(reached.map((r) => Number(r.headers.get("x-ratelimit-remaining"))).sort(), [0, 1, 2, 3, 4]);
    } finally {
      log = await app.stop();
      await db.close();
    }
    assert.doesNotMatch(log, /could not be reached|could not check/);
  });

  test(`${engine}: under next start, a client chooses no address of its own`, async () => {
    const db = await database(engine);
    const app = await nextStart(db);
    try {
      const form = { method: "POST", headers: { "content-type": "application/x-www-form-urlencoded" }, body: "password=wrong" };
      // through the proxy, rotating the forwarding headers: one client, one bucket (5)
      const statuses = [];
      for (let i = 0; i < 20; i++) {
        const r = await fetch(app.base + "/login", { ...form, headers: { ...form.headers, "x-forwarded-for": `198.51.100.${i}`, "x-real-ip": `198.51.100.${100 + i}` } });
        statuses.push(r.status);
      }
      assert.deepEqual(statuses, [...Array(5).fill(401), ...Array(15).fill(429)]);
      // a victim's address sent by someone else does not lock the victim out
      const victim = await fetch(app.base + "/login", { ...form, headers: { ...form.headers, "x-forwarded-for": "127.0.0.1" } });
      assert.equal(victim.status, 429, "the same client: its own bucket");
      // reached directly, rotating X-Forwarded-For gains nothing either (no X-Real-IP: one bucket)
      const direct = [];
      for (let i = 0; i < 8; i++) {
        const r = await fetch(app.direct + "/api/hello", { headers: { "x-forwarded-for": `203.0.113.${i}` } });
        direct.push(r.status);
      }
      assert.equal((await get(app.direct + "/api/hello")).r.headers.get("x-ratelimit-remaining"), "11");
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
        const r = await fetch(app.base + url, { headers: auth("fay") });
        await r.arrayBuffer(); // Next.js answers a throw with an empty 500
        statuses.push(r.status);
      }
      assert.deepEqual(statuses, [...Array(6).fill(500), ...Array(6).fill(503)]); // the burst of 2 never ran out
      assert.equal(Number(await db.sql("SELECT rl_peek(?, 2, 1, 0) ->> 'remaining'", limitKey("/fail", "user:fay", 0))), 2);
      assert.deepEqual(await statusesOf(app.base + "/fail?how=ok", 3, auth("fay")), [200, 200, 429]);
    } finally {
      const log = await app.stop();
      assert.match(log, /the handler failed/); // Next.js logged the throw it answered 500 for
      await db.close();
    }
  });

  test(`${engine}: the policy the login route sets when it loads limits failed sign-ins; dropped later, a JSON 500`, async () => {
    const db = await database(engine);
    const app = await nextStart(db, { DEMO_PASSWORD: "right" });
    try {
      const attempt = async (password) => (await fetch(app.base + "/login", { method: "POST", headers: {
        ...auth("gus"), "content-type": "application/x-www-form-urlencoded" }, body: `password=${password}` })).status;
      // sign-ins that succeed give their token back: only the failures count
      const statuses = [];
      for (let i = 0; i < 8; i++) statuses.push(await attempt("right"));
      for (let i = 0; i < 6; i++) statuses.push(await attempt("wrong"));
      assert.deepEqual(statuses, [...Array(8).fill(200), ...Array(5).fill(401), 429]);
      const stored = await db.sql("SELECT definition FROM rl_policies WHERE name = ?", "login");
      assert.deepEqual(typeof stored === "string" ? JSON.parse(stored).limits : stored.limits,
        [{ burst: 5, refill_per_minute: 1 }, { period: "day", quota: 50 }]);
      await db.sql("SELECT rl_policy_drop(?)", "login");
      for (let i = 0; i < 3; i++) {
        const { r, body } = await get(app.base + "/login", auth("gus"), { method: "POST" });
        assert.equal(r.status, 500);
        assert.deepEqual(body, { detail: "Rate Limit Policy Missing", route: "POST /login", policy: "login" });
      }
      assert.equal((await get(app.base + "/api/hello", auth("gus"))).r.status, 200); // the rest serves
    } finally {
      await app.stop();
      await db.close();
    }
  });
}
