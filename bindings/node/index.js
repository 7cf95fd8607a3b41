"use strict";
// The sqlite ratelimit loadable extension, for better-sqlite3 and node:sqlite (and any
// driver that loads SQLite extensions by path).
const path = require("path");

/** The extension's path without its suffix, as loadExtension and `.load` take it. */
function getLoadablePath() {
  return path.join(__dirname, "libratelimit");
}

/**
 * Loads the extension into `db`: a better-sqlite3 Database (loadExtension), or a
 * node:sqlite DatabaseSync opened with { allowExtension: true } (loadExtension too).
 */
function load(db) {
  db.loadExtension(getLoadablePath());
}

module.exports = { getLoadablePath, load };
