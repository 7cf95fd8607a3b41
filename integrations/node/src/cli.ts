#!/usr/bin/env node
// `ratelimit-web`: policies and blocks from the command line, over a database URL
// (PostgreSQL: postgresql://... or a libpq string such as dbname=app, through `pg`) or a
// SQLite file (a name ending in .db, an existing file, or sqlite:PATH) (through better-sqlite3 and sqlite-ratelimit), the same commands as the Python
// and Ruby packages' tool:
//
//   ratelimit-web --db app.db policy set login '{"limits": [{"burst": 5, "refill_per_minute": 5}]}'
//   ratelimit-web --db app.db policy list | policy drop login
//   ratelimit-web --db app.db block ip:203.0.113.9 --seconds 3600 | blocks | unblock ip:203.0.113.9
//
// --db defaults to RATELIMIT_DATABASE. An error of the engine is printed as it says it,
// with exit status 1.
import { databaseOf } from "./core";

const USAGE = "usage: ratelimit-web [--db DB] policy set NAME JSON | policy list | policy drop NAME | " +
  "block SUBJECT [--seconds N] | unblock SUBJECT | blocks";

type Row = unknown[];

export interface Database {
  rows(sql: string, params?: unknown[]): Promise<Row[]>;
  close(): Promise<void>;
}

/** A libpq key=value string (dbname=app host=...) as node-postgres' settings. */
function libpq(text: string): Record<string, string> {
  const names: Record<string, string> = { dbname: "database" };
  const settings: Record<string, string> = {};
  for (const [, key, quoted, bare] of text.matchAll(/(\w+)\s*=\s*(?:'((?:[^'\\]|\\.)*)'|(\S+))/g)) {
    settings[names[key] ?? key] = quoted !== undefined ? quoted.replace(/\\(.)/g, "$1") : bare;
  }
  return settings;
}

/** One connection to `db` (PostgreSQL through `pg`, or a SQLite file with the extension). */
export async function open(text: string, extension?: string): Promise<Database> {
  const [kind, db] = databaseOf(text);
  if (kind === "postgres") {
    const { Client } = require("pg");
    const client = new Client(db.includes("://") ? { connectionString: db } : libpq(db));
    await client.connect();
    return {
      rows: async (sql, params = []) => (await client.query({ text: sql, values: params, rowMode: "array" })).rows,
      close: () => client.end(),
    };
  }
  const Sqlite = require("better-sqlite3");
  const conn = new Sqlite(db, { timeout: 5000 });
  conn.loadExtension(extension || process.env.RATELIMIT_SQLITE_EXTENSION || require("sqlite-ratelimit").getLoadablePath());
  return {
    rows: async (sql, params = []) => {
      const statement = conn.prepare(sql.replace(/\$\d+/g, "?"));
      return statement.reader ? statement.raw().all(...params) : (statement.run(...params), []);
    },
    close: async () => conn.close(),
  };
}

function decoded(value: unknown): unknown {
  return typeof value === "string" && /^[[{]/.test(value) ? JSON.parse(value) : value;
}

const truthy = (value: unknown) => value === true || value === 1;

// What a terminal must never be sent raw: controls (C0, DEL, C1, which move the cursor, clear
// the screen, set the title or write the clipboard), format characters (bidirectional
// overrides, zero-width ones), line and paragraph separators, and code points that are
// unassigned, private or lone surrogates.
const HIDDEN = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Co}\p{Cs}\p{Cn}]/gu;

/** `text` safe to write to a terminal: every character a terminal would act on, or that
 * hides or reorders what follows, written as its \uXXXX escape (JSON's own, so a JSON line
 * stays JSON), the rest as it is. */
export function visible(text: string): string {
  return text.replace(HIDDEN, (ch) => [...Array(ch.length).keys()]
    .map((i) => "\\u" + ch.charCodeAt(i).toString(16).padStart(4, "0")).join(""));
}

export async function main(argv: string[], write = (line: string) => console.log(line),
                           writeErr = (line: string) => console.error(line)): Promise<number> {
  // every line names subjects, keys or the engine's words: none reaches the terminal raw
  const out = (line: string) => write(visible(line));
  const err = (line: string) => writeErr(visible(line));
  let db = process.env.RATELIMIT_DATABASE;
  let seconds: number | null = null;
  const args: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--db") db = argv[++i];
    else if (argv[i] === "--seconds") seconds = Number(argv[++i]);
    else args.push(argv[i]);
  }
  const usage = (problem?: string) => { if (problem) err(`ratelimit-web: ${problem}`); err(USAGE); return 2; };
  if (!db) return usage("give --db (or set RATELIMIT_DATABASE)");
  if (seconds !== null && !Number.isFinite(seconds)) return usage("--seconds takes a number");
  const command = args[0] === "policy" ? `policy ${args[1] ?? ""}` : args[0];
  const rest = args.slice(args[0] === "policy" ? 2 : 1);
  const arity: Record<string, number> = { "policy set": 2, "policy list": 0, "policy drop": 1, block: 1, unblock: 1, blocks: 0 };
  if (arity[command] !== rest.length) return usage();
  let conn: Database | undefined;
  try {
    conn = await open(db);
    const value = async (sql: string, params: unknown[]) => decoded((await conn!.rows(sql, params))[0]?.[0]);
    switch (command) {
      case "policy set":
        out(JSON.stringify(await value("SELECT rl_policy_set($1, $2)", rest)));
        break;
      case "policy list":
        for (const [name, definition] of await conn.rows("SELECT name, definition FROM rl_policies ORDER BY name")) {
          out(JSON.stringify({ name, definition: decoded(definition) }));
        }
        break;
      case "policy drop":
        out(truthy(await value("SELECT rl_policy_drop($1)", rest)) ? `dropped ${rest[0]}` : `there was no policy named ${rest[0]}`);
        break;
      case "block":
        out(JSON.stringify(await value("SELECT rl_block($1, $2)", [rest[0], seconds])));
        break;
      case "unblock":
        out(truthy(await value("SELECT rl_unblock($1)", rest)) ? `unblocked ${rest[0]}` : `${rest[0]} was not blocked`);
        break;
      default:
        for (const [subject, strikes, until] of await conn.rows(
          "SELECT subject, strikes, blocked_until_ms FROM rl_blocks ORDER BY subject")) {
          out(JSON.stringify({ subject, strikes: Number(strikes), blocked_until_ms: until === null ? null : Number(until) }));
        }
    }
    return 0;
  } catch (e) {
    const message = String((e as Error)?.message ?? e).trim().split("\n")[0];
    err(`ratelimit-web: ${message || (e as Error)?.name}`);
    return 1;
  } finally {
    await conn?.close().catch(() => undefined);
  }
}

if (require.main === module) {
  main(process.argv.slice(2)).then((code) => { process.exitCode = code; });
}
