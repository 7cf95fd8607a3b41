// What the Express middleware and the Fetch-API (Next.js) wrapper share: route matching,
// the subject, the decision, the fallback when the database does not answer.
import { BlockList, isIP } from "node:net";
import { DatabaseUnavailable, isMissingPolicy, Limiter, multiplier, Route } from "./limiter";
import { Metrics, Outcome } from "./metrics";

export interface Options {
  limiter: Limiter;
  /** `"/login"`, `"POST /login"`, `"/api/*"` (a glob; the first match applies) -> Route. */
  routes: Record<string, Route>;
  /** The subject (e.g. the signed-in user's id); undefined: the default. */
  identify?: (request: any) => string | undefined | Promise<string | undefined>;
  /** The tier (policies: the policy's tier; explicit limits: a key of the route's tiers). */
  tier?: (request: any) => string | undefined | Promise<string | undefined>;
  /** Never limited. Default: /health and /ready. */
  skip?: string[];
  /** Proxies whose X-Forwarded-For is believed (addresses or CIDR blocks). */
  trustedProxies?: string[];
  /** Per-check timeout. Default 50 ms. */
  checkTimeoutMs?: number;
  /** The share of a route's limit its local fallback bucket gets. Default 0.5. */
  fallbackShare?: number;
  /** Retry-After of a 503 from a sensitive route. Default 5 s. */
  unavailableRetryAfter?: number;
  /** At most one outage message per interval. Default 60 s. */
  logIntervalMs?: number;
  log?: (message: string) => void;
  /** Opt-in: remember up to this many subjects just refused (per route and tier; e.g.
   * 10_000, least recently used forgotten) and answer them 429 locally, without a database
   * call, until their refusal's retry time. It only ever refuses. */
  refusalCache?: number;
  /** Opt-in: at most this many requests in flight in this process; above it a 503 with
   * Retry-After before any database call or handler work (skip paths are never shed). */
  maxInFlight?: number;
  /** Retry-After of a shed request. Default 1 s. */
  shedRetryAfter?: number;
  /** Counts what the middleware did (shared by the caller). */
  counters?: Counters;
  /** Told each outcome and each check's latency (e.g. `new PrometheusMetrics()`). */
  metrics?: Metrics;
}

const COUNTER_OF: Record<Outcome, keyof Counters> = {
  admitted: "admitted", refused: "refused", refused_locally: "refusedLocally", shed: "shed",
  fallback_admitted: "fallbackAdmitted", fallback_refused: "fallbackRefused", database_errors: "databaseErrors",
  missing_policies: "missingPolicies",
};

/** What one middleware did in this process: the figures metrics export. */
export class Counters {
  /** Checks the database answered. */
  checks = 0;
  admitted = 0;
  refused = 0;
  /** Answered from the refused-identifier cache, no database call. */
  refusedLocally = 0;
  /** 503 before any work: too many requests in flight. */
  shed = 0;
  fallbackAdmitted = 0;
  fallbackRefused = 0;
  /** The database did not answer in time. */
  databaseErrors = 0;
  missingPolicies = 0;
}

type Refusal = { status: number; body: Record<string, unknown>; headers: Record<string, string> };

/** Subjects just refused, until their refusal's retry time ends: at most `size` (least
 * recently used forgotten). An entry repeats the database's refusal, its waits counted down. */
export class RefusalCache {
  private entries = new Map<string, [Refusal, number]>();
  constructor(readonly size: number, private clock: () => number = () => performance.now()) {}

  put(key: string, refusal: Refusal, waitMs: number): void {
    this.entries.delete(key);
    this.entries.set(key, [refusal, this.clock() + waitMs]);
    if (this.entries.size > this.size) this.entries.delete(this.entries.keys().next().value!);
  }

  get(key: string): Refusal | undefined {
    const entry = this.entries.get(key);
    if (!entry) return undefined;
    const [refusal, until] = entry;
    const left = until - this.clock();
    this.entries.delete(key);
    if (left <= 0) return undefined;
    this.entries.set(key, entry);
    const seconds = Math.max(1, Math.ceil(left / 1000));
    return { status: refusal.status, body: { ...refusal.body, retry_after: seconds },
      headers: { ...refusal.headers, "Retry-After": String(seconds) } };
  }
}

export type Decision =
  | { kind: "admitted"; headers: Record<string, string> }
  | { kind: "fallback" }
  | { kind: "answer"; status: number; body: Record<string, unknown>; headers: Record<string, string> };

/** Token buckets per subject in this process only, at most `maxSubjects` (least recently
 * used forgotten). take() answers 0 when admitted, else the seconds until it would be. */
export class LocalBucket {
  private buckets = new Map<string, [number, number]>();
  constructor(readonly burst: number, readonly refillPerMinute: number, private maxSubjects = 10_000,
    private clock: () => number = () => performance.now() / 1000) {}

  take(subject: string, cost = 1): number {
    const now = this.clock();
    const perSecond = this.refillPerMinute / 60;
    const [stored, at] = this.buckets.get(subject) ?? [this.burst, now];
    this.buckets.delete(subject);
    const level = Math.min(this.burst, stored + (now - at) * perSecond);
    const admitted = cost <= level;
    this.buckets.set(subject, [admitted ? level - cost : level, now]);
    if (this.buckets.size > this.maxSubjects) this.buckets.delete(this.buckets.keys().next().value!);
    if (admitted) return 0;
    return cost > this.burst || perSecond <= 0 ? Infinity : (cost - level) / perSecond;
  }
}

function globToRegExp(glob: string): RegExp {
  const body = glob.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".");
  return new RegExp(`^${body}$`);
}

function blockList(addresses: string[]): BlockList {
  const list = new BlockList();
  for (const a of addresses) {
    const [address, bits] = a.split("/");
    const family = isIP(address) === 6 ? "ipv6" : "ipv4";
    if (bits === undefined) list.addAddress(address, family);
    else list.addSubnet(address, Number(bits), family);
  }
  return list;
}

export class RateLimitCore {
  private routes: { method?: string; pattern: RegExp; route: Route }[] = [];
  private skip: Set<string>;
  private trusted: BlockList;
  private learned = new Map<string, [number, number]>();
  private local = new Map<string, LocalBucket>();
  private outageSince?: number;
  private loggedAt = -Infinity;
  private policyLoggedAt = new Map<string, number>();
  private refusals?: RefusalCache;
  private inFlight = 0;
  readonly counters: Counters;
  readonly log: (message: string) => void;
  /** Settles once every route's policy is found (rejects, naming the route and the policy,
   * when one is missing; a database that does not answer is logged and let be). Nobody
   * awaiting it makes a missing policy an unhandled rejection: the process stops at start. */
  readonly ready: Promise<void>;

  constructor(readonly options: Options) {
    for (const [spec, route] of Object.entries(options.routes)) {
      if ((route.policy === undefined) === (route.limits === undefined)) {
        throw new Error(`route ${spec}: give either policy or limits`);
      }
      const space = spec.lastIndexOf(" ");
      const method = space > 0 ? spec.slice(0, space).toUpperCase() : undefined;
      this.routes.push({ method, pattern: globToRegExp(spec.slice(space + 1)), route: { ...route, name: route.name ?? spec } });
    }
    this.skip = new Set(options.skip ?? ["/health", "/ready"]);
    this.trusted = blockList(options.trustedProxies ?? []);
    this.log = options.log ?? ((m) => console.warn(m));
    this.counters = options.counters ?? new Counters();
    if (options.refusalCache) this.refusals = new RefusalCache(options.refusalCache);
    this.ready = this.checkPolicies();
  }

  private async checkPolicies(): Promise<void> {
    const exists = this.options.limiter.policyExists?.bind(this.options.limiter);
    if (!exists) return;
    for (const { route } of this.routes) {
      if (route.policy === undefined) continue;
      let found;
      try {
        found = await withTimeout(exists(route.policy), Math.max(this.options.checkTimeoutMs ?? 50, 5000));
      } catch (e: any) {
        if (!(e instanceof DatabaseUnavailable)) throw e;
        this.log(`ratelimit-web: could not check the routes' policies at startup (${e.message}); the fallback serves until the database answers`);
        return;
      }
      if (!found) throw new Error(`ratelimit-web: route ${JSON.stringify(route.name)}: there is no policy named ${JSON.stringify(route.policy)} in the database`);
    }
  }

  /** Whether `path` is never limited nor shed. */
  skipped(path: string): boolean {
    return this.skip.has(path);
  }

  /** Counts what a request came to, and tells the metrics. */
  private note(route: Route | undefined, outcome: Outcome): void {
    this.counters[COUNTER_OF[outcome]]++;
    this.options.metrics?.count(route?.name, outcome);
  }

  /** A request begins: undefined, or the 503 that sheds it (too many in flight). Every
   * request let in must `leave()` once it is done. */
  enter(method: string, path: string): Decision | undefined {
    const cap = this.options.maxInFlight;
    if (cap !== undefined && this.inFlight >= cap) {
      this.note(this.match(method, path), "shed");
      const retryAfter = this.options.shedRetryAfter ?? 1;
      return { kind: "answer", status: 503, body: { detail: "Service Overloaded", retry_after: retryAfter },
        headers: { "Retry-After": String(retryAfter) } };
    }
    this.inFlight++;
    return undefined;
  }

  leave(): void {
    this.inFlight--;
  }

  /** The route limiting this request, or undefined (skipped, or no route matches). */
  match(method: string, path: string): Route | undefined {
    if (this.skip.has(path)) return undefined;
    return this.routes.find((r) => (!r.method || r.method === method) && r.pattern.test(path))?.route;
  }

  private isTrusted(address: string): boolean {
    const family = isIP(address);
    return family !== 0 && this.trusted.check(address, family === 6 ? "ipv6" : "ipv4");
  }

  /** The client's address: the peer's, or, when the peer is a trusted proxy, the nearest
   * address in X-Forwarded-For that is not one (right to left). */
  clientAddress(peer: string | undefined, forwardedFor: string | string[] | undefined): string {
    const from = (peer ?? "unknown").replace(/^::ffff:/, "");
    if (!this.isTrusted(from)) return from;
    const hops = ([] as string[]).concat(forwardedFor ?? []).join(",").split(",").map((s) => s.trim()).filter(Boolean);
    for (let i = hops.length - 1; i >= 0; i--) if (!this.isTrusted(hops[i])) return hops[i];
    return hops[0] ?? from;
  }

  /** Asks the database (within the timeout), or the fallback when it does not answer. */
  async decide(route: Route, subject: string, tier: string | undefined, cost: number): Promise<Decision> {
    const cacheKey = `${route.name}\u0000${tier}\u0000${subject}`;
    const cached = this.refusals?.get(cacheKey);
    if (cached) {
      this.note(route, "refused_locally");
      return { kind: "answer", ...cached };
    }
    let answer;
    const started = performance.now();
    try {
      answer = await withTimeout(this.options.limiter.check(route, subject, tier, cost), this.options.checkTimeoutMs ?? 50);
    } catch (e) {
      if (route.policy !== undefined && isMissingPolicy(e)) return this.policyMissing(route, e as Error);
      if (!(e instanceof DatabaseUnavailable)) throw e;
      this.note(route, "database_errors");
      return this.unavailable(route, subject, tier, cost, e);
    }
    this.counters.checks++;
    this.options.metrics?.observe(route.name, (performance.now() - started) / 1000);
    if (this.outageSince !== undefined) {
      this.log(`ratelimit-web: the database answers again after ${((Date.now() - this.outageSince) / 1000).toFixed(1)} s`);
      this.outageSince = undefined;
    }
    if (route.policy !== undefined) {
      const bucket = (answer.result.items ?? []).find((i: any) => i.refill_seconds);
      if (bucket) this.learned.set(`${route.name}\u0000${tier}`, [bucket.limit, (bucket.limit * 60) / bucket.refill_seconds]);
    }
    if (answer.admitted) {
      this.note(route, "admitted");
      return { kind: "admitted", headers: answer.headers };
    }
    this.note(route, "refused");
    // 429, or 413 for a cost above a limit, which no wait admits
    const h = answer.headers;
    const r = answer.result;
    const tooLarge = Boolean(r.exceeds_limit) || (r.items ?? []).some((i: any) => i.exceeds_limit);
    const retryAfter = h["Retry-After"] === undefined ? null : Number(h["Retry-After"]);
    const body = {
      detail: r.blocked ? "Blocked" : tooLarge ? "Cost Above Limit" : "Too Many Requests",
      limit: Number(h["X-RateLimit-Limit"] ?? 0),
      remaining: Number(h["X-RateLimit-Remaining"] ?? 0),
      reset: Number(h["X-RateLimit-Reset"] ?? 0),
      retry_after: retryAfter,
    };
    const waitMs = r.retry_after_ms;
    if (this.refusals && !tooLarge && typeof waitMs === "number" && waitMs > 0) {
      this.refusals.put(cacheKey, { status: 429, body, headers: h }, waitMs);
    }
    return { kind: "answer", status: tooLarge ? 413 : 429, body, headers: h };
  }

  /** A route's policy is gone: a JSON 500 that says so, logged once per interval. */
  private policyMissing(route: Route, error: Error): Decision {
    this.note(route, "missing_policies");
    const now = Date.now();
    if (now - (this.policyLoggedAt.get(route.name!) ?? -Infinity) >= (this.options.logIntervalMs ?? 60_000)) {
      this.policyLoggedAt.set(route.name!, now);
      this.log(`ratelimit-web: route ${JSON.stringify(route.name)}: there is no policy named ${JSON.stringify(route.policy)} in the database (${error.message})`);
    }
    return { kind: "answer", status: 500, headers: {},
      body: { detail: "Rate Limit Policy Missing", route: route.name, policy: route.policy } };
  }

  /** Gives back what an admitted check took (the handler failed); never throws. */
  async refund(route: Route, subject: string, tier: string | undefined, cost: number): Promise<void> {
    try {
      await withTimeout(this.options.limiter.refund(route, subject, tier, cost), this.options.checkTimeoutMs ?? 50);
    } catch (e: any) {
      this.log(`ratelimit-web: could not refund ${route.name} for ${subject}: ${e?.message ?? e}`);
    }
  }

  private unavailable(route: Route, subject: string, tier: string | undefined, cost: number, error: Error): Decision {
    const now = Date.now();
    this.outageSince ??= now;
    const share = this.options.fallbackShare ?? 0.5;
    if (now - this.loggedAt >= (this.options.logIntervalMs ?? 60_000)) {
      this.loggedAt = now;
      this.log(`ratelimit-web: the database did not answer (${error.message}): sensitive routes answer 503, the others use local buckets at ${share} of their limit`);
    }
    const key = `${route.name}\u0000${tier}`;
    const limit = route.sensitive ? undefined : this.learned.get(key) ?? firstBucket(route, tier);
    if (!limit) {
      this.note(route, "fallback_refused");
      const retryAfter = this.options.unavailableRetryAfter ?? 5;
      return { kind: "answer", status: 503, body: { detail: "Service Unavailable", retry_after: retryAfter },
        headers: { "Retry-After": String(retryAfter) } };
    }
    let bucket = this.local.get(key);
    if (!bucket) this.local.set(key, (bucket = new LocalBucket(limit[0] * share, limit[1] * share)));
    const wait = bucket.take(subject, cost);
    if (wait === 0) {
      this.note(route, "fallback_admitted");
      return { kind: "fallback" };
    }
    this.note(route, "fallback_refused");
    const retryAfter = Number.isFinite(wait) ? Math.max(1, Math.ceil(wait)) : null;
    return { kind: "answer", status: 429, headers: retryAfter ? { "Retry-After": String(retryAfter) } : {},
      body: { detail: "Too Many Requests", limit: Math.floor(bucket.burst), remaining: 0, reset: retryAfter ?? 0, retry_after: retryAfter } };
  }
}

function firstBucket(route: Route, tier: string | undefined): [number, number] | undefined {
  const m = multiplier(route, tier);
  for (const l of route.limits ?? []) if ("burst" in l) return [l.burst * m, l.refill_per_minute * m];
  return route.fallback;
}

/** `promise`, or DatabaseUnavailable after `ms` (the check goes on; what it takes stays taken). */
export function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new DatabaseUnavailable(`no answer within ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

export function costOf(route: Route, request: unknown): number {
  return typeof route.cost === "function" ? route.cost(request) : route.cost ?? 1;
}
