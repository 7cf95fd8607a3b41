// What the Express middleware and the Fetch-API (Next.js) wrapper share: route matching,
// the subject, the decision, the fallback when the database does not answer.
import { createHash } from "node:crypto";
import { isIP } from "node:net";
import { Answer, DatabaseUnavailable, fixedLimits, isMissingPolicy, Limit, Limiter, multiplier, RefundOn, Route } from "./limiter";
import { Metrics, Outcome } from "./metrics";

// -- the pure rules, the same as the Python and Ruby packages' (integrations/spec/cases.json
//    holds the cases all three run) ----------------------------------------------------

/** An IP address: its family and its bytes (4 or 16), IPv4-mapped IPv6 read as IPv4. */
export interface Address { v6: boolean; bytes: number[] }

function v4Bytes(text: string): number[] | undefined {
  const parts = text.split(".");
  if (parts.length !== 4 || !parts.every((p) => /^\d{1,3}$/.test(p) && Number(p) <= 255)) return undefined;
  return parts.map(Number);
}

function v6Bytes(text: string): number[] | undefined {
  if (isIP(text) !== 6) return undefined;
  let t = text.toLowerCase();
  const tail: number[] = [];
  const dotted = t.lastIndexOf(":") < t.lastIndexOf(".");
  if (dotted) { // ::ffff:1.2.3.4
    const at = t.lastIndexOf(":");
    const v4 = v4Bytes(t.slice(at + 1));
    if (!v4) return undefined;
    tail.push(...v4);
    t = t.slice(0, at + 1) + "0:0";
  }
  const [head, rest] = t.split("::");
  const groups = (s: string | undefined) => (s ? s.split(":").filter((g) => g !== "") : []);
  const left = groups(head);
  const right = groups(rest);
  const missing = 8 - left.length - right.length;
  const all = t.includes("::") ? [...left, ...Array(missing).fill("0"), ...right] : left;
  if (all.length !== 8) return undefined;
  const bytes = all.flatMap((g) => { const n = parseInt(g, 16); return [n >> 8, n & 255]; });
  if (dotted) bytes.splice(12, 4, ...tail);
  return bytes;
}

/** An IP address as a server or a proxy writes it, or undefined: IPv4, IPv6 in any
 * spelling, bracketed and with a port, IPv4 with a port (Azure Application Gateway's
 * hops), with a zone id; IPv4-mapped IPv6 (a dual-stack listener's) is IPv4. */
export function parseAddress(text: string | undefined | null): Address | undefined {
  if (!text) return undefined;
  let t = text.trim().replace(/"/g, "");
  if (t.startsWith("[")) {
    const close = t.indexOf("]");
    if (close < 0) return undefined;
    t = t.slice(1, close);
  } else if ((t.match(/:/g) ?? []).length === 1) {
    t = t.split(":")[0];
  }
  t = t.split("%")[0];
  const v4 = v4Bytes(t);
  if (v4) return { v6: false, bytes: v4 };
  const v6 = v6Bytes(t);
  if (!v6) return undefined;
  const mapped = v6.slice(0, 10).every((b) => b === 0) && v6[10] === 255 && v6[11] === 255;
  return mapped ? { v6: false, bytes: v6.slice(12) } : { v6: true, bytes: v6 };
}

function masked(a: Address, bits: number): number[] {
  return a.bytes.map((b, i) => (bits >= (i + 1) * 8 ? b : bits <= i * 8 ? 0 : b & (0xff << (8 - (bits - i * 8))) & 0xff));
}

/** An IPv6 address written once, as RFC 5952 says: lower case, the longest run of two or
 * more zero groups (the first of equals) as ::. */
function v6Text(bytes: number[]): string {
  const groups = Array.from({ length: 8 }, (_, i) => (bytes[2 * i] << 8) | bytes[2 * i + 1]);
  let best = -1, bestLength = 1;
  for (let i = 0; i < 8;) {
    if (groups[i] !== 0) { i++; continue; }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLength) { best = i; bestLength = j - i; }
    i = j;
  }
  const hex = groups.map((g) => g.toString(16));
  if (best < 0) return hex.join(":");
  return hex.slice(0, best).join(":") + "::" + hex.slice(best + bestLength).join(":");
}

/** What an address counts as: IPv4 itself, IPv6 its /ipv6Prefix (/56 by default, as
 * express-rate-limit groups them), written one way. */
export function addressSubject(a: Address, ipv6Prefix = 56): string {
  if (!a.v6) return a.bytes.join(".");
  if (ipv6Prefix >= 128) return v6Text(a.bytes);
  return `${v6Text(masked(a, ipv6Prefix))}/${ipv6Prefix}`;
}

/** A trusted proxy: an address or network, e.g. "10.0.0.0/8" ("::ffff:10.0.0.1" is IPv4). */
export interface Network { address: Address; bits: number }

export function networks(list: string[]): Network[] {
  return list.map((text) => {
    const [at, bits] = text.trim().split("/");
    const address = parseAddress(at);
    if (!address) throw new Error(`trustedProxies: ${JSON.stringify(text)} is no address or network`);
    const full = address.v6 ? 128 : 32;
    const wasMapped = !address.v6 && (v6Bytes(at) !== undefined);
    let n = bits === undefined ? full : Number(bits);
    if (wasMapped && bits !== undefined) n = Math.max(0, n - 96);
    return { address, bits: n };
  });
}

function inNetwork(a: Address, n: Network): boolean {
  if (a.v6 !== n.address.v6) return false;
  const x = masked(a, n.bits), y = masked(n.address, n.bits);
  return x.every((b, i) => b === y[i]);
}

function trustedAddress(a: Address | undefined, trusted: Network[]): boolean {
  return a !== undefined && trusted.some((n) => inNetwork(a, n));
}

/** The client's address: the peer's, or, when the peer is a trusted proxy, the
 * X-Forwarded-For hop that proxy appended, and so on leftwards while each hop is itself
 * trusted. A hop left of the first untrusted one was the client's to write: never read. */
export function clientAddress(peer: string | undefined, forwarded: string | string[] | undefined, trusted: Network[],
  ipv6Prefix = 56): string {
  let a = parseAddress(peer);
  if (!a) return bounded(peer || "unknown");
  if (!trustedAddress(a, trusted)) return addressSubject(a, ipv6Prefix);
  const hops = ([] as string[]).concat(forwarded ?? []).join(",").split(",").map((s) => s.trim()).filter(Boolean);
  for (let i = hops.length - 1; i >= 0; i--) {
    const hop = parseAddress(hops[i]);
    if (!hop) return bounded(hops[i]); // written by the trusted proxy on its right, but no address
    a = hop;
    if (!trustedAddress(a, trusted)) break;
  }
  return addressSubject(a, ipv6Prefix);
}

function decodeOnce(path: string): string {
  try {
    return decodeURIComponent(path);
  } catch {
    return path.replace(/%([0-9a-fA-F]{2})/g, (m, h) => {
      const c = parseInt(h, 16);
      return c < 0x80 ? String.fromCharCode(c) : m;
    });
  }
}

/** The path as a router dispatches it: percent-decoded once, repeated slashes merged, `.`
 * and `..` resolved, no trailing slash; lower case where the router ignores case
 * (Express); a format suffix (/login.json) dropped where the router reads one (Rails). */
export function normalizePath(path: string, { caseInsensitive = false, formats = false } = {}): string {
  const segments: string[] = [];
  for (const segment of decodeOnce(path || "/").split("/")) {
    if (segment === "" || segment === ".") continue;
    if (segment === "..") { segments.pop(); continue; }
    segments.push(segment);
  }
  if (formats && segments.length) {
    const last = segments[segments.length - 1];
    const dot = last.lastIndexOf(".");
    if (dot > 0 && /^[A-Za-z0-9]+$/.test(last.slice(dot + 1))) segments[segments.length - 1] = last.slice(0, dot);
  }
  const normalized = "/" + segments.join("/");
  return caseInsensitive ? normalized.toLowerCase() : normalized;
}

/** An identifier longer than this, in UTF-8 bytes, is kept as its SHA-256 instead. */
export const IDENTIFIER_MAX_BYTES = 256;

/** Text of at most IDENTIFIER_MAX_BYTES bytes as it is; longer, `sha256:` and its hash. */
export function bounded(text: string): string {
  const raw = Buffer.from(text, "utf8");
  return raw.length <= IDENTIFIER_MAX_BYTES ? text : "sha256:" + createHash("sha256").update(raw).digest("hex");
}

/** An identifier: Unicode NFKC (a fullwidth `ｂｏｂ` is `bob`), case-folded where
 * identifiers are case-insensitive, bounded; undefined when empty (the address decides). */
export function normalizeIdentifier(value: unknown, { caseInsensitive = false } = {}): string | undefined {
  if (value === undefined || value === null) return undefined;
  let text = String(value).normalize("NFKC");
  if (caseInsensitive) text = text.toLowerCase();
  return text ? bounded(text) : undefined;
}

const SQLITE_SUFFIXES = [".db", ".sqlite", ".sqlite3", ".db3"];

/**
 * What a `--db` (or an operator page's database) names, never guessed: ["postgres", the
 * connection string] for a URL (postgresql://, postgres://) or a libpq string (dbname=app
 * host=...); ["sqlite", the path] for sqlite:PATH (sqlite:///abs/path), a file that exists,
 * or a name ending in .db, .sqlite, .sqlite3 or .db3. Anything else (`app`) throws an
 * error that says both forms, rather than opening a new SQLite file.
 */
export function databaseOf(text: string, isFile: (path: string) => boolean = defaultIsFile): ["postgres" | "sqlite", string] {
  const t = (text ?? "").trim();
  if (t.startsWith("postgres://") || t.startsWith("postgresql://") || t.includes("=")) return ["postgres", t];
  if (t.startsWith("sqlite:")) {
    let path = t.slice("sqlite:".length);
    if (path.startsWith("//")) path = path.slice(2);
    if (path) return ["sqlite", path];
  } else if (t && (isFile(t) || SQLITE_SUFFIXES.some((s) => t.toLowerCase().endsWith(s)))) {
    return ["sqlite", t];
  }
  throw new TypeError(`${JSON.stringify(t)} names no database: a PostgreSQL one is postgresql://HOST/NAME or dbname=NAME, ` +
    "a SQLite one an existing file, a name ending in .db, .sqlite or .sqlite3, or sqlite:PATH");
}

function defaultIsFile(path: string): boolean {
  try {
    return require("node:fs").statSync(path).isFile();
  } catch {
    return false;
  }
}

/** refundOn as a predicate of the status; undefined: never. */
export function refundRule(refundOn: RefundOn | undefined | null): ((status: number) => boolean) | undefined {
  if (refundOn === undefined || refundOn === null) return undefined;
  if (typeof refundOn === "function") return refundOn;
  const classes = new Set(refundOn.map((item) => {
    const text = String(item).toLowerCase();
    if (!/^[1-5](xx|\d\d)$/.test(text)) throw new Error(`refundOn: ${JSON.stringify(item)} is no status class ("5xx") or code (503)`);
    return text;
  }));
  return (status) => classes.has(String(status)) || classes.has(`${String(status)[0]}xx`);
}

export interface Options {
  limiter: Limiter;
  /** `"/login"`, `"POST /login"`, `"/api/*"` (a glob; the first match applies; a GET route
   * covers HEAD) -> Route. Paths are matched as the router dispatches them (normalizePath). */
  routes: Record<string, Route>;
  /** The subject (e.g. the signed-in user's id); undefined or "": the default. */
  identify?: (request: any) => string | undefined | Promise<string | undefined>;
  /** The tier (policies: the policy's tier; explicit limits: a key of the route's tiers). */
  tier?: (request: any) => string | undefined | Promise<string | undefined>;
  /** Never limited. Default: /health and /ready. */
  skip?: string[];
  /** Proxies whose X-Forwarded-For is believed, as far as they vouch for it (addresses or
   * CIDR blocks). */
  trustedProxies?: string[];
  /** IPv6 clients are limited by this prefix (one network, however it rotates). Default 56. */
  ipv6Prefix?: number;
  /** Paths differing only in case are one route (Express's default; the Fetch handler's is false). */
  caseInsensitivePaths?: boolean;
  /** A format suffix (/login.json) is the same route (Rails' routers). Default false. */
  pathFormats?: boolean;
  /** Identifiers differing only in case are one subject. Default false. */
  caseInsensitiveIdentifiers?: boolean;
  /** Which statuses of an admitted request give back what it took, for every route that
   * says nothing (see Route.refundOn). Default: none. */
  refundOn?: RefundOn;
  /** Policies set in the database at startup, before the routes are checked
   * (`{ login: { limits: [...] } }`; rl_policy_set: on PostgreSQL the limiter's role must
   * be a member of rl_admin or the extension's owner). */
  policies?: Record<string, unknown>;
  /** The share of a route's limit its local fallback bucket gets. Default 0.5. */
  fallbackShare?: number;
  /** Retry-After of a 503 from a sensitive route. Default 5 s. */
  unavailableRetryAfter?: number;
  /** At most one outage message per interval. Default 60 s. */
  logIntervalMs?: number;
  log?: (message: string) => void;
  /** Opt-in: remember up to this many subjects just refused (per route, limits and tier; e.g.
   * 10_000, least recently used forgotten) and answer them 429 locally, without a database
   * call, until their refusal's retry time (while the limits stay the same: a route's
   * `limits` function that answers other limits asks the database again). It only ever
   * refuses. With it, at most
   * `checksPerSubject` (8) of one subject's checks wait for the database at once: the
   * surplus is answered 429, so one flooding subject never crowds out the others. */
  refusalCache?: number;
  checksPerSubject?: number;
  /** Opt-in: at most this many requests in flight in this process (not counting those
   * whose body is still arriving); above it a 503 with Retry-After before any database call
   * or handler work (skip paths are never shed). */
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

export class RateLimitCore {
  private routes: { method?: string; pattern: RegExp; route: Route & { refunds?: (status: number) => boolean } }[] = [];
  private skip: Set<string>;
  private trusted: Network[];
  private learned = new Map<string, [number, number]>();
  private local = new Map<string, LocalBucket>();
  private checking = new Map<string, number>();
  private outageSince?: number;
  private loggedAt = -Infinity;
  private policyLoggedAt = new Map<string, number>();
  private refusals?: RefusalCache;
  private inFlight = 0;
  private receiving = 0;
  private defaultRefunds?: (status: number) => boolean;
  readonly counters: Counters;
  readonly log: (message: string) => void;
  /** Settles once every route is checked by the database: explicit limits the engine
   * refuses, or a policy it does not hold, reject naming the route (a database that does not
   * answer is logged and let be). Nobody awaiting it makes a bad route an unhandled
   * rejection: the process stops at start. */
  readonly ready: Promise<void>;
  /** Settles once the startup checks are done, whatever they found (requests wait for it). */
  private readonly started: Promise<void>;
  private markStarted!: () => void;
  private isStarted = false;

  constructor(readonly options: Options) {
    const ipv6Prefix = options.ipv6Prefix ?? 56;
    if (!(ipv6Prefix >= 0 && ipv6Prefix <= 128)) throw new Error(`ipv6Prefix must be 0 to 128, got ${ipv6Prefix}`);
    for (const [spec, route] of Object.entries(options.routes)) {
      if ((route.policy === undefined) === (route.limits === undefined)) {
        throw new Error(`route ${spec}: give either policy or limits`);
      }
      if (route.limits !== undefined && typeof route.limits !== "function") checkedLimits(route.limits, `route ${spec}`);
      const space = spec.lastIndexOf(" ");
      const method = space > 0 ? spec.slice(0, space).toUpperCase() : undefined;
      const pattern = globToRegExp(this.normalize(spec.slice(space + 1)));
      this.routes.push({ method, pattern, route: { ...route, name: route.name ?? spec, refunds: refundRule(route.refundOn) } });
    }
    this.skip = new Set(options.skip ?? ["/health", "/ready"]);
    this.trusted = networks(options.trustedProxies ?? []);
    this.defaultRefunds = refundRule(options.refundOn);
    this.log = options.log ?? ((m) => console.warn(m));
    this.counters = options.counters ?? new Counters();
    if (options.refusalCache) this.refusals = new RefusalCache(options.refusalCache);
    this.started = new Promise((resolve) => (this.markStarted = resolve));
    this.ready = this.checkRoutes().finally(() => {
      this.isStarted = true;
      this.markStarted();
    });
  }

  normalize(path: string): string {
    return normalizePath(path, { caseInsensitive: this.options.caseInsensitivePaths, formats: this.options.pathFormats });
  }

  private async checkRoutes(): Promise<void> {
    const limiter = this.options.limiter;
    try {
      for (const [name, definition] of Object.entries(this.options.policies ?? {})) {
        if (!limiter.setPolicy) throw new Error("ratelimit-web: policies: this limiter cannot set policies");
        await withTimeout(limiter.setPolicy(name, definition), 5000);
      }
    } catch (e: any) {
      if (!(e instanceof DatabaseUnavailable)) throw e;
      this.log(`ratelimit-web: could not set the policies at startup (${e.message}); the fallback serves until the database answers`);
      return;
    }
    for (const { route } of this.routes) {
      try {
        if (typeof route.limits === "function") continue; // the engine checks each call's
        if (route.limits !== undefined) {
          if (!limiter.validateLimits) continue;
          const definition = { limits: route.limits, ...(route.tiers ? { tiers: route.tiers } : {}) };
          const [problem, limits] = await withTimeout(limiter.validateLimits(definition), 5000);
          if (problem !== undefined) throw new Error(`ratelimit-web: route ${JSON.stringify(route.name)}: ${problem}`);
          route.limits = limits; // as the engine read them: numbers where text was given
        } else if (limiter.policyExists && !(await withTimeout(limiter.policyExists(route.policy!), 5000))) {
          throw new Error(`ratelimit-web: route ${JSON.stringify(route.name)}: there is no policy named ${JSON.stringify(route.policy)} in the database`);
        }
      } catch (e: any) {
        if (!(e instanceof DatabaseUnavailable)) throw e;
        this.log(`ratelimit-web: could not check the routes at startup (${e.message}); the fallback serves until the database answers`);
        return;
      }
    }
  }

  /** Whether `path` is never limited nor shed. */
  skipped(path: string): boolean {
    return this.skip.has(path) || this.skip.has(this.normalize(path));
  }

  /** Counts what a request came to, and tells the metrics. */
  private note(route: Route | undefined, outcome: Outcome): void {
    this.counters[COUNTER_OF[outcome]]++;
    this.options.metrics?.count(route?.name, outcome, route?.policy);
  }

  /** A request begins: undefined, or the 503 that sheds it (too many in flight). Every
   * request let in must `leave()` once it is done; one whose body is still `receiving`
   * counts from `received()` on. */
  enter(method: string, path: string, receiving = false): Decision | undefined {
    const cap = this.options.maxInFlight;
    if (cap !== undefined && this.inFlight >= cap) {
      this.note(this.match(method, path), "shed");
      const retryAfter = this.options.shedRetryAfter ?? 1;
      return { kind: "answer", status: 503, body: { detail: "Service Overloaded", retry_after: retryAfter },
        headers: { "Retry-After": String(retryAfter) } };
    }
    if (receiving) this.receiving++;
    else this.inFlight++;
    return undefined;
  }

  received(): void {
    this.receiving--;
    this.inFlight++;
  }

  leave(receiving = false): void {
    if (receiving) this.receiving--;
    else this.inFlight--;
  }

  /** The route limiting this request, or undefined (skipped, or no route matches). */
  match(method: string, path: string): Route | undefined {
    if (this.skipped(path)) return undefined;
    const normalized = this.normalize(path);
    const m = method.toUpperCase();
    return this.routes.find((r) => (!r.method || r.method === m || (r.method === "GET" && m === "HEAD"))
      && r.pattern.test(normalized))?.route;
  }

  /** `identify`'s answer, else the signed-in user, else the client address; an empty
   * identifier is none. */
  subject(identified: unknown, user: unknown, peer: string | undefined, forwarded: string | string[] | undefined): string {
    const caseInsensitive = this.options.caseInsensitiveIdentifiers ?? false;
    const id = normalizeIdentifier(identified, { caseInsensitive });
    if (id) return id;
    const u = normalizeIdentifier(user, { caseInsensitive });
    if (u) return `user:${u}`;
    return `ip:${clientAddress(peer, forwarded, this.trusted, this.options.ipv6Prefix ?? 56)}`;
  }

  /** The client's address alone, as the subject would use it. */
  clientAddress(peer: string | undefined, forwarded: string | string[] | undefined): string {
    return clientAddress(peer, forwarded, this.trusted, this.options.ipv6Prefix ?? 56);
  }

  /** Whether an admitted request whose response has `status` gets its cost back. */
  refunds(route: Route, status: number): boolean {
    const rule = (route as any).refunds ?? (route.sensitive ? undefined : this.defaultRefunds);
    return rule !== undefined && Boolean(rule(status));
  }

  /** Asks the database (its limiter's timeout bounds it), or the fallback when it does not answer. */
  async decide(route: Route, subject: string, tier: string | undefined, cost: number): Promise<Decision> {
    // a request that arrives while the startup checks run (the policies being set) waits for them
    if (!this.isStarted) await this.started;
    // the limits are part of a refusal's key: a request whose limits differ (a customer's
    // new plan, another billing period) is not answered with a refusal under the old ones
    const slot = `${route.name}\u0000${tier}\u0000${subject}`;
    const cacheKey = this.refusals && route.limits ? `${slot}\u0000${JSON.stringify(route.limits)}` : slot;
    const cached = this.refusals?.get(cacheKey);
    if (cached) {
      this.note(route, "refused_locally");
      return { kind: "answer", ...cached };
    }
    const bound = this.refusals ? this.options.checksPerSubject ?? 8 : undefined;
    if (bound !== undefined) {
      const waiting = this.checking.get(slot) ?? 0;
      if (waiting >= bound) {
        this.note(route, "refused_locally");
        return { kind: "answer", status: 429, body: { detail: "Too Many Requests", retry_after: 1 }, headers: { "Retry-After": "1" } };
      }
      this.checking.set(slot, waiting + 1);
    }
    let answer;
    const started = performance.now();
    try {
      // a statement the database is still running is waited for (its own timeout cancels
      // it, writing nothing); only a connection that stopped answering is given up on
      answer = await withTimeout(this.options.limiter.check(route, subject, tier, cost), (this.options.limiter.timeoutMs ?? 1000) + 1000);
    } catch (e) {
      if (route.policy !== undefined && isMissingPolicy(e)) return this.policyMissing(route, e as Error);
      if (!(e instanceof DatabaseUnavailable)) throw e;
      this.note(route, "database_errors");
      return this.unavailable(route, subject, tier, cost, e);
    } finally {
      if (bound !== undefined) {
        const left = (this.checking.get(slot) ?? 1) - 1;
        if (left > 0) this.checking.set(slot, left);
        else this.checking.delete(slot);
      }
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
    this.options.metrics?.refuse?.(route.name ?? "", route.policy, subject);
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
      await withTimeout(this.options.limiter.refund(route, subject, tier, cost), (this.options.limiter.timeoutMs ?? 1000) + 1000);
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
      this.log(`ratelimit-web: the database could not be reached (${error.message}): sensitive routes answer 503, the others use local buckets at ${share} of their limit`);
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
  for (const l of fixedLimits(route)) if ("burst" in l) return [Number(l.burst) * m, Number(l.refill_per_minute) * m];
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

/** `cost` if it is a finite number above 0, else a RangeError naming the call. */
function amount(call: string, cost: unknown): number {
  if (typeof cost !== "number" || !Number.isFinite(cost) || cost <= 0) {
    throw new RangeError(`${call}: cost must be a finite number greater than 0, got ${String(cost)}`);
  }
  return cost;
}

/**
 * One admitted request's route, subject and tier, and the headers its response gets, for
 * `charge(request, cost)` and `refund(request, cost)` in the handler. `onHeaders` is told
 * the headers after a charge (Express sets them on the response while it can).
 */
export class RequestLimits {
  constructor(private core: RateLimitCore, readonly route: Route, readonly subject: string,
    readonly tier: string | undefined, public headers: Record<string, string>,
    private onHeaders?: (headers: Record<string, string>) => void) {}

  /** Charges `cost` to the route's limits whatever they hold; the answer, or undefined when
   * the database did not answer (logged). */
  async charge(cost: number): Promise<Answer | undefined> {
    const limiter = this.core.options.limiter;
    if (!limiter.charge) throw new TypeError("charge: this limiter has no charge(route, subject, tier, cost)");
    const n = amount("charge", cost);
    try {
      const answer = await withTimeout(limiter.charge(this.route, this.subject, this.tier, n), (limiter.timeoutMs ?? 1000) + 1000);
      this.headers = { ...answer.headers };
      this.onHeaders?.(this.headers);
      return answer;
    } catch (e: any) {
      if (!(e instanceof DatabaseUnavailable)) throw e;
      this.core.log(`ratelimit-web: could not charge ${this.route.name} for ${this.subject}: ${e.message}`);
      return undefined;
    }
  }

  /** Gives `cost` back to the route's limits; the headers stay as they were. */
  async refund(cost: number): Promise<void> {
    await this.core.refund(this.route, this.subject, this.tier, amount("refund", cost));
  }
}

const LIMITS = new WeakMap<object, RequestLimits>();

/** Leaves `limits` on `request` for charge() and refund() in its handler. */
export function attachLimits(request: object, limits: RequestLimits): RequestLimits {
  LIMITS.set(request, limits);
  return limits;
}

function limitsOf(request: object): RequestLimits {
  const limits = LIMITS.get(request);
  if (!limits) {
    throw new TypeError("ratelimit-web: this request was not admitted by a rate-limited route (charge and refund " +
      "work in the handler of a route rateLimit or withRateLimit limits, on the request object it was given)");
  }
  return limits;
}

/**
 * Charges `cost` (a finite number above 0), known after the work (LLM tokens, bytes
 * sent), to the limits of the route that admitted `request` whatever they hold: a bucket
 * goes into debt, a budget past its quota, and later requests wait until it is paid back
 * (rl_charge_all, or rl_charge_check for a policy, scaled by the tier). The response
 * carries the headers after the charge. Resolves to the engine's answer, or undefined when
 * the database did not answer (logged).
 */
export function charge(request: object, cost: number): Promise<Answer | undefined> {
  return limitsOf(request).charge(cost);
}

/** Gives `cost` back to the limits of the route that admitted `request` (what an
 * estimate took too much); never throws for a database that does not answer (logged). */
export function refund(request: object, cost: number): Promise<void> {
  return limitsOf(request).refund(cost);
}

/** `limits` if it is a non-empty list of limit objects, else an Error that starts with `what`. */
function checkedLimits(limits: unknown, what: string): Limit[] {
  if (!Array.isArray(limits) || !limits.length || !limits.every((l) => typeof l === "object" && l !== null)) {
    throw new Error(`${what}: limits must be a list of limit objects, e.g. [{ burst: 5, refill_per_minute: 5 }]`);
  }
  return limits;
}

/** The route as it limits `request`: itself, or a copy holding what its `limits` function
 * answered for the request (what the check, its refund and the handler's charge all use). */
export function routeFor<R extends Route>(route: R, request: unknown): R {
  if (typeof route.limits !== "function") return route;
  return { ...route, limits: checkedLimits(route.limits(request), `route ${JSON.stringify(route.name)}: limits(request)`) };
}

export function costOf(route: Route, request: unknown): number {
  return typeof route.cost === "function" ? route.cost(request) : route.cost ?? 1;
}
