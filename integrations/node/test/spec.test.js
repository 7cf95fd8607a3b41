// The behaviour spec every web package shares (integrations/spec/cases.json): its rule
// cases against the package's rules (src/core.ts), and its HTTP cases through raw sockets
// against the test application's Express and Fetch-API servers, on SQLite and (when a
// cluster is up: PGHOST) PostgreSQL. The Python suite runs the same file
// (integrations/python/tests/test_spec.py).
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const net = require("node:net");
const { clientAddress, networks, normalizeIdentifier, normalizePath, refundRule, RateLimitCore, RequestLimits,
  DatabaseUnavailable, charge, databaseOf, refund, routeFor, UNKNOWN_POLICY_PREFIXES, UNKNOWN_POLICY_SQLSTATE } = require("..");
const { attachLimits } = require("../dist/core");
const { SPEC, CASES, ENGINES, database, token } = require("./support");
const { server } = require("./servers");

const TRUSTED = networks(SPEC.options.trusted_proxies);
const BUCKET = [{ burst: 1, refill_per_minute: 1 }];
const limiter = { check: async () => { throw new Error("no database here"); }, refund: async () => {} };

test("client addresses", () => {
  for (const c of CASES.address) {
    assert.equal(clientAddress(c.peer, c.forwarded, TRUSTED, c.ipv6_prefix ?? 56), c.expect, JSON.stringify(c));
  }
});

test("a route's limits function: its answer for each request, checked as fixed limits are", () => {
  const plans = { ann: "month from 3 in Europe/Paris", bob: "month from 20" };
  const core = new RateLimitCore({ limiter, routes: { "/bill": { limits: (user) => [{ period: plans[user], quota: 3 }] } } });
  const route = core.match("GET", "/bill");
  assert.deepEqual(routeFor(route, "ann").limits, [{ period: "month from 3 in Europe/Paris", quota: 3 }]);
  assert.equal(routeFor(route, "bob").limits[0].period, "month from 20");
  assert.equal(typeof route.limits, "function", "the route itself is left as it was");
  const fixed = { name: "/x", limits: BUCKET };
  assert.equal(routeFor(fixed, "ann"), fixed);
  for (const wrong of [[], { period: "month" }, ["month"], undefined]) {
    assert.throws(() => routeFor({ name: "/bill", limits: () => wrong }, "ann"),
      /^Error: route "\/bill": limits\(request\): limits must be a list of limit objects/);
  }
  assert.throws(() => new RateLimitCore({ limiter, routes: { "/x": { limits: "month" } } }), /route \/x: limits must be a list/);
});

test("paths as routers dispatch them", () => {
  for (const c of CASES.path) {
    assert.equal(normalizePath(c.path, { caseInsensitive: c.case_insensitive ?? false, formats: c.formats ?? false }), c.expect,
      JSON.stringify(c));
  }
});

test("route matching", () => {
  for (const c of CASES.match) {
    const core = new RateLimitCore({ limiter, routes: Object.fromEntries(c.routes.map((r) => [r, { limits: BUCKET }])),
      skip: c.skip ?? [], caseInsensitivePaths: c.case_insensitive ?? false, pathFormats: c.formats ?? false });
    assert.equal(core.match(c.method, c.path)?.name ?? null, c.expect, JSON.stringify(c));
  }
});

test("identifiers", () => {
  for (const c of CASES.identifier) {
    const value = c.repeat ? c.input.repeat(c.repeat) : c.input;
    const got = normalizeIdentifier(value, { caseInsensitive: c.case_insensitive ?? false });
    if (c.expect_length) {
      assert.equal(got.length, c.expect_length, JSON.stringify(c));
      assert.ok(got.startsWith(c.expect_prefix), JSON.stringify(c));
    } else {
      assert.equal(got ?? null, c.expect, JSON.stringify(c));
    }
  }
});

test("the keys of explicit limits", () => {
  const { limitKey } = require("..");
  for (const c of CASES.key) assert.equal(limitKey(c.route, c.subject, c.index), c.expect, JSON.stringify(c));
});

test("refunds", () => {
  for (const c of CASES.refund) {
    const core = new RateLimitCore({ limiter, refundOn: c.middleware ?? undefined,
      routes: { "/r": { limits: BUCKET, refundOn: c.refund_on ?? undefined, sensitive: c.sensitive ?? false } } });
    assert.equal(core.refunds(core.match("GET", "/r"), c.status), c.expect, JSON.stringify(c));
  }
  assert.equal(refundRule(undefined), undefined);
});

// charge() and refund() where the HTTP cases cannot reach; the charges themselves, on both
// servers and engines, are the spec's HTTP case
test("charge and refund: a request no route admitted, a cost that is no cost, a database that does not answer", async () => {
  await assert.rejects(async () => charge({}, 5), /not admitted by a rate-limited route/);
  await assert.rejects(async () => refund({}, 5), /not admitted by a rate-limited route/);
  const calls = [];
  const logged = [];
  let down = false;
  const fake = { ...limiter,
    charge: async (route, subject, tier, cost) => {
      calls.push(["charge", subject, tier, cost]);
      if (down) throw new DatabaseUnavailable("connection refused");
      return { result: { admitted: true }, headers: { "X-RateLimit-Remaining": "7" }, admitted: true };
    },
    refund: async (route, subject, tier, cost) => {
      calls.push(["refund", subject, tier, cost]);
      if (down) throw new DatabaseUnavailable("connection refused");
    } };
  const core = new RateLimitCore({ limiter: fake, log: (m) => logged.push(m), routes: { "/ai": { limits: BUCKET } } });
  const told = [];
  const request = {};
  const limits = attachLimits(request, new RequestLimits(core, core.match("GET", "/ai"), "user:ann", "pro",
    { "X-RateLimit-Remaining": "9" }, (h) => told.push(h)));
  for (const bad of [0, -1, NaN, Infinity, "5", undefined]) {
    await assert.rejects(async () => charge(request, bad), { name: "RangeError", message: `charge: cost must be a finite number greater than 0, got ${String(bad)}` });
    await assert.rejects(async () => refund(request, bad), { name: "RangeError" });
  }
  assert.deepEqual(calls, []);
  assert.equal((await charge(request, 3)).admitted, true);
  await refund(request, 2);
  assert.deepEqual(limits.headers, { "X-RateLimit-Remaining": "7" });
  assert.deepEqual(told, [{ "X-RateLimit-Remaining": "7" }]);
  down = true;
  assert.equal(await charge(request, 3), undefined);
  await refund(request, 3);
  assert.deepEqual(limits.headers, { "X-RateLimit-Remaining": "7" });
  assert.deepEqual(calls.map((c) => c[3]), [3, 2, 3, 3]);
  assert.deepEqual(logged, ["ratelimit-web: could not charge /ai for user:ann: connection refused",
    "ratelimit-web: could not refund /ai for user:ann: connection refused"]);
});

test("what a database string names", () => {
  for (const c of CASES.database) {
    const exists = (p) => Boolean(c.file_exists) && p === c.db;
    if (c.expect === null) assert.throws(() => databaseOf(c.db, exists), /names no database: a PostgreSQL one is postgresql:/, c.db);
    else assert.deepEqual(databaseOf(c.db, exists), c.expect, c.db);
  }
});

test("the unknown policy's codes are the spec's", () => {
  assert.equal(UNKNOWN_POLICY_SQLSTATE, CASES.unknown_policy.sqlstate);
  assert.deepEqual(UNKNOWN_POLICY_PREFIXES, CASES.unknown_policy.sqlite_prefixes);
});

/** One request exactly as written (no client normalizes its path), on a connection of its
 * own: { status, headers (lower-case names), body }. */
function exchange(port, method, target, headers, source = "127.0.0.1") {
  return new Promise((resolve, reject) => {
    const lines = [`${method} ${target} HTTP/1.1`, `Host: 127.0.0.1:${port}`, "Connection: close",
      ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`)];
    if (["POST", "PUT", "PATCH"].includes(method)) lines.push("Content-Length: 0");
    const socket = net.connect({ host: "127.0.0.1", port, localAddress: source }, () => socket.write(lines.join("\r\n") + "\r\n\r\n"));
    const chunks = [];
    socket.on("data", (c) => chunks.push(c));
    socket.on("error", reject);
    socket.on("end", () => {
      const raw = Buffer.concat(chunks);
      const split = raw.indexOf("\r\n\r\n");
      const [statusLine, ...headerLines] = raw.subarray(0, split).toString("latin1").split("\r\n");
      const got = {};
      for (const line of headerLines) {
        const at = line.indexOf(":");
        got[line.slice(0, at).trim().toLowerCase()] = line.slice(at + 1).trim();
      }
      let body = raw.subarray(split + 4);
      if (got["transfer-encoding"] === "chunked") {
        const parts = [];
        for (let at = 0; ;) {
          const eol = body.indexOf("\r\n", at);
          const size = parseInt(body.subarray(at, eol).toString(), 16);
          if (!size) break;
          parts.push(body.subarray(eol + 2, eol + 2 + size));
          at = eol + 4 + size;
        }
        body = Buffer.concat(parts);
      }
      resolve({ status: Number(statusLine.split(" ")[1]), headers: got, body: body.toString("utf8") });
    });
  });
}

async function runCase(port, c) {
  const runsBefore = JSON.parse((await exchange(port, "GET", "/runs", {})).body);
  for (const [n, step] of c.steps.entries()) {
    const where = `${c.name}: step ${n + 1} ${JSON.stringify(step)}`;
    if (step.runs) {
      const after = JSON.parse((await exchange(port, "GET", "/runs", {})).body);
      const ran = (after[step.runs] ?? 0) - (runsBefore[step.runs] ?? 0);
      if ("expect" in step) assert.equal(ran, step.expect, `${where}: the handler ran ${ran} times`);
      if ("at_most" in step) assert.ok(ran <= step.at_most, `${where}: the handler ran ${ran} times`);
      continue;
    }
    const headers = { ...(step.send ?? {}) };
    if (step.as) headers.Authorization = `Bearer ${token(step.as, step.plan)}`;
    if (step.as_long) headers.Authorization = `Bearer ${token("u".repeat(step.as_long))}`;
    const target = step.path + (step.query ? `?${step.query}` : "");
    const source = step.via === "proxy" ? SPEC.trusted_proxy_address : "127.0.0.1";
    const method = step.method ?? "GET";
    const statuses = [];
    for (let i = 0; i < (step.repeat ?? 1); i++) {
      const got = await exchange(port, method, target, headers, source);
      statuses.push(got.status);
      if (got.status === 500) {
        assert.ok(SPEC.fails_on_purpose.some((p) => step.path.startsWith(p)), `${where}: 500 ${got.body.slice(0, 300)}`);
      }
      if ("status" in step) assert.equal(got.status, step.status, `${where}: answer ${i + 1} ${got.body.slice(0, 200)}`);
      if ("status_not" in step) assert.notEqual(got.status, step.status_not, `${where}: answer ${i + 1}`);
      for (const [name, value] of Object.entries(step.headers ?? {})) {
        assert.equal(got.headers[name.toLowerCase()], value, `${where}: ${name}`);
      }
      for (const name of step.no_headers ?? []) assert.equal(got.headers[name.toLowerCase()], undefined, `${where}: has ${name}`);
      for (const [name, most] of Object.entries(step.headers_within ?? {})) {
        const value = got.headers[name.toLowerCase()];
        assert.ok(/^\d+$/.test(value ?? "") && Number(value) >= 1 && Number(value) <= most, `${where}: ${name} was ${value}`);
      }
      if (step.body && method !== "HEAD") {
        const answer = JSON.parse(got.body);
        for (const [key, value] of Object.entries(step.body)) assert.deepEqual(answer[key], value, `${where}: body ${got.body}`);
      }
      if (step.body_within && method !== "HEAD") {
        const answer = JSON.parse(got.body);
        for (const [key, most] of Object.entries(step.body_within)) {
          assert.ok(Number.isInteger(answer[key]) && answer[key] >= 1 && answer[key] <= most, `${where}: body ${got.body}`);
        }
      }
    }
    if (step.statuses) assert.deepEqual(statuses, step.statuses, where);
  }
}

for (const engine of ENGINES) {
  for (const kind of ["express", "fetch"]) {
    test(`${engine} ${kind}: the HTTP cases`, async () => {
      const db = await database(engine);
      const s = await server(db);
      try {
        const port = Number(new URL(s[kind]).port);
        for (const c of CASES.http) await runCase(port, c);
      } finally {
        await s.stop();
        await db.close();
      }
    });
  }
}
