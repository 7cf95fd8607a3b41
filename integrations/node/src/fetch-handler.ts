// Fetch-API handlers (Next.js route handlers and proxy.ts, or any runtime of Request and
// Response): export const GET = withRateLimit({ ...options, peer }, async (request) => ...).
import { attachLimits, costOf, routeFor, Counters, Options, RateLimitCore, RequestLimits } from "./core";

export interface FetchOptions extends Options {
  /**
   * The address the request came from, as the deployment provides it. A Fetch-API
   * `Request` carries no socket, so nothing can be assumed: pass one of `peers` (or your
   * own), chosen for where the application runs (the README's "Deploying behind proxies"):
   * - behind a proxy that sets a header to the address it saw (nginx's
   *   `proxy_set_header X-Real-IP $remote_addr`, Vercel's `x-real-ip`):
   *   `peers.header("x-real-ip")`, reachable through that proxy only;
   * - behind proxies that append to X-Forwarded-For: `peers.forwardedFor()` with
   *   `trustedProxies` naming them.
   * `next start` reached directly gives no address a client cannot choose (it fills
   * X-Forwarded-For only when the client sent none): put a proxy in front, or limit by
   * the signed-in user (`identify`).
   */
  peer: (request: Request) => string | undefined;
}

/** Where a Fetch-API request's peer address comes from, by deployment. */
export const peers = {
  /** A header a proxy in front sets to the address it saw, overwriting the client's
   * (X-Real-IP, x-vercel-forwarded-for): the one value, trusted as it is. */
  header: (name: string) => (request: Request) => request.headers.get(name)?.split(",")[0]?.trim() || undefined,
  /** X-Forwarded-For as proxies that append to it leave it: the peer is the last hop, and
   * `trustedProxies` say how far left to believe it. */
  forwardedFor: () => (request: Request) => {
    const hops = (request.headers.get("x-forwarded-for") ?? "").split(",").map((s) => s.trim()).filter(Boolean);
    return hops[hops.length - 1];
  },
};

type Handler = (request: Request, context?: any) => Response | Promise<Response>;

/**
 * Wraps a handler: the request is checked first (a refusal is answered with 429 and
 * the handler is not run), the handler's response gets the rl_headers headers, and a
 * response whose status the route refunds (or a throw, where it refunds a 500) gives back
 * what the check took. In the handler, `charge(request, cost)` charges a cost known after
 * the work (the response gets the headers after it) and `refund(request, cost)` gives some
 * back.
 */
export function withRateLimit(options: FetchOptions, handler: Handler): Handler & { ready: Promise<void>; counters: Counters } {
  if (typeof options.peer !== "function") {
    throw new TypeError("withRateLimit: pass peer, where the client's address comes from in your deployment: " +
      'peers.header("x-real-ip") behind a proxy that sets it (nginx, Vercel), peers.forwardedFor() with ' +
      "trustedProxies behind proxies that append to X-Forwarded-For (see the README's Deploying behind proxies)");
  }
  const core = new RateLimitCore(options);
  const limited = async (request: Request, context?: any) => {
    const path = new URL(request.url).pathname;
    if (core.skipped(path)) return handler(request, context);
    const shed = core.enter(request.method, path);
    if (shed?.kind === "answer") return Response.json(shed.body, { status: shed.status, headers: shed.headers });
    try {
      return await decideAndRun(request, context, path);
    } finally {
      core.leave();
    }
  };
  const decideAndRun = async (request: Request, context: any, path: string) => {
    const matched = core.match(request.method, path);
    if (!matched) return handler(request, context);
    const route = routeFor(matched, request);
    const forwarded = request.headers.get("x-forwarded-for") ?? undefined;
    const subject = core.subject((await route.identify?.(request)) || (await options.identify?.(request)), undefined, options.peer(request), forwarded);
    const tier = await options.tier?.(request);
    const cost = costOf(route, request);
    const decision = await core.decide(route, subject, tier, cost);
    if (decision.kind === "answer") return Response.json(decision.body, { status: decision.status, headers: decision.headers });
    // charge(request, cost) in the handler
    const limits = attachLimits(request, new RequestLimits(core, route, subject, tier,
      decision.kind === "admitted" ? decision.headers : {}));
    if (decision.kind === "fallback") return handler(request, context);
    let response: Response;
    try {
      response = await handler(request, context);
    } catch (error) {
      if (core.refunds(route, 500)) await core.refund(route, subject, tier, cost);
      throw error;
    }
    // NextResponse.next() in a proxy passes the request on: the route answers later, with a
    // status not known here, so nothing is given back for it
    const passedOn = response.headers.has("x-middleware-next");
    if (!passedOn && core.refunds(route, response.status)) await core.refund(route, subject, tier, cost);
    const headers = new Headers(response.headers);
    for (const [name, value] of Object.entries(limits.headers)) headers.set(name, value); // as a charge left them
    return new Response(response.body, { status: response.status, statusText: response.statusText, headers });
  };
  return Object.assign(limited, { ready: core.ready, counters: core.counters });
}
