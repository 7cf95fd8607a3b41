// A sign-in, limited in its own handler so that the answer decides what counts: only the
// attempts that fail (401) keep their token; a sign-in that succeeds gives it back.
import { withRateLimit } from "ratelimit-web";
import { shared } from "../../lib/ratelimit";

export const dynamic = "force-dynamic";

export const POST = withRateLimit(
  {
    ...shared,
    // set when the route first loads: 5 failed attempts at once, one more a minute, 50 a day
    policies: { login: { limits: [{ burst: 5, refill_per_minute: 1 }, { period: "day", quota: 50 }] } },
    routes: { "POST /login": { policy: "login", sensitive: true, refundOn: (status: number) => status < 400 } },
  },
  async (request: Request) => {
    const form = await request.formData().catch(() => undefined);
    const ok = Boolean(process.env.DEMO_PASSWORD) && form?.get("password") === process.env.DEMO_PASSWORD;
    return ok ? Response.json({ signed_in: true }) : Response.json({ signed_in: false }, { status: 401 });
  },
);
