// Express middleware: app.use(rateLimit({ limiter, routes })).
import { costOf, Options, RateLimitCore } from "./core";

type Req = { method: string; path: string; headers: Record<string, string | string[] | undefined>; socket: { remoteAddress?: string }; user?: any };
type Res = { statusCode: number; status(code: number): Res; set(headers: Record<string, string>): Res; json(body: unknown): void; end: (...args: any[]) => any; once(event: "close", listener: () => void): unknown };

/**
 * Limits the requests whose route is in `options.routes`. The subject is
 * `identify(req)`, else `req.user.id` (e.g. Passport), else the client address. Every
 * limited response carries the rl_headers headers; a refusal is a 429 JSON body (413 for
 * a cost no wait admits); a response that ends 5xx gives back what the check took, before
 * it ends. `.ready` settles once every route's policy is found (see RateLimitCore.ready);
 * `.counters` counts what it did.
 */
export function rateLimit(options: Options) {
  const core = new RateLimitCore(options);
  async function rateLimitMiddleware(req: Req, res: Res, next: (error?: unknown) => void) {
    if (core.skipped(req.path)) return next();
    const shed = core.enter(req.method, req.path);
    if (shed?.kind === "answer") return res.status(shed.status).set(shed.headers).json(shed.body);
    res.once("close", () => core.leave());
    try {
      const route = core.match(req.method, req.path);
      if (!route) return next();
      const user = req.user?.id ?? undefined;
      const subject = (await options.identify?.(req)) ??
        (user !== undefined ? `user:${user}` : `ip:${core.clientAddress(req.socket.remoteAddress, req.headers["x-forwarded-for"])}`);
      const tier = await options.tier?.(req);
      const cost = costOf(route, req);
      const decision = await core.decide(route, subject, tier, cost);
      if (decision.kind === "answer") return res.status(decision.status).set(decision.headers).json(decision.body);
      if (decision.kind === "admitted") {
        res.set(decision.headers);
        // a 5xx ends only once the refund is made: the client never sees the failure first
        const end = res.end;
        res.end = function (this: Res, ...args: any[]) {
          res.end = end;
          if (res.statusCode < 500) return end.apply(res, args);
          void core.refund(route, subject, tier, cost).finally(() => end.apply(res, args));
          return res;
        };
      }
      next();
    } catch (error) {
      next(error);
    }
  }
  return Object.assign(rateLimitMiddleware, { ready: core.ready, counters: core.counters });
}
