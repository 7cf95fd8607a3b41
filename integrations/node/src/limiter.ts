// The database side: one SQL statement per check, on PostgreSQL (node-postgres) or SQLite
// (better-sqlite3 with the loadable extension).

/** Which statuses give back what a request took: status classes and codes (["5xx"],
 * [503]) or a function of the status. */
export type RefundOn = (string | number)[] | ((status: number) => boolean);

/** A budget's period: a unit ("hour", "day", ISO "week", "month", "year"), optionally
 * anchored and in a time zone: "month from 31 09:00 in Europe/Paris" (docs/guides/billing-periods.md). */
export type Period = "hour" | "day" | "week" | "month" | "year" | `${"hour" | "day" | "week" | "month" | "year"} ${string}`;

/** A limit of any kind the engine has (limits.ts, generated from the core's table of kinds). */
import type { Limit } from "./limits";
export type { Limit };

/**
 * How one route is limited: a policy's name (rl_check, with the request's tier), or
 * explicit `limits` (rl_take_all) with `tiers` giving their multipliers. A `sensitive`
 * route fails closed (503) while the database is unreachable; the others admit through a
 * local bucket at `fallbackShare` of their first bucket (a policy's as its last answer
 * reported, or `fallback` = [burst, refill_per_minute] until there was one). `refundOn`
 * gives back what an admitted request took when its response has one of these statuses
 * (["5xx"], [503], or a function of the status); unset, the middleware's refundOn (off
 * unless set), which a sensitive route never takes. A refund lets a client whose request
 * failed try again: never name statuses a client can cause at will on a route whose
 * handler works before it fails. `identify` chooses this route's subject in place of the
 * middleware's (a function of the request as the middleware's `identify` gets it); an
 * empty answer falls back to the middleware's `identify`, then the signed-in user, then
 * the client address. `limits` may be a function of the request that answers them, for
 * limits that differ by customer (a budget counted from each one's billing date:
 * `(req) => [{ period: \`month from ${day}\`, quota }]`); the engine validates its answer
 * on every call instead of at startup.
 */
export interface Route {
  policy?: string;
  limits?: Limit[] | ((request: any) => Limit[]);
  tiers?: Record<string, number>;
  cost?: number | ((request: any) => number);
  sensitive?: boolean;
  fallback?: [number, number];
  name?: string;
  refundOn?: RefundOn;
  identify?: (request: any) => string | undefined | Promise<string | undefined>;
}

/** What the database answered: the rl_check / rl_take_all result and its rl_headers. */
export interface Answer {
  result: any;
  headers: Record<string, string>;
  admitted: boolean;
}

/** The database did not answer: connection refused or lost, or locked. */
export class DatabaseUnavailable extends Error {}

export interface Limiter {
  /** How long the database may take over one statement before it cancels it (writing
   * nothing) and the fallback decides. */
  readonly timeoutMs?: number;
  check(route: Route, subject: string, tier: string | undefined, cost: number): Promise<Answer>;
  /** Gives back what an admitted check took (rl_refund_check, or rl_refund_all for explicit limits). */
  refund(route: Route, subject: string, tier: string | undefined, cost: number): Promise<void>;
  /** Charges a cost known after the work whatever the limits hold, into debt or past a
   * quota (rl_charge_check, or rl_charge_all for explicit limits); resolves to the state
   * after it. */
  charge?(route: Route, subject: string, tier: string | undefined, cost: number): Promise<Answer>;
  /** Whether the database holds `policy` (checked for every route at startup). */
  policyExists?(policy: string): Promise<boolean>;
  /** [undefined, the limits as the engine read them], or [what it refuses in them] (checked
   * for every route with explicit limits at startup: rl_policy_validate). */
  validateLimits?(definition: { limits: Limit[]; tiers?: Record<string, number> }): Promise<[string | undefined, any]>;
  /** Inserts or replaces a policy (rl_policy_set); resolves to it as stored. */
  setPolicy?(name: string, definition: unknown): Promise<unknown>;
}

/** The subject of the startup check: never a request's (those are "user:..." or "ip:..."). */
export const PROBE_SUBJECT = "ratelimit_web:startup-check";

/** A check of a policy that does not exist fails with this SQLSTATE on PostgreSQL
 * (undefined_object) and, on SQLite, which has none, with a message that starts with one of
 * these (the function's name, then the stable text). */
export const UNKNOWN_POLICY_SQLSTATE = "42704";
export const UNKNOWN_POLICY_PREFIXES = ["rl_check: there is no policy named ", "rl_refund_check: there is no policy named "];

/** Whether the database refused a check because its policy does not exist, by its code. */
export function isMissingPolicy(e: unknown): boolean {
  const error = e as any;
  if (error?.code === UNKNOWN_POLICY_SQLSTATE) return true;
  const message = String(error?.message ?? "");
  return /^SQLITE_/.test(String(error?.code ?? "")) && UNKNOWN_POLICY_PREFIXES.some((p) => message.startsWith(p));
}

/** The engine's refusal of a route's explicit limits, as the route's own ("limits item 2:
 * burst must be a finite number greater than 0, got 0"); undefined for any other error. */
export function refusalOf(e: unknown): string | undefined {
  const message = String((e as any)?.message ?? e).split("\n")[0].trim();
  const prefix = "rl_policy_validate: ";
  const at = message.indexOf(prefix);
  if (at < 0) return undefined;
  return message.slice(at + prefix.length).replace(/definition\.limits/g, "limits").replace(/definition\.tiers/g, "tiers")
    .replace(/definition/g, "the route");
}

/** A route's explicit limit `index` for `subject`: rl_key('web', route, subject, index). */
export function limitKey(routeName: string, subject: string, index: number): string {
  return JSON.stringify(["web", routeName, subject, String(index)]);
}

export function multiplier(route: Route, tier: string | undefined): number {
  if (tier === undefined || tier === null || !route.tiers) return 1; // a route without tiers is the same for all
  const m = route.tiers?.[tier];
  if (m === undefined) throw new Error(`route ${route.name}: unknown tier ${JSON.stringify(tier)}`);
  return m;
}

type Item = { key: string; cost: number } & Record<string, unknown>;

/** A route's limits as fixed for one request (`routeFor` calls a `limits` function first). */
export function fixedLimits(route: Route): Limit[] {
  if (typeof route.limits === "function") {
    throw new TypeError(`route ${JSON.stringify(route.name)}: its limits function was not called for the request (routeFor)`);
  }
  return route.limits ?? [];
}

/**
 * The route's limits as rl_take_all items, passed through whatever their kind: each with its
 * key, the cost and the tier's multiplier, which the engine applies as a policy's tier.
 */
function takeItems(route: Route, subject: string, tier: string | undefined, cost: number): Item[] {
  const m = multiplier(route, tier);
  return fixedLimits(route).map((limit, i) => ({
    ...limit, key: limitKey(route.name ?? "", subject, i), cost, ...(m === 1 ? {} : { multiplier: m }),
  }));
}

/** The SQL texts, for one engine's placeholders ($n or ?). */
class Statements {
  readonly check: string;
  readonly takeAll: string;
  readonly refundCheck: string;
  constructor(p: (n: number) => string, jsonParam: string) {
    // MATERIALIZED: the limit is taken once, then its headers are read
    this.check = `WITH c(r) AS MATERIALIZED (SELECT rl_check(${p(1)}, ${p(2)}, ${p(3)}, ${p(4)})) SELECT r, rl_headers(r) AS h FROM c`;
    // rl_check_limits: rl_take_all counted under the route's name, as rl_check counts a
    // policy, so the operator's page, `top` and the exporter show the route too
    const cast = jsonParam.endsWith("::jsonb") ? "::jsonb" : "";
    this.takeAll = `WITH c(r) AS MATERIALIZED (SELECT rl_check_limits(${p(1)}, ${p(2)}, ${p(3)}${cast})) SELECT r, rl_headers(r) AS h FROM c`;
    this.refundCheck = `SELECT rl_refund_check(${p(1)}, ${p(2)}, ${p(3)}, ${p(4)}) AS r`;
    // the inverse of rl_take_all, over the same items
    this.refundAll = `SELECT rl_refund_all(${jsonParam}) AS r`;
    this.chargeCheck = `WITH c(r) AS MATERIALIZED (SELECT rl_charge_check(${p(1)}, ${p(2)}, ${p(3)}, ${p(4)})) SELECT r, rl_headers(r) AS h FROM c`;
    this.chargeAll = `WITH c(r) AS MATERIALIZED (SELECT rl_charge_all(${jsonParam})) SELECT r, rl_headers(r) AS h FROM c`;
    this.validate = `SELECT rl_policy_validate(${jsonParam}) AS r`;
    // a jsonb parameter in second place: $2::jsonb on PostgreSQL, ? on SQLite
    this.policySet = `SELECT rl_policy_set(${p(1)}, ${p(2)}${cast}) AS r`;
  }
  readonly validate: string;
  readonly policySet: string;
  readonly refundAll: string;
  readonly chargeCheck: string;
  readonly chargeAll: string;
}

/** A row of a check or a charge (the result and its headers; text on SQLite). */
function answerOf(row: { r: unknown; h: unknown }): Answer {
  const decode = (v: unknown) => (typeof v === "string" ? JSON.parse(v) : v);
  const result = decode(row.r);
  return { result, headers: decode(row.h), admitted: Boolean(result.admitted) };
}

abstract class SqlLimiter implements Limiter {
  protected abstract statements: Statements;
  protected abstract run(sql: string, params: unknown[]): Promise<{ r: unknown; h: unknown } | undefined>;

  async check(route: Route, subject: string, tier: string | undefined, cost: number): Promise<Answer> {
    const row = route.policy !== undefined
      ? await this.run(this.statements.check, [route.policy, subject, cost, tier ?? null])
      : await this.run(this.statements.takeAll, [route.name || "unnamed route", subject, JSON.stringify(takeItems(route, subject, tier, cost))]);
    return answerOf(row!);
  }

  async charge(route: Route, subject: string, tier: string | undefined, cost: number): Promise<Answer> {
    const row = route.policy !== undefined
      ? await this.run(this.statements.chargeCheck, [route.policy, subject, cost, tier ?? null])
      : await this.run(this.statements.chargeAll, [JSON.stringify(takeItems(route, subject, tier, cost))]);
    return answerOf(row!);
  }

  /**
   * Takes `cost` for `subject` (a policy's subject, or the key of explicit limits) as soon
   * as the limits allow, for background jobs that call a rate-limited service: after a
   * refusal it sleeps the answer's retry time (plus up to `jitter` of it) and asks again.
   * Gives up, resolving to the refusal, when the next try would pass `timeoutMs` or when
   * no wait can admit (a cost above a limit, a block without end). `signal` aborts it.
   */
  async wait(route: Route, subject: string, { tier, cost = 1, timeoutMs = 30_000, jitter = 0.1, signal }:
    { tier?: string; cost?: number; timeoutMs?: number; jitter?: number; signal?: AbortSignal } = {}): Promise<Answer> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      signal?.throwIfAborted();
      const answer = await this.check(route, subject, tier, cost);
      if (answer.admitted) return answer;
      const r = answer.result;
      const never = Boolean(r.exceeds_limit) || (r.items ?? []).some((i: any) => i.exceeds_limit);
      if (never || typeof r.retry_after_ms !== "number") return answer;
      const pause = r.retry_after_ms * (1 + Math.random() * jitter);
      if (performance.now() + pause > deadline) return answer;
      await new Promise<void>((resolve, reject) => {
        const onAbort = () => {
          clearTimeout(timer);
          reject(signal!.reason);
        };
        const timer = setTimeout(() => {
          signal?.removeEventListener("abort", onAbort);
          resolve();
        }, pause);
        signal?.addEventListener("abort", onAbort, { once: true });
      });
    }
  }

  async setPolicy(name: string, definition: unknown): Promise<unknown> {
    const row = await this.run(this.statements.policySet, [name, JSON.stringify(definition)]);
    return typeof row!.r === "string" ? JSON.parse(row!.r as string) : row!.r;
  }

  async validateLimits(definition: { limits: Limit[]; tiers?: Record<string, number> }): Promise<[string | undefined, any]> {
    try {
      const row = await this.run(this.statements.validate, [JSON.stringify(definition)]);
      const answer = typeof row!.r === "string" ? JSON.parse(row!.r as string) : row!.r;
      return [undefined, (answer as any).limits];
    } catch (e) {
      if (e instanceof DatabaseUnavailable) throw e;
      const problem = refusalOf(e);
      if (problem === undefined) throw e;
      return [problem, undefined];
    }
  }

  /** rl_refund_check for a subject of no one's: it finds nothing to give back, so it
   * changes nothing, and fails for a policy that does not exist. */
  async policyExists(policy: string): Promise<boolean> {
    try {
      await this.run(this.statements.refundCheck, [policy, PROBE_SUBJECT, 1, null]);
      return true;
    } catch (e) {
      if (isMissingPolicy(e)) return false;
      throw e;
    }
  }

  async refund(route: Route, subject: string, tier: string | undefined, cost: number): Promise<void> {
    if (route.policy !== undefined) {
      await this.run(this.statements.refundCheck, [route.policy, subject, cost, tier ?? null]);
      return;
    }
    await this.run(this.statements.refundAll, [JSON.stringify(takeItems(route, subject, tier, cost))]);
  }
}

/** A SQLSTATE of class 08 (connection) or 57 (operator intervention: shutdown), or no
 * SQLSTATE at all (a socket error): the database is not there. */
function unreachable(e: any): boolean {
  const code = typeof e?.code === "string" ? e.code : "";
  if (/^[0-9A-Z]{5}$/.test(code)) return code.startsWith("08") || code.startsWith("57");
  return true;
}

/** Checks on PostgreSQL with pg_ratelimit installed, through a node-postgres Pool. Each
 * connection the pool opens runs its statements with statement_timeout = `timeoutMs`
 * (500): the server cancels a statement at it, writing nothing, so a check that gives up
 * never leaves a take behind while the fallback admits. Give the pool a
 * connectionTimeoutMillis too (how long a check may wait to connect). */
export class PostgresLimiter extends SqlLimiter {
  protected statements = new Statements((n) => `$${n}`, "$1::jsonb");
  readonly timeoutMs: number;
  constructor(readonly pool: { query: (sql: string, params: unknown[]) => Promise<{ rows: any[] }>; on?: (...a: any[]) => any },
    { timeoutMs = 500 }: { timeoutMs?: number } = {}) {
    super();
    this.timeoutMs = timeoutMs;
    pool.on?.("connect", (client: any) => {
      client.query(`SET statement_timeout = ${Math.max(1, Math.floor(timeoutMs))}`).catch(() => {});
    });
  }

  protected async run(sql: string, params: unknown[]) {
    try {
      return (await this.pool.query(sql, params)).rows[0];
    } catch (e: any) {
      if (unreachable(e)) throw new DatabaseUnavailable(String(e?.message ?? e));
      throw e;
    }
  }
}

/** Checks on SQLite through a better-sqlite3 Database with the extension loaded. Calls are
 * synchronous: a database another process holds locked blocks for up to `timeoutMs`
 * (1000, SQLite's busy timeout on the connection), then counts as unavailable, having
 * written nothing. The state tables are made when it is built, not by a request. */
export class SqliteLimiter extends SqlLimiter {
  protected statements = new Statements(() => "?", "?");
  private prepared = new Map<string, any>();
  readonly timeoutMs: number;
  constructor(readonly db: any, { timeoutMs, busyTimeoutMs }: { timeoutMs?: number; busyTimeoutMs?: number } = {}) {
    super();
    if (typeof db?.pragma !== "function") {
      throw new TypeError("SqliteLimiter takes an open better-sqlite3 Database; to open a file, " +
        `use SqliteLimiter.open(${JSON.stringify(typeof db === "string" ? db : "app.db")})`);
    }
    this.timeoutMs = timeoutMs ?? busyTimeoutMs ?? 1000;
    db.pragma(`busy_timeout = ${Math.max(0, Math.floor(this.timeoutMs))}`);
    db.prepare("SELECT rl_sweep(0, 1)").get(); // the state tables, made now (a sweep that removes nothing)
  }

  /** Opens `path` with better-sqlite3, loads the extension (the sqlite-ratelimit package's,
   * a dependency, unless `extension` names another) and turns on WAL. */
  static open(path: string, { extension, timeoutMs, busyTimeoutMs }: { extension?: string; timeoutMs?: number; busyTimeoutMs?: number } = {}) {
    const Database = require("better-sqlite3");
    try {
      const db = new Database(path);
      db.loadExtension(extension ?? require("sqlite-ratelimit").getLoadablePath());
      db.pragma("journal_mode = WAL");
      return new SqliteLimiter(db, { timeoutMs, busyTimeoutMs });
    } catch (e: any) {
      throw new Error(`ratelimit-web: cannot open the SQLite database ${path}: ${e?.message ?? e}`, { cause: e });
    }
  }

  protected async run(sql: string, params: unknown[]) {
    let statement = this.prepared.get(sql);
    if (!statement) this.prepared.set(sql, (statement = this.db.prepare(sql)));
    try {
      return statement.get(...params);
    } catch (e: any) {
      // another connection holds the write lock past the busy timeout, or a table in a
      // shared cache (the extension reports SQLite's own code, extended codes included)
      if (/^SQLITE_(BUSY|LOCKED)(_|$)/.test(e?.code ?? "")) {
        throw new DatabaseUnavailable(`${this.db.name}: ${e.message}`);
      }
      throw e;
    }
  }
}
