// Limits checked before any route runs (Next.js 16's proxy, on the Node.js runtime):
// explicit limits on the API, with tiers. A proxy cannot give back what a route's answer
// should refund (the route answers after it): app/login/route.ts limits its sign-ins itself.
import { NextResponse } from "next/server";
import { withRateLimit } from "ratelimit-web";
import { shared } from "./lib/ratelimit";

export const proxy = withRateLimit(
  {
    ...shared,
    routes: {
      // 20 at once, refilled at 1 a second; a pro plan gets 5 times that
      "/api/*": { limits: [{ burst: 20, refill_per_minute: 60 }], tiers: { free: 1, pro: 5 } },
    },
  },
  () => NextResponse.next(),
);

export const config = { matcher: ["/api/:path*"] };
