// An operator's page: who is being limited right now, the Python package's page
// (ratelimit_web.admin) for Express and Fetch API servers. The page is one file shared by
// the web packages (integrations/spec/admin.html, shipped as admin.html); its JSON answers
// are the Python page's.
//
// Off until mounted, it answers 403 unless `authorize(request)` returns true (decided on the
// method, path and headers, before any body is read; `headerToken(name, token)` makes one
// that compares a header with a secret in constant time and refuses to be made without
// one), and it reads the database through an administrator's connection of its own (a
// role in rl_admin), never the application's:
//
//   const admin = new AdminView({ database: "postgresql://ops@db/app",
//                                 authorize: headerToken("x-ops-token", process.env.RATELIMIT_OPS_TOKEN) });
//   app.use("/ratelimit", admin.express);                                 // Express
//   if (url.pathname.startsWith("/ratelimit")) return admin.fetch(request, "/ratelimit");  // Fetch API
//
// An unblock's body is at most MAX_BODY_BYTES (a larger one is refused with 413, unread); a
// malformed one answers 400 with the reason. The page lists at most `blocks` blocks (100)
// and says how many there are.
import { timingSafeEqual } from "crypto";
import { open, type Database } from "./cli";

/** The largest body the page reads (an unblock's `{"subject": ...}`). */
export const MAX_BODY_BYTES = 4096;

/** An `authorize` that admits a request whose header `header` equals `token`, compared in
 * constant time. A missing or empty token throws here, at startup: the page never opens
 * because a variable was unset. */
export function headerToken(header: string, token: string | undefined): (request: AdminRequest) => boolean {
  if (typeof token !== "string" || token === "") {
    throw new Error(`headerToken(${JSON.stringify(header)}): the token is missing or empty, so the page would be open to all`);
  }
  const name = header.toLowerCase();
  const expected = Buffer.from(token);
  return (request) => {
    const given = Buffer.from(request.headers[name] ?? "");
    return given.length === expected.length && timingSafeEqual(given, expected);
  };
}

export interface AdminRequest {
  method: string;
  /** The path below the page's mount point ("", "state", "unblock"). */
  path: string;
  headers: Record<string, string>;
  client?: string;
  /** The framework's own request (Express's req, the Fetch API Request). */
  native?: unknown;
}

export interface AdminOptions {
  /** An administrator's database: postgresql://..., a libpq string, or a SQLite file. */
  database: string;
  authorize: (request: AdminRequest) => boolean | Promise<boolean>;
  /** How often the page's process samples the counts for its chart (default 10 s). */
  sampleSeconds?: number;
  /** Subjects refused most, and budgets near their quota, to list (default 20). */
  top?: number;
  /** Budgets are listed from this share of their quota up (default 0.8: rl_budgets_near). */
  nearFraction?: number;
  /** SQLite: libratelimit (default: the sqlite-ratelimit package's). */
  extension?: string;
  /** Blocks listed at most (default 100); the page says how many there are. */
  blocks?: number;
}

export interface AdminAnswer {
  status: number;
  contentType: string;
  body: string;
}

let page: string | undefined;

/** The page, read at its first request: importing the package reads no file (bundlers such
 * as Next.js's move the code away from the package's files, and most apps never serve it). */
function pageHtml(): string {
  if (page === undefined) {
    const fs = require("fs");
    const path = require("path");
    page = fs.readFileSync(path.join(__dirname, "..", "admin.html"), "utf8") as string;
  }
  return page;
}
const HOUR_MS = 3_600_000;
const num = (v: unknown) => (v === null || v === undefined ? null : Number(v));
const decoded = (v: unknown) => (typeof v === "string" && /^[[{]/.test(v) ? JSON.parse(v) : v);
const json = (status: number, value: unknown): AdminAnswer =>
  ({ status, contentType: "application/json", body: JSON.stringify(value) });
const tooLarge = () => json(413, { error: `the body is larger than ${MAX_BODY_BYTES} bytes` });

/** A Node request's body, or undefined once it passes MAX_BODY_BYTES (the rest unread). */
function readBounded(req: any): Promise<Buffer | undefined> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (c: Buffer) => {
      size += c.length;
      if (size > MAX_BODY_BYTES) {
        req.off("data", onData);
        req.pause();
        resolve(undefined);
        return;
      }
      chunks.push(c);
    };
    req.on("data", onData);
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

/** A Fetch API body, or undefined once it passes MAX_BODY_BYTES (the reader cancelled). */
async function readStreamBounded(stream: ReadableStream<Uint8Array>): Promise<Buffer | undefined> {
  const reader = stream.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return Buffer.concat(chunks);
    size += value.length;
    if (size > MAX_BODY_BYTES) {
      await reader.cancel().catch(() => undefined);
      return undefined;
    }
    chunks.push(value);
  }
}

export class AdminView {
  private readonly options: Required<Omit<AdminOptions, "extension">> & { extension?: string };
  private db?: Promise<Database>;
  private queue: Promise<unknown> = Promise.resolve();
  private history: [number, Record<string, number>][] = [];
  private sampler?: ReturnType<typeof setInterval>;

  constructor(options: AdminOptions) {
    if (typeof options?.authorize !== "function") {
      throw new TypeError("AdminView needs an authorize(request) function: the page is never open to everyone");
    }
    this.options = { sampleSeconds: 10, top: 20, nearFraction: 0.8, blocks: 100, ...options };
  }

  /** Runs `f` on the one connection, one call at a time; a failed call reconnects next time. */
  private query<T>(f: (db: Database) => Promise<T>): Promise<T> {
    const run = this.queue.then(async () => {
      this.db ??= open(this.options.database, this.options.extension);
      try {
        return await f(await this.db);
      } catch (e) {
        const db = this.db;
        this.db = undefined;
        await db?.then((d) => d.close()).catch(() => undefined);
        throw e;
      }
    });
    this.queue = run.catch(() => undefined);
    return run;
  }

  async state(): Promise<Record<string, unknown>> {
    const read = await this.query(async (db) => {
      const value = async (sql: string) => decoded((await db.rows(sql))[0]?.[0]);
      const stats = (await value("SELECT rl_policy_stats()")) as { scope: string; policies: Record<string, Record<string, number>> };
      const definitions = new Map((await db.rows("SELECT name, definition FROM rl_policies ORDER BY name"))
        .map(([n, d]) => [String(n), decoded(d) as { limits?: unknown[]; shadow?: boolean }]));
      const refused = (await db.rows("SELECT policy, subject, refusals, error, last_refused_ms FROM rl_refused " +
        "ORDER BY refusals DESC, policy, subject LIMIT $1", [this.options.top])).map(([policy, subject, refusals, error, last]) =>
        ({ policy, subject, refusals: num(refusals), error: num(error), last_refused_ms: num(last) }));
      const blocks = (await db.rows("SELECT subject, strikes, blocked_until_ms FROM rl_blocks ORDER BY subject LIMIT $1",
        [this.options.blocks])).map(([subject, strikes, until]) => ({ subject, strikes: num(strikes), blocked_until_ms: num(until) }));
      const blocksTotal = blocks.length < this.options.blocks ? blocks.length
        : Number((await db.rows("SELECT count(*) FROM rl_blocks"))[0]?.[0]);
      const near = decoded((await db.rows("SELECT rl_budgets_near($1, $2)", [this.options.nearFraction, this.options.top]))[0]?.[0]);
      let memory: unknown = null;
      try {
        memory = await value("SELECT rl_memory_stats()");
      } catch {
        memory = null; // SQLite and the SQL edition have no memory store
      }
      return { stats, definitions, refused, blocks, blocksTotal, near, memory };
    });
    this.sample(read.stats.policies);
    const names = [...new Set([...read.definitions.keys(), ...Object.keys(read.stats.policies)])].sort();
    return {
      scope: read.stats.scope,
      policies: names.map((name) => ({
        name, limits: read.definitions.get(name)?.limits ?? [], shadow: Boolean(read.definitions.get(name)?.shadow),
        counts: read.stats.policies[name] ?? null,
      })),
      refused: read.refused.slice(0, this.options.top),
      blocks: read.blocks,
      blocks_total: read.blocksTotal,
      near: read.near,
      memory: read.memory,
      history: this.history.map(([t, c]) => [t, { ...c }]),
      sample_seconds: this.options.sampleSeconds,
    };
  }

  private sample(policies: Record<string, Record<string, number>>): void {
    const now = Date.now();
    const last = this.history[this.history.length - 1];
    if (last && now - last[0] < (this.options.sampleSeconds * 1000) / 2) return;
    const totals: Record<string, number> = {};
    for (const [p, c] of Object.entries(policies)) totals[p] = Number(c.refused) + Number(c.refused_blocked);
    this.history.push([now, totals]);
    while (this.history.length && now - this.history[0][0] > HOUR_MS) this.history.shift();
  }

  private startSampler(): void {
    if (this.sampler) return;
    this.sampler = setInterval(() => {
      this.query(async (db) => decoded((await db.rows("SELECT rl_policy_stats()"))[0]?.[0]))
        .then((s) => this.sample((s as { policies: Record<string, Record<string, number>> }).policies))
        .catch(() => undefined);
    }, this.options.sampleSeconds * 1000);
    this.sampler.unref?.();
  }

  /** Stops the sampler and closes the connection. */
  async close(): Promise<void> {
    if (this.sampler) clearInterval(this.sampler);
    await this.query(async (db) => db.close()).catch(() => undefined);
    this.db = undefined;
  }

  /** The answer to a request, decided on its method, path and headers before any body is
   * read; undefined for an authorized unblock, whose body `unblockAnswer` takes. */
  async admit(request: AdminRequest): Promise<AdminAnswer | undefined> {
    let allowed = false;
    try {
      allowed = (await this.options.authorize(request)) === true;
    } catch {
      allowed = false; // a failing check never opens the page
    }
    if (!allowed) return json(403, { error: "forbidden" });
    const where = "/" + request.path.replace(/^\/+|\/+$/g, "");
    if (request.method === "POST" && where === "/unblock") {
      if (!(request.headers["content-type"] ?? "").startsWith("application/json")) {
        return json(415, { error: 'send the subject as JSON: {"subject": "..."}' });
      }
      const declared = request.headers["content-length"];
      if (declared !== undefined && declared !== "" && !/^\d+$/.test(declared)) {
        return json(400, { error: "Content-Length is not a number" });
      }
      if (declared !== undefined && Number(declared) > MAX_BODY_BYTES) return tooLarge();
      return undefined;
    }
    this.startSampler();
    const reading = request.method === "GET" || request.method === "HEAD";
    return this.guarded(async () => {
      if (reading && where === "/") return { status: 200, contentType: "text/html; charset=utf-8", body: pageHtml() };
      if (reading && where === "/state") return json(200, await this.state());
      return json(404, { error: `no ${request.method} ${where} here` });
    });
  }

  /** An authorized unblock's answer, from its body. */
  async unblockAnswer(body: string | Buffer): Promise<AdminAnswer> {
    const bytes = typeof body === "string" ? Buffer.from(body) : body;
    if (bytes.length > MAX_BODY_BYTES) return tooLarge();
    let value: unknown;
    try {
      value = bytes.length ? JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes)) : null;
    } catch (e) {
      return json(400, { error: e instanceof TypeError ? "the body is not UTF-8" : `the body is not JSON: ${(e as Error).message}` });
    }
    if (value === null || typeof value !== "object" || Array.isArray(value)) {
      return json(400, { error: 'send the subject as a JSON object: {"subject": "..."}' });
    }
    const subject = (value as { subject?: unknown }).subject;
    if (typeof subject !== "string" || !subject) return json(400, { error: "subject must be a non-empty string" });
    this.startSampler();
    return this.guarded(async () => {
      const lifted = await this.query(async (db) => (await db.rows("SELECT rl_unblock($1)", [subject]))[0]?.[0]);
      return json(200, { subject, unblocked: lifted === true || lifted === 1 });
    });
  }

  private async guarded(answer: () => Promise<AdminAnswer>): Promise<AdminAnswer> {
    try {
      return await answer();
    } catch (e) {
      const message = String((e as Error)?.message ?? e).trim().split("\n")[0] || String((e as Error)?.name);
      const denied = (e as { code?: string }).code === "42501" || message.includes("permission denied");
      return json(denied ? 403 : 500, { error: message });
    }
  }

  /** One request whose body is at hand (the adapters read it only once `admit` let them). */
  async handle(request: AdminRequest, body: string | Buffer = ""): Promise<AdminAnswer> {
    return (await this.admit(request)) ?? this.unblockAnswer(body);
  }

  /** Express middleware: app.use("/ratelimit", admin.express). */
  readonly express = (req: any, res: any, next: (e?: unknown) => void): void => {
    const send = (answer: AdminAnswer) => {
      res.status(answer.status).set({ "Content-Type": answer.contentType, "Cache-Control": "no-store" })
        .send(req.method === "HEAD" ? "" : answer.body);
    };
    const headers: Record<string, string> = {};
    for (const [k, v] of Object.entries(req.headers as Record<string, string | string[]>)) {
      headers[k.toLowerCase()] = Array.isArray(v) ? v.join(", ") : String(v);
    }
    const request = { method: req.method, path: String(req.path ?? req.url).split("?")[0], headers,
                      client: req.socket?.remoteAddress, native: req };
    this.admit(request).then((answer) => {
      if (answer) return send(answer);
      if (req.body !== undefined && typeof req.body === "object" && !Buffer.isBuffer(req.body)) {
        // express.json() read it already (within its own limit)
        return this.unblockAnswer(JSON.stringify(req.body)).then(send);
      }
      if (Buffer.isBuffer(req.body)) return this.unblockAnswer(req.body).then(send);
      readBounded(req).then((body) => (body === undefined ? send(tooLarge()) : this.unblockAnswer(body).then(send)), next);
    }).catch(next);
  };

  /** A Fetch API handler (Next.js route handlers, Bun, Deno, Hono): `base` is the mount point. */
  readonly fetch = async (request: Request, base = "/ratelimit"): Promise<Response> => {
    const url = new URL(request.url);
    const headers: Record<string, string> = {};
    request.headers.forEach((v, k) => { headers[k.toLowerCase()] = v; });
    const below = url.pathname.startsWith(base) ? url.pathname.slice(base.length) : url.pathname;
    let answer = await this.admit({ method: request.method, path: below, headers, native: request });
    if (!answer) {
      const body = request.body ? await readStreamBounded(request.body) : Buffer.alloc(0);
      answer = body === undefined ? tooLarge() : await this.unblockAnswer(body);
    }
    return new Response(request.method === "HEAD" ? null : answer.body,
                        { status: answer.status, headers: { "Content-Type": answer.contentType, "Cache-Control": "no-store" } });
  };
}
