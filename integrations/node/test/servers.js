// The test application's two servers (Express, Fetch API) in a child process
// (app-server.js), for the suites that send them requests.
"use strict";
const { spawn } = require("node:child_process");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const { EXTENSION } = require("./support");

/** Its environment: the database, and the limiter's timeout when `timeoutMs` is given
 * (else the limiter's default, as a user gets it). */
function serverEnv(db, timeoutMs, settings = {}) {
  return { ...process.env, RL_WEB_ENGINE: db.engine, RL_WEB_DB: db.name, RL_WEB_EXTENSION: EXTENSION,
    ...(timeoutMs === undefined ? {} : { RL_WEB_TIMEOUT_MS: String(timeoutMs) }), ...settings };
}

async function server(db, timeoutMs, settings = {}) {
  // the limiters' log lines, appended to a file as they are written: a pipe's last lines
  // can still be unread when a killed child is gone (seen once on a busy machine)
  const logFile = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "rl-web-")), "server.log");
  const child = spawn(process.execPath, [path.join(__dirname, "app-server.js")], {
    env: { ...serverEnv(db, timeoutMs, settings), RL_WEB_LOG: logFile },
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
      const lines = fs.existsSync(logFile) ? fs.readFileSync(logFile, "utf8") : "";
      fs.rmSync(path.dirname(logFile), { recursive: true, force: true });
      return log + lines;
    },
  };
}

module.exports = { serverEnv, server };
