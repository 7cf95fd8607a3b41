// Fetch-API handlers (Next.js route handlers, or middleware.ts on the Node.js runtime):
// export const GET = withRateLimit(options, async (request) => Response.json(...)).
import { costOf, Counters, Options, RateLimitCore } from "./core";

export interface FetchOptions extends Options {
  /** The address the request came from: Next.js passes it on in X-Forwarded-For, whose
   * last hop is the peer. Default: that last hop. */
  peer?: (request: Request) => string | undefined;
}

type Handler = (request: Request, context?: any) => Response | Promise<Response>;

/**
 * Wraps a handler: the request is checked first (a refusal is answered with 429 and
 * the handler is not run), the handler's response gets the rl_headers headers, and a
 * handler that throws or answers 5xx gives back what its explicit limits took.
 */
export function withRateLimit(options: FetchOptions, handler: Handler): Handler & { ready: Promise<void>; counters: Counters } {
  const core = new RateLimitCore(options);
  const limited = async (request: Request, context?: any) => {
    const path = new URL(request.url).pathname;
    if (core.skipped(path)) return handler(request, context);
    const shed = core.enter(request.method, path);
    if (shed?.kind === "answer") return Response.json(shed.body, { status: shed.status, headers: shed.headers });
    try {
      return await decideAndRun(request, context);
    } finally {
      core.leave();
    }
  };
  const decideAndRun = async (request: Request, context?: any) => {
    const route = core.match(request.method, new URL(request.url).pathname);
    if (!route) return handler(request, context);
    const forwarded = request.headers.get("x-forwarded-for") ?? undefined;
    const hops = (forwarded ?? "").split(",").map((s) => s.trim()).filter(Boolean);
    const peer = options.peer ? options.peer(request) : hops.pop();
    const subject = (await options.identify?.(request)) ?? `ip:${core.clientAddress(peer, hops.join(","))}`;
    const tier = await options.tier?.(request);
    const cost = costOf(route, request);
    const decision = await core.decide(route, subject, tier, cost);
    if (decision.kind === "answer") return Response.json(decision.body, { status: decision.status, headers: decision.headers });
    if (decision.kind === "fallback") return handler(request, context);
    let response: Response;
    try {
      response = await handler(request, context);
    } catch (error) {
      await core.refund(route, subject, tier, cost);
      throw error;
    }
    if (response.status >= 500) await core.refund(route, subject, tier, cost);
    const headers = new Headers(response.headers);
    for (const [name, value] of Object.entries(decision.headers)) headers.set(name, value);
    return new Response(response.body, { status: response.status, statusText: response.statusText, headers });
  };
  return Object.assign(limited, { ready: core.ready, counters: core.counters });
}
