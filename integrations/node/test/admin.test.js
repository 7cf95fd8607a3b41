// The operator's page for Express and the Fetch API (AdminView), on SQLite and (when a
// cluster is up: PGHOST) PostgreSQL, over real HTTP: the page and its state, unblocking,
// 403 for an unauthorised request, a form post refused, and the application's own role
// (not in rl_admin) unable to unblock. The page itself is the Python package's, which
// integrations/python/tests/test_admin.py drives in headless Chromium.
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { ENGINES, EXTENSION, database } = require("./support");
const { AdminView } = require("..");

const TOKEN = "ops=let-me-in";
const authorize = (r) => (r.headers.cookie ?? "").includes(TOKEN);

/** The application's database with refusals and blocks, and the administrator's URL. */
async function application(engine) {
  const db = await database(engine);
  await db.sql("SELECT rl_policy_set('login', ?)", '{"limits": [{"burst": 2, "refill_per_minute": 0.001}]}');
  await db.sql("SELECT rl_stats_reset()");
  for (let i = 0; i < 6; i++) await db.sql("SELECT rl_check('login', 'ip:203.0.113.9')");
  await db.sql("SELECT rl_block('ip:192.0.2.66', NULL)");
  await db.sql("SELECT rl_block('user:mallory', 3600)");
  let url = db.name, appUrl = db.name;
  if (engine === "postgres") {
    const ops = `ops_${db.name}`, app = `app_${db.name}`;
    for (const role of [ops, app]) await db.sql(`DROP ROLE IF EXISTS ${role}`);
    await db.sql(`CREATE ROLE ${ops} LOGIN IN ROLE rl_admin`);
    await db.sql(`CREATE ROLE ${app} LOGIN`);
    url = `dbname=${db.name} user=${ops}`;
    appUrl = `dbname=${db.name} user=${app}`;
  }
  const list = engine === "postgres" ? "string_agg(subject, ' ' ORDER BY subject)" : "group_concat(subject, ' ')";
  const blocked = async () => (await db.sql(`SELECT ${list} FROM (SELECT subject FROM rl_blocks ORDER BY subject) AS b`)) ?? "";
  return { db, url, appUrl, blocked };
}

for (const engine of ENGINES) {
  test(`${engine}: the page behind Express`, async () => {
    const express = require("express");
    const { db, url, appUrl, blocked } = await application(engine);
    const admin = new AdminView({ database: url, authorize, extension: EXTENSION });
    const site = express();
    site.use("/ratelimit", admin.express);
    const server = await new Promise((resolve) => { const s = site.listen(0, "127.0.0.1", () => resolve(s)); });
    const base = `http://127.0.0.1:${server.address().port}/ratelimit/`;
    try {
      for (const [method, where] of [["GET", ""], ["GET", "state"], ["POST", "unblock"]]) {
        const r = await fetch(base + where, { method, headers: { "content-type": "application/json" },
                                              body: method === "POST" ? '{"subject": "user:mallory"}' : undefined });
        assert.equal(r.status, 403);
        assert.deepEqual(await r.json(), { error: "forbidden" });
      }
      const ok = { cookie: TOKEN };
      const page = await fetch(base, { headers: ok });
      assert.match(await page.text(), /<title>Rate limits: who is being limited<\/title>/);
      const state = await (await fetch(base + "state", { headers: ok })).json();
      assert.equal(state.policies[0].name, "login");
      assert.deepEqual(state.policies[0].counts, { admitted: 2, refused: 4, would_refuse: 0, refused_blocked: 0 });
      assert.deepEqual(state.refused.map((r) => [r.subject, r.refusals, r.error]), [["ip:203.0.113.9", 4, 0]]);
      assert.deepEqual(state.blocks.map((b) => [b.subject, b.blocked_until_ms === null]), [["ip:192.0.2.66", true], ["user:mallory", false]]);
      const form = await fetch(base + "unblock", { method: "POST", headers: { ...ok, "content-type": "application/x-www-form-urlencoded" },
                                                 body: "subject=user%3Amallory" });
      assert.equal(form.status, 415);
      const lifted = await fetch(base + "unblock", { method: "POST", headers: { ...ok, "content-type": "application/json" },
                                                   body: JSON.stringify({ subject: "user:mallory" }) });
      assert.deepEqual(await lifted.json(), { subject: "user:mallory", unblocked: true });
      assert.equal(await blocked(), "ip:192.0.2.66");
      // the Fetch API form of the same view
      const answer = await admin.fetch(new Request("http://app.test/ratelimit/state", { headers: ok }), "/ratelimit");
      assert.equal(answer.status, 200);
      assert.equal((await answer.json()).blocks.length, 1);
      const refused = await admin.fetch(new Request("http://app.test/ratelimit/state"), "/ratelimit");
      assert.equal(refused.status, 403);
      if (engine === "postgres") {
        const asApp = new AdminView({ database: appUrl, authorize: () => true });
        const denied = await asApp.handle({ method: "POST", path: "unblock", headers: { "content-type": "application/json" } },
                                          '{"subject": "ip:192.0.2.66"}');
        assert.equal(denied.status, 403);
        assert.match(JSON.parse(denied.body).error, /permission denied/);
        assert.equal((await asApp.handle({ method: "GET", path: "state", headers: {} })).status, 403);
        await asApp.close();
        assert.equal(await blocked(), "ip:192.0.2.66");
      }
    } finally {
      server.close();
      await admin.close();
      await db.close();
    }
  });
}

test("AdminView refuses to exist without an authorize function", () => {
  assert.throws(() => new AdminView({ database: "x.db" }), /authorize/);
});
