// Limits checked before any route runs (Next.js 16's proxy, on the Node.js runtime).
import { NextResponse } from "next/server";
import { withRateLimit } from "ratelimit-web";
import { shared } from "./lib/ratelimit";

export const proxy = withRateLimit(
  {
    ...shared,
    tier: (request: Request) => request.headers.get("x-plan") ?? undefined,
    routes: {
      "POST /login": { policy: "web_login", sensitive: true },
      "/api/small/*": { limits: [{ burst: 5, refill_per_minute: 1e-6 }], tiers: { free: 1, pro: 2 } },
      "/api/*": { limits: [{ burst: 300, refill_per_minute: 1e-6 }] },
    },
  },
  () => NextResponse.next(),
);

export const config = { matcher: ["/api/:path*", "/login"] };
