// An operator's page: who is being limited right now, the Python package's page
// (ratelimit_web.admin) for Express and Fetch API servers. The page is one file shared by
// the web packages (integrations/spec/admin.html, shipped as admin.html); its JSON answers
// are the Python page's.
//
// Off until mounted, it answers 403 unless `authorize(request)` returns true, and it reads
// the database through an administrator's connection of its own (a role in rl_admin),
// never the application's:
//
//   const admin = new AdminView({ database: "postgresql://ops@db/app", authorize: (r) => isOperator(r.native) });
//   app.use("/ratelimit", admin.express);                                 // Express
//   if (url.pathname.startsWith("/ratelimit")) return admin.fetch(request, "/ratelimit");  // Fetch API
import { open, type Database } from "./cli";

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
    this.options = { sampleSeconds: 10, top: 20, nearFraction: 0.8, ...options };
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
        "ORDER BY refusals DESC, policy, subject")).map(([policy, subject, refusals, error, last]) =>
        ({ policy, subject, refusals: num(refusals), error: num(error), last_refused_ms: num(last) }));
      const blocks = (await db.rows("SELECT subject, strikes, blocked_until_ms FROM rl_blocks ORDER BY subject"))
        .map(([subject, strikes, until]) => ({ subject, strikes: num(strikes), blocked_until_ms: num(until) }));
      const near = decoded((await db.rows("SELECT rl_budgets_near($1, $2)", [this.options.nearFraction, this.options.top]))[0]?.[0]);
      let memory: unknown = null;
      try {
        memory = await value("SELECT rl_memory_stats()");
      } catch {
        memory = null; // SQLite and the SQL edition have no memory store
      }
      return { stats, definitions, refused, blocks, near, memory };
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

  /** One request, whatever the framework. */
  async handle(request: AdminRequest, body = ""): Promise<AdminAnswer> {
    let allowed = false;
    try {
      allowed = (await this.options.authorize(request)) === true;
    } catch {
      allowed = false; // a failing check never opens the page
    }
    if (!allowed) return json(403, { error: "forbidden" });
    this.startSampler();
    const where = "/" + request.path.replace(/^\/+|\/+$/g, "");
    const reading = request.method === "GET" || request.method === "HEAD";
    try {
      if (reading && where === "/") return { status: 200, contentType: "text/html; charset=utf-8", body: pageHtml() };
      if (reading && where === "/state") return json(200, await this.state());
      if (request.method === "POST" && where === "/unblock") {
        if (!(request.headers["content-type"] ?? "").startsWith("application/json")) {
          return json(415, { error: 'send the subject as JSON: {"subject": "..."}' });
        }
        const subject = (JSON.parse(body || "{}") as { subject?: unknown }).subject;
        if (typeof subject !== "string" || !subject) return json(400, { error: "subject must be a non-empty string" });
        const lifted = await this.query(async (db) => (await db.rows("SELECT rl_unblock($1)", [subject]))[0]?.[0]);
        return json(200, { subject, unblocked: lifted === true || lifted === 1 });
      }
    } catch (e) {
      const message = String((e as Error)?.message ?? e).trim().split("\n")[0] || String((e as Error)?.name);
      const denied = (e as { code?: string }).code === "42501" || message.includes("permission denied");
      return json(denied ? 403 : 500, { error: message });
    }
    return json(404, { error: `no ${request.method} ${where} here` });
  }

  /** Express middleware: app.use("/ratelimit", admin.express). */
  readonly express = (req: any, res: any, next: (e?: unknown) => void): void => {
    const respond = async (body: string) => {
      const headers: Record<string, string> = {};
      for (const [k, v] of Object.entries(req.headers as Record<string, string | string[]>)) {
        headers[k.toLowerCase()] = Array.isArray(v) ? v.join(", ") : String(v);
      }
      const answer = await this.handle({ method: req.method, path: String(req.path ?? req.url).split("?")[0], headers,
                                         client: req.socket?.remoteAddress, native: req }, body);
      res.status(answer.status).set({ "Content-Type": answer.contentType, "Cache-Control": "no-store" })
        .send(req.method === "HEAD" ? "" : answer.body);
    };
    if (req.body !== undefined && typeof req.body === "object" && !Buffer.isBuffer(req.body)) {
      respond(JSON.stringify(req.body)).catch(next);  // express.json() read it already
      return;
    }
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => respond(Buffer.concat(chunks).toString("utf8")).catch(next));
    req.on("error", next);
  };

  /** A Fetch API handler (Next.js route handlers, Bun, Deno, Hono): `base` is the mount point. */
  readonly fetch = async (request: Request, base = "/ratelimit"): Promise<Response> => {
    const url = new URL(request.url);
    const headers: Record<string, string> = {};
    request.headers.forEach((v, k) => { headers[k.toLowerCase()] = v; });
    const below = url.pathname.startsWith(base) ? url.pathname.slice(base.length) : url.pathname;
    const answer = await this.handle({ method: request.method, path: below, headers, native: request },
                                     request.method === "POST" ? await request.text() : "");
    return new Response(request.method === "HEAD" ? null : answer.body,
                        { status: answer.status, headers: { "Content-Type": answer.contentType, "Cache-Control": "no-store" } });
  };
}
