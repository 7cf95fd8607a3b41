// What the Node tests share: the database each test gets (SQLite, or PostgreSQL when a
// cluster is up: PGHOST), its policies, and concurrent real HTTP clients.
"use strict";
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");

const ROOT = path.resolve(__dirname, "../../..");
const EXTENSION = path.join(ROOT, "target", "release", "libratelimit");
// the test application every web package serves, and the cases they all run
const SPEC = JSON.parse(fs.readFileSync(path.join(ROOT, "integrations", "spec", "app.json"), "utf8"));
const CASES = JSON.parse(fs.readFileSync(path.join(ROOT, "integrations", "spec", "cases.json"), "utf8"));
// web_flood gives one token back every second: a flood from one subject is refused with a wait of about 1 s
const POLICIES = SPEC.policies;

const signature = (claim) => require("node:crypto").createHmac("sha256", SPEC.secret).update(claim).digest("hex").slice(0, 16);

/** A bearer token for `user` (and `plan`), as the tests' client makes it. */
function token(user, plan) {
  const claim = encodeURIComponent(user) + (plan ? `:${plan}` : "");
  return `${claim}.${signature(claim)}`;
}

/** [user, plan] of a valid bearer token, else []: the tests' stand-in for a session check. */
function signedIn(authorization) {
  if (!authorization || !authorization.startsWith("Bearer ")) return [];
  const value = authorization.slice("Bearer ".length);
  const dot = value.lastIndexOf(".");
  const claim = value.slice(0, dot);
  if (dot <= 0 || value.slice(dot + 1) !== signature(claim)) return [];
  const [user, plan] = claim.split(":");
  return [decodeURIComponent(user), plan || undefined];
}

/** The headers of a request signed in as `user`. */
const auth = (user, plan) => ({ authorization: `Bearer ${token(user, plan)}` });
const ENGINES = ["sqlite", ...(process.env.PGHOST ? ["postgres"] : [])];
let serial = 0;

/** The application's database, as the test sees it. */
async function database(engine) {
  if (engine === "sqlite") {
    const Database = require("better-sqlite3");
    const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "rl-web-")), "app.db");
    const db = new Database(file);
    db.loadExtension(EXTENSION);
    db.pragma("journal_mode = WAL");
    const sql = async (text, ...args) => Object.values(db.prepare(text).get(...args) ?? {})[0];
    for (const [name, d] of Object.entries(POLICIES)) await sql("SELECT rl_policy_set(?, ?)", name, JSON.stringify(d));
    return { engine, name: file, sql, close: async () => db.close() };
  }
  const { Client } = require("pg");
  const name = `rl_web_node_${process.pid}_${serial++}`;
  const admin = new Client({ database: "postgres" });
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS ${name}`);
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  let client = new Client({ database: name });
  await client.connect();
  await client.query("CREATE EXTENSION pg_ratelimit");
  const sql = async (text, ...args) => {
    let n = 0;
    const rows = (await client.query(text.replace(/\?/g, () => `$${++n}`), args)).rows;
    return rows[0] && Object.values(rows[0])[0];
  };
  for (const [name2, d] of Object.entries(POLICIES)) await sql("SELECT rl_policy_set(?, ?)", name2, JSON.stringify(d));
  return { engine, name, sql, close: async () => client.end().catch(() => {}) };
}

/** `clients` concurrent clients sending `each` requests (or `total` among them, as each
 * finishes its last): every response, its body read. */
async function hammer(url, clients = 8, each = 2000, headers = {}, total = undefined) {
  let left = total;
  const one = async () => {
    const out = [];
    for (let i = 0; total === undefined ? i < each : left-- > 0; i++) {
      const r = await fetch(url, { headers });
      await r.arrayBuffer();
      out.push(r);
    }
    return out;
  };
  return (await Promise.all(Array.from({ length: clients }, one))).flat();
}

const get = (url, headers = {}, init = {}) => fetch(url, { headers, ...init }).then(async (r) => ({ r, body: await r.json() }));
const statusesOf = async (url, n, headers, init) => {
  const out = [];
  for (let i = 0; i < n; i++) out.push((await get(url, headers, init)).r.status);
  return out;
};

module.exports = { ROOT, EXTENSION, SPEC, CASES, POLICIES, ENGINES, database, hammer, get, statusesOf, token, signedIn, auth };
