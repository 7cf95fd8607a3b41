// One limiter per server process, over the database the app already uses: PostgreSQL
// (DATABASE_URL) or, when RATELIMIT_SQLITE names a file, SQLite with the extension.
import { Pool } from "pg";
import { PostgresLimiter, SqliteLimiter, type Limiter } from "ratelimit-web";

function open(): Limiter {
  const file = process.env.RATELIMIT_SQLITE;
  if (file) return SqliteLimiter.open(file, { extension: process.env.RATELIMIT_EXTENSION });
  const pool = new Pool({ connectionString: process.env.DATABASE_URL, max: 8, connectionTimeoutMillis: 1000 });
  pool.on("error", () => {}); // an idle client lost with the server: the next check says so
  return new PostgresLimiter(pool);
}

export const limiter = open();

// The subject: the signed-in user (here a header the tests set), else the client address.
export const identify = (request: Request) => {
  const user = request.headers.get("x-user");
  return user ? `user:${user}` : undefined;
};

// The options every limited place shares. `next start` sets X-Forwarded-For to the peer:
// believe what a local proxy adds before it. A check the database has not answered within
// checkTimeoutMs falls back (the tests, which count admissions exactly, allow 5 s).
export const shared = {
  limiter,
  identify,
  trustedProxies: ["127.0.0.1/32", "::1/128"],
  checkTimeoutMs: Number(process.env.RATELIMIT_CHECK_TIMEOUT_MS ?? 50),
};
