// Prometheus metrics of the middleware, through prom-client (an optional dependency).

/** What a request came to, as the `outcome` label (the same values as the Python package). */
export type Outcome = "admitted" | "refused" | "refused_locally" | "shed" | "fallback_admitted" | "fallback_refused"
  | "database_errors" | "missing_policies";

export interface Metrics {
  count(route: string | undefined, outcome: Outcome): void;
  observe(route: string | undefined, seconds: number): void;
}

/**
 * `ratelimit_requests_total{route, outcome}` and the database check's latency,
 * `ratelimit_check_seconds{route}` (a histogram), in `register` (prom-client's default
 * unless given). Pass it as the middleware's `metrics`; serve `await register.metrics()`
 * on a route of your own (/metrics).
 */
export class PrometheusMetrics implements Metrics {
  readonly register: any;
  private requests: any;
  private checkSeconds: any;

  constructor({ register, prefix = "ratelimit_" }: { register?: any; prefix?: string } = {}) {
    let client;
    try {
      // in a try: bundlers (Next.js) then leave the optional dependency out when it is absent
      client = require("prom-client");
    } catch (error) {
      throw new Error("ratelimit-web: PrometheusMetrics needs prom-client (npm install prom-client)", { cause: error });
    }
    this.register = register ?? client.register;
    this.requests = new client.Counter({ name: `${prefix}requests_total`, help: "Requests the rate-limit middleware decided, by route and outcome",
      labelNames: ["route", "outcome"], registers: [this.register] });
    this.checkSeconds = new client.Histogram({ name: `${prefix}check_seconds`, help: "Time the database took to answer a rate-limit check",
      labelNames: ["route"], registers: [this.register], buckets: [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1] });
  }

  count(route: string | undefined, outcome: Outcome): void {
    this.requests.inc({ route: route ?? "", outcome });
  }

  observe(route: string | undefined, seconds: number): void {
    this.checkSeconds.observe({ route: route ?? "" }, seconds);
  }
}
