// The Express middleware, the Fetch-API wrapper and fetchWithRateLimit, through real
// servers on loopback and real HTTP clients, on SQLite and (when a cluster is up:
// PGHOST) PostgreSQL.
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { spawn, execFileSync } = require("node:child_process");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const { fetchWithRateLimit, retryAfterMs, backoffMs, limitKey } = require("..");

const { ROOT, EXTENSION, ENGINES, database, hammer, get, statusesOf, auth } = require("./support");

const { serverEnv, server } = require("./servers");

for (const engine of ENGINES) {
  // The load test: a burst of 2,000 requests from 32 concurrent clients at a route of limit
  // 300, with the limiters' default timeouts: the database answers every check in time, so
  // it alone decides: exactly 300 admitted, each seeing its own remaining count once, and no
  // fallback logged.
  test(`${engine}: a burst of 2,000 requests from 32 clients admits exactly the limit, on Express and the Fetch API`, async () => {
    const db = await database(engine);
    const s = await server(db);
    let log;
    try {
      // the two servers share the database: each run has a subject of its own
      for (const [url, who] of [[s.express + "/exact", "e"], [s.express + "/policy", "e"], [s.fetch + "/exact", "f"]]) {
        const responses = await hammer(url, 32, undefined, auth(who), 2000);
        const admitted = responses.filter((r) => r.status === 200);
        const refused = responses.filter((r) => r.status === 429);
        assert.equal(responses.length, 2000, url);
        assert.equal(admitted.length, 300, url);
        assert.equal(refused.length, 2000 - 300, url);
        const remaining = admitted.map((r) => Number(r.headers.get("x-ratelimit-remaining"))).sort((a, b) => a - b);
        assert.deepEqual(remaining, Array.from({ length: 300 }, (_, i) => i), url);
        for (const r of responses) {
          assert.equal(r.headers.get("x-ratelimit-limit"), "300");
          assert.ok(r.headers.get("ratelimit-policy") && r.headers.get("ratelimit"));
        }
      }
      const { r, body } = await get(s.express + "/exact", auth("e"));
      assert.equal(r.status, 429);
      assert.deepEqual(Object.keys(body), ["detail", "limit", "remaining", "reset", "retry_after"]);
      assert.equal(body.limit, 300);
      assert.equal(body.retry_after, Number(r.headers.get("retry-after")));
    } finally {
      log = await s.stop();
      await db.close();
    }
    assert.doesNotMatch(log, /could not be reached|could not check/);
  });

  test(`${engine}: an unreachable database fails closed on sensitive routes and open elsewhere`, async (t) => {
    if (engine === "postgres" && !(process.env.RL_PG_DIR && process.env.RL_PG_BIN)) return t.skip("needs RL_PG_DIR and RL_PG_BIN");
    const db = await database(engine);
    // SQLite: a lock waited for 50 ms, then the fallback; PostgreSQL: a stopped server refuses
    // at once, and the limiter's own default timeout keeps a busy machine's first check from
    // falling back before the outage
    const s = await server(db, engine === "sqlite" ? 50 : undefined);
    let lock;
    let failure;
    try {
      assert.equal((await get(s.express + "/open", auth("jo"))).r.status, 200);
      if (engine === "sqlite") {
        lock = new (require("better-sqlite3"))(db.name);
        lock.exec("BEGIN EXCLUSIVE");
      } else {
        await db.close();
        execFileSync("runuser", ["-u", "postgres", "--", `${process.env.RL_PG_BIN}/pg_ctl`, "-D", path.join(process.env.RL_PG_DIR, "data"), "-m", "fast", "-w", "stop"]);
      }
      try {
        const statuses = [];
        const timings = [];
        for (let i = 0; i < 30; i++) {
          const started = Date.now();
          statuses.push((await get(s.express + "/open", auth("jo"))).r.status);
          timings.push(Date.now() - started);
        }
        const { r } = await get(s.express + "/login", auth("jo"), { method: "POST" });
        assert.equal(r.status, 503);
        assert.ok(Number(r.headers.get("retry-after")) > 0);
        assert.deepEqual(statuses, [...Array(20).fill(200), ...Array(10).fill(429)]); // half of 40, locally
        assert.ok(Math.max(...timings) < 1000, String(timings));
      } finally {
        if (lock) lock.exec("ROLLBACK");
        else execFileSync("bash", [path.join(ROOT, "scripts", "pg_cluster.sh"), "start"]);
      }
      let r;
      const deadline = Date.now() + 60_000;
      do {
        r = (await get(s.express + "/open", auth("jo"))).r;
        if (r.headers.get("x-ratelimit-remaining") !== null) break;
        await new Promise((ok) => setTimeout(ok, 200));
      } while (Date.now() < deadline);
      assert.equal(r.status, 200);
      assert.equal(r.headers.get("x-ratelimit-remaining"), "38");
    } catch (error) {
      failure = error; // said with the server's log below, never hidden by the log's own checks
    } finally {
      const log = await s.stop();
      if (lock) lock.close();
      if (failure) throw Object.assign(failure, { message: `${failure.message}\nthe server's log:\n${log}` });
      assert.equal(log.split("the database could not be reached").length - 1, 1, log);
      assert.match(log, /the database answers again/);
    }
  });
}

test("fetchWithRateLimit waits as told, gives up at its deadline, retries POST only when safe, and can be cancelled", async () => {
  const db = await database("sqlite");
  const s = await server(db, 5000);
  try {
    const url = s.express + "/retry";
    const as = (user) => ({ headers: auth(user) });
    assert.equal((await fetchWithRateLimit(url, { ...as("a"), jitterMs: 100 })).status, 200);
    let started = Date.now();
    assert.equal((await fetchWithRateLimit(url, { ...as("a"), jitterMs: 100 })).status, 200); // after Retry-After: 1
    assert.ok(Date.now() - started >= 900 && Date.now() - started < 3000);

    await fetchWithRateLimit(url, as("b"));
    started = Date.now();
    assert.equal((await fetchWithRateLimit(url, { ...as("b"), deadlineMs: 300 })).status, 429);
    assert.ok(Date.now() - started < 300);

    await fetchWithRateLimit(url, as("c"));
    started = Date.now();
    assert.equal((await fetchWithRateLimit(url, { ...as("c"), method: "POST" })).status, 429);
    assert.ok(Date.now() - started < 500);
    assert.equal((await fetchWithRateLimit(url, { ...as("c"), method: "POST", retrySafe: true })).status, 200);

    await fetchWithRateLimit(url, as("d"));
    started = Date.now();
    await assert.rejects(fetchWithRateLimit(url, { ...as("d"), signal: AbortSignal.timeout(200) }), { name: "TimeoutError" });
    assert.ok(Date.now() - started < 500);
  } finally {
    await s.stop();
    await db.close();
  }
});

test("Retry-After is read as seconds or a date; backoff is capped, exponential, jittered", () => {
  assert.equal(retryAfterMs("7"), 7000);
  assert.equal(retryAfterMs("Wed, 21 Oct 2015 07:28:00 GMT", Date.UTC(2015, 9, 21, 7, 27, 50)), 10000);
  assert.equal(retryAfterMs("Wed, 21 Oct 2015 07:28:00 GMT", Date.UTC(2015, 9, 21, 7, 28, 10)), 0);
  assert.equal(retryAfterMs("soon"), undefined);
  assert.equal(retryAfterMs(null), undefined);
  const top = { backoffBaseMs: 500, backoffMaxMs: 3000, random: () => 1 };
  assert.deepEqual([0, 1, 2, 3, 4].map((a) => backoffMs(a, top)), [500, 1000, 2000, 3000, 3000]);
});

/** The README's quick start under `title`, pasted into a new project whose packages the
 * README's install line put there (from the checkout's dist/, built by package.sh --sqlite). */
test("sqlite: a lock held elsewhere reaches better-sqlite3 as SQLITE_BUSY, naming the function", () => {
  const Database = require("better-sqlite3");
  const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "rl-busy-")), "app.db");
  const [holder, caller] = [new Database(file), new Database(file, { timeout: 0 })];
  try {
    for (const db of [holder, caller]) db.loadExtension(EXTENSION);
    holder.prepare("SELECT rl_take('k', 5, 60)").get();
    holder.exec("BEGIN IMMEDIATE");
    assert.throws(() => caller.prepare("SELECT rl_take('k', 5, 60)").get(), (e) => {
      assert.equal(e.code, "SQLITE_BUSY");
      assert.match(e.message, /^rl_take: database is locked/);
      return true;
    });
    holder.exec("COMMIT");
    assert.equal(JSON.parse(Object.values(caller.prepare("SELECT rl_take('k', 5, 60)").get())[0]).remaining, 3);
  } finally {
    holder.close();
    caller.close();
  }
});

for (const engine of ENGINES) {
  test(`${engine}: a route whose policy is missing stops the application at startup`, async () => {
    const db = await database(engine);
    try {
      const child = spawn(process.execPath, [path.join(__dirname, "app-server.js")], {
        env: serverEnv(db, 5000, { RL_WEB_EXTRA_POLICY: "no_such_policy" }), stdio: ["ignore", "pipe", "pipe"],
      });
      let log = "";
      child.stderr.on("data", (d) => (log += d));
      const code = await new Promise((resolve) => child.once("close", resolve));
      assert.notEqual(code, 0);
      assert.match(log, /route "\/extra": there is no policy named "no_such_policy" in the database/);
    } finally {
      await db.close();
    }
  });

  test(`${engine}: a policy dropped later answers a JSON 500, logged once`, async () => {
    const db = await database(engine);
    const s = await server(db, 5000);
    let log;
    try {
      for (const base of [s.express, s.fetch]) assert.equal((await get(base + "/gone")).r.status, 200);
      await db.sql("SELECT rl_policy_drop(?)", "web_gone");
      for (const base of [s.express, s.fetch]) {
        const answers = [];
        for (let i = 0; i < 5; i++) answers.push(await get(base + "/gone"));
        assert.deepEqual(answers.map((a) => a.r.status), [500, 500, 500, 500, 500]);
        assert.deepEqual(answers[0].body, { detail: "Rate Limit Policy Missing", route: "/gone", policy: "web_gone" });
        assert.equal((await get(base + "/open", auth(`other-${base}`))).r.status, 200, "other routes go on");
        assert.equal((await get(base + "/counts")).body.missingPolicies, 5);
      }
    } finally {
      log = await s.stop();
      await db.close();
    }
    // once per server (Express, Fetch), not once per request
    assert.equal(log.split('route "/gone": there is no policy named "web_gone"').length - 1, 2, log);
  });

  test(`${engine}: the refused-identifier cache spares the database a flood`, async () => {
    const db = await database(engine);
    const s = await server(db, 5000, { RL_WEB_REFUSAL_CACHE: "10000" });
    try {
      for (const base of [s.express, s.fetch]) {
        const statuses = [];
        const started = performance.now();
        while (performance.now() - started < 3000) {
          const { r, body } = await get(base + "/flood", auth(`flood-${base}`));
          statuses.push(r.status);
          if (r.status === 429) {
            assert.equal(body.detail, "Too Many Requests");
            assert.ok(Number(r.headers.get("retry-after")) >= 1 && r.headers.get("x-ratelimit-limit") === "2");
          }
        }
        const elapsed = (performance.now() - started) / 1000;
        const counts = (await get(base + "/counts")).body;
        console.log(`${engine} ${base === s.express ? "express" : "fetch"}: ${statuses.length} requests in ${elapsed.toFixed(1)} s ` +
          `from one subject; ${counts.checks} reached the database, ${counts.refusedLocally} refused locally`);
        assert.deepEqual(statuses.slice(0, 2), [200, 200]);
        assert.ok(statuses.length > 200, String(statuses.length));
        assert.ok(counts.checks <= 2 + 2 * (elapsed + 1), JSON.stringify(counts));
        assert.equal(counts.refusedLocally, statuses.length - counts.checks);
        assert.equal(statuses.filter((x) => x === 200).length, counts.admitted, "it only ever refuses");
        const calm = [];
        for (let i = 0; i < 3; i++) calm.push((await get(base + "/flood", auth(`calm-${base}`))).r.status);
        assert.deepEqual(calm, [200, 200, 429], "other subjects are unaffected");
        // a route's limits as a function of the request: a refusal is kept for the limits it
        // was given under, so the same customer under other limits (another billing period
        // here, a new plan in an application) is asked of the database again
        const biller = auth(`biller-${base}`);
        const first = base + "/bill?period=month%20from%205", other = base + "/bill?period=month%20from%206";
        const billed = [];
        for (let i = 0; i < 4; i++) billed.push((await get(first, biller)).r.status);
        assert.deepEqual(billed, [200, 200, 200, 429]);
        const before = (await get(base + "/counts")).body;
        assert.equal((await get(first, biller)).r.status, 429);
        assert.equal((await get(other, biller)).r.status, 200, "other limits: asked of the database again");
        const after = (await get(base + "/counts")).body;
        assert.equal(after.refusedLocally, before.refusedLocally + 1);
        assert.equal(after.checks, before.checks + 1);
      }
    } finally {
      await s.stop();
      await db.close();
    }
  });

  test(`${engine}: load shedding answers 503 before any work and never sheds skip paths`, async () => {
    const db = await database(engine);
    const s = await server(db, 5000, { RL_WEB_MAX_IN_FLIGHT: "4" });
    try {
      for (const base of [s.express, s.fetch]) {
        const pending = Array.from({ length: 10 }, () => fetch(base + "/slow?seconds=3", { headers: auth("slow") }));
        // until the first four are in their handler and the rest were shed at once (asked of
        // /counts, a skip path, rather than a fixed wait a busy machine can outrun)
        const deadline = Date.now() + 20000;
        for (;;) {
          const seen = (await get(base + "/counts")).body;
          if (seen.shed === 6 && seen.checks === 4) break;
          assert.ok(Date.now() < deadline && seen.shed <= 6 && seen.checks <= 4, JSON.stringify(seen));
          await new Promise((ok) => setTimeout(ok, 20));
        }
        assert.equal((await get(base + "/health")).r.status, 200, "a health probe is never shed");
        const shed = await get(base + "/open", auth("other"));
        const statuses = (await Promise.all(pending)).map((r) => r.status).sort();
        assert.deepEqual(statuses, [200, 200, 200, 200, 503, 503, 503, 503, 503, 503]);
        assert.equal(shed.r.status, 503);
        assert.equal(shed.r.headers.get("retry-after"), "1");
        assert.deepEqual(shed.body, { detail: "Service Overloaded", retry_after: 1 });
        const counts = (await get(base + "/counts")).body;
        assert.deepEqual([counts.shed, counts.checks], [7, 4], JSON.stringify(counts));
        assert.equal((await get(base + "/open", auth(`after-${base}`))).r.status, 200, "room again once they finish");
      }
    } finally {
      await s.stop();
      await db.close();
    }
  });
}

test("configuration mistakes say what to do and name the database file", () => {
  const { SqliteLimiter } = require("..");
  assert.throws(() => new SqliteLimiter("app.db"), /use SqliteLimiter\.open\("app\.db"\)/);
  const folder = fs.mkdtempSync(path.join(os.tmpdir(), "rl-ro-"));
  const missing = path.join(folder, "no", "such", "folder", "app.db");
  assert.throws(() => SqliteLimiter.open(missing, { extension: EXTENSION }), (e) => e.message.includes(missing));
});

test("sqlite: wait() takes when allowed, sleeps the retry time, and gives up or aborts when told", async () => {
  const { SqliteLimiter } = require("..");
  const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "rl-wait-")), "app.db");
  const limiter = SqliteLimiter.open(file, { extension: EXTENSION });
  const route = { name: "jobs", limits: [{ burst: 1, refill_per_minute: 30 }] }; // a token every two seconds
  let started = performance.now();
  assert.equal((await limiter.wait(route, "tenant:7")).admitted, true);
  assert.ok(performance.now() - started < 800); // at once, not two seconds (room for a busy machine)
  started = performance.now();
  assert.equal((await limiter.wait(route, "tenant:7", { jitter: 0 })).admitted, true);
  const waited = performance.now() - started;
  assert.ok(waited >= 1900 && waited < 4500, String(waited));
  // the next token is two seconds away: a deadline of 900 ms gives up at once, with the refusal
  started = performance.now();
  const given = await limiter.wait(route, "tenant:7", { timeoutMs: 900 });
  assert.equal(given.admitted, false);
  assert.ok(performance.now() - started < 800);
  // no wait admits a cost above the burst
  assert.equal((await limiter.wait(route, "tenant:8", { cost: 5 })).admitted, false);
  // an abort ends the sleep
  const controller = new AbortController();
  setTimeout(() => controller.abort(new Error("stopped")), 100);
  started = performance.now();
  await assert.rejects(limiter.wait(route, "tenant:7", { signal: controller.signal }), /stopped/);
  assert.ok(performance.now() - started < 800);
  limiter.db.close();
});

test("sqlite: metrics count each outcome per route and time the checks", async () => {
  const db = await database("sqlite");
  const s = await server(db, 5000);
  try {
    for (const base of [s.express, s.fetch]) {
      const statuses = await statusesOf(base + "/api/a", 7, auth(`metered-${base}`));
      assert.deepEqual(statuses, [200, 200, 200, 200, 200, 429, 429]);
      const text = await (await fetch(base + "/metrics")).text();
      assert.match(text, /ratelimit_requests_total\{route="GET \/api\/\*",policy="",outcome="admitted"\} 5/);
      assert.match(text, /ratelimit_requests_total\{route="GET \/api\/\*",policy="",outcome="refused"\} 2/);
      assert.match(text, /ratelimit_refused_subject_refusals\{route="GET \/api\/\*",policy="",subject="user:metered-[^"]*"\} 2/);
      assert.match(text, /ratelimit_check_seconds_count\{route="GET \/api\/\*"\} 7/);
    }
  } finally {
    await s.stop();
    await db.close();
  }
});
