// Express middleware: app.use(rateLimit({ limiter, routes })).
import { attachLimits, costOf, routeFor, Options, RateLimitCore, RequestLimits } from "./core";

type Req = {
  method: string; path: string; headers: Record<string, string | string[] | undefined>;
  socket: { remoteAddress?: string }; user?: any; complete?: boolean;
  once(event: "end" | "aborted", listener: () => void): unknown;
};
type Res = { statusCode: number; headersSent?: boolean; status(code: number): Res; set(headers: Record<string, string>): Res; json(body: unknown): void; end: (...args: any[]) => any; once(event: "close", listener: () => void): unknown };

/** Whether a request body is on its way (a length above 0, or chunked). */
function hasBody(req: Req): boolean {
  const length = req.headers["content-length"];
  if (length !== undefined) return String(length).trim() !== "0";
  return req.headers["transfer-encoding"] !== undefined;
}

/**
 * Limits the requests whose route is in `options.routes` (matched as Express routes them:
 * case-insensitive unless `caseInsensitivePaths: false`, trailing slashes and dot segments
 * aside; a GET route covers HEAD). The subject is `identify(req)`, else `req.user.id`
 * (e.g. Passport), else the client address (the socket's peer, or what `trustedProxies`
 * vouch for in X-Forwarded-For; leave Express's own `trust proxy` off, or set it to the
 * same proxies). Every limited response carries the rl_headers headers; a refusal is a
 * 429 JSON body (413 for a cost no wait admits); a response whose status the route
 * refunds gives back what the check took, before it ends, unless the client abandoned its
 * request. In a handler, `charge(req, cost)` charges a cost known after the work and
 * `refund(req, cost)` gives some back (see core.ts). `.ready` settles once every route is checked (see RateLimitCore.ready);
 * `.counters` counts what it did.
 */
export function rateLimit(options: Options) {
  const core = new RateLimitCore({ caseInsensitivePaths: true, ...options });
  async function rateLimitMiddleware(req: Req, res: Res, next: (error?: unknown) => void) {
    if (core.skipped(req.path)) return next();
    let receiving = hasBody(req) && !req.complete;
    const shed = core.enter(req.method, req.path, receiving);
    if (shed?.kind === "answer") return res.status(shed.status).set(shed.headers).json(shed.body);
    let abandoned = false;
    if (receiving) {
      req.once("end", () => {
        if (receiving) {
          receiving = false;
          core.received();
        }
      });
      req.once("aborted", () => (abandoned = true));
    }
    res.once("close", () => core.leave(receiving));
    try {
      const matched = core.match(req.method, req.path);
      if (!matched) return next();
      const route = routeFor(matched, req);
      const subject = core.subject((await route.identify?.(req)) || (await options.identify?.(req)), req.user?.id, req.socket.remoteAddress,
        req.headers["x-forwarded-for"]);
      const tier = await options.tier?.(req);
      const cost = costOf(route, req);
      const decision = await core.decide(route, subject, tier, cost);
      if (decision.kind === "answer") return res.status(decision.status).set(decision.headers).json(decision.body);
      // charge(req, cost) in the handler: the headers after it, while they can still be set
      attachLimits(req, new RequestLimits(core, route, subject, tier, decision.kind === "admitted" ? decision.headers : {},
        (headers) => { if (!res.headersSent) res.set(headers); }));
      if (decision.kind === "admitted") {
        res.set(decision.headers);
        // a refunded status ends only once the refund is made: the client never sees it first
        const end = res.end;
        res.end = function (this: Res, ...args: any[]) {
          res.end = end;
          if (abandoned || !core.refunds(route, res.statusCode)) return end.apply(res, args);
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
