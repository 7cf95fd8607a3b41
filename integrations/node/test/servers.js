// The test application's two servers (Express, Fetch API) in a child process
// (app-server.js), for the suites that send them requests.
"use strict";
const { spawn } = require("node:child_process");
const path = require("node:path");
const { EXTENSION } = require("./support");

/** Its environment: the database, and the limiter's timeout when `timeoutMs` is given
 * (else the limiter's default, as a user gets it). */
function serverEnv(db, timeoutMs, settings = {}) {
  return { ...process.env, RL_WEB_ENGINE: db.engine, RL_WEB_DB: db.name, RL_WEB_EXTENSION: EXTENSION,
    ...(timeoutMs === undefined ? {} : { RL_WEB_TIMEOUT_MS: String(timeoutMs) }), ...settings };
}

async function server(db, timeoutMs, settings = {}) {
  const child = spawn(process.execPath, [path.join(__dirname, "app-server.js")], {
    env: serverEnv(db, timeoutMs, settings),
    stdio: ["ignore", "pipe", "pipe"],
  });
  let log = "";
  child.stderr.on("data", (d) => (log += d));
  // 'close' comes after the child's pipes are drained; 'exit' can come first, with
  // the last lines it wrote to stderr still unread (seen on a busy machine).
  const closed = new Promise((r) => child.once("close", r));
  const ports = await new Promise((resolve, reject) => {
    let out = "";
    child.stdout.on("data", (d) => {
      out += d;
      const m = /listening (\d+) (\d+)/.exec(out);
      if (m) resolve([m[1], m[2]]);
    });
    child.on("exit", (code) => reject(new Error(`server exited ${code}: ${log}`)));
  });
  return {
    express: `http://127.0.0.1:${ports[0]}`,
    fetch: `http://127.0.0.1:${ports[1]}`,
    stop: async () => {
      child.kill();
      await closed;
      return log;
    },
  };
}

module.exports = { serverEnv, server };
