// Limited in the route handler itself: the handler runs only when the database admits.
import { withRateLimit } from "ratelimit-web";
import { shared } from "../../lib/ratelimit";

export const dynamic = "force-dynamic";

export const GET = withRateLimit(
  { ...shared, routes: { "/limited": { limits: [{ burst: 200, refill_per_minute: 1e-6 }] } } },
  async () => Response.json({ ok: true }),
);
