// One limiter per server process, over the database the app already uses: SQLite by
// default (ratelimit.db beside the app, or the file RATELIMIT_SQLITE names; the extension
// comes with the sqlite-ratelimit package), PostgreSQL when DATABASE_URL is set.
import { createHmac, timingSafeEqual } from "node:crypto";
import { Pool } from "pg";
import { peers, PostgresLimiter, SqliteLimiter, type Limiter } from "ratelimit-web";

function open(): Limiter {
  if (process.env.DATABASE_URL) {
    const pool = new Pool({ connectionString: process.env.DATABASE_URL, max: 8, connectionTimeoutMillis: 1000 });
    pool.on("error", () => {}); // an idle client lost with the server: the next check says so
    return new PostgresLimiter(pool);
  }
  return SqliteLimiter.open(process.env.RATELIMIT_SQLITE ?? "ratelimit.db");
}

export const limiter = open();

/** Who is signed in, and on which plan: your session check goes here. This example reads a
 * bearer token `user[:plan].signature`, the signature the first 16 hex digits of
 * HMAC-SHA256 of what precedes it under SESSION_SECRET (without one, nobody is signed in).
 * Never take the user or the plan from a header the client writes freely. */
export function signedIn(request: Request): { user?: string; plan?: string } {
  const secret = process.env.SESSION_SECRET;
  const value = request.headers.get("authorization")?.replace(/^Bearer /, "");
  if (!secret || !value) return {};
  const dot = value.lastIndexOf(".");
  const claim = value.slice(0, dot);
  const expected = Buffer.from(createHmac("sha256", secret).update(claim).digest("hex").slice(0, 16));
  const given = Buffer.from(value.slice(dot + 1));
  if (dot <= 0 || given.length !== expected.length || !timingSafeEqual(given, expected)) return {};
  const [user, plan] = claim.split(":");
  return { user: decodeURIComponent(user), plan: plan || undefined };
}

// What every limited place shares. The subject: the signed-in user, else the client's
// address, which a Fetch-API Request does not carry: here X-Real-IP, as a proxy in front
// sets it (nginx: proxy_set_header X-Real-IP $remote_addr; Vercel sets it too). Reached
// directly, `next start` knows no address a client cannot choose: keep it behind one.
export const shared = {
  limiter,
  identify: (request: Request) => {
    const { user } = signedIn(request);
    return user ? `user:${user}` : undefined;
  },
  tier: (request: Request) => signedIn(request).plan,
  peer: peers.header("x-real-ip"),
};
