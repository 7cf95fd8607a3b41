// A handler that fails: what its check took is given back (refundOn: a 5xx, or a throw).
import { withRateLimit } from "ratelimit-web";
import { shared } from "../../lib/ratelimit";

export const dynamic = "force-dynamic";

export const GET = withRateLimit(
  { ...shared, routes: { "/fail": { limits: [{ burst: 2, refill_per_minute: 1 }], refundOn: ["5xx"] } } },
  async (request: Request) => {
    const how = new URL(request.url).searchParams.get("how");
    if (how === "ok") return Response.json({ ok: true });
    if (how === "503") return Response.json({ ok: false }, { status: 503 });
    throw new Error("the handler failed");
  },
);
