// Limited in the route handler itself: the handler runs only when the database admits.
import { withRateLimit } from "ratelimit-web";
import { shared } from "../../lib/ratelimit";

export const dynamic = "force-dynamic";

// 10 exports at once, one more every 6 seconds
export const GET = withRateLimit(
  { ...shared, routes: { "/limited": { limits: [{ burst: 10, refill_per_minute: 10 }] } } },
  async () => Response.json({ ok: true }),
);
