// Prometheus metrics of the middleware, through prom-client (an optional dependency).

/** What a request came to, as the `outcome` label (the same values as the Python package). */
export type Outcome = "admitted" | "refused" | "refused_locally" | "shed" | "fallback_admitted" | "fallback_refused"
  | "database_errors" | "missing_policies";

export interface Metrics {
  count(route: string | undefined, outcome: Outcome, policy?: string): void;
  observe(route: string | undefined, seconds: number): void;
  /** The database refused `subject` on `route` (optional). */
  refuse?(route: string, policy: string | undefined, subject: string): void;
}

/** The `k` subjects refused most (a space-saving summary, as the database's rl_top_refused
 * keeps): a new subject past `k` takes the place of the least refused, inheriting its count. */
export class TopSubjects {
  readonly entries = new Map<string, [number, number]>(); // subject: [refusals, error], in the order they came
  constructor(readonly k: number) {}

  /** The subject's count, and the subject it replaced. */
  add(subject: string): [number, string | undefined] {
    const entry = this.entries.get(subject);
    if (entry) return [++entry[0], undefined];
    if (this.entries.size < this.k) {
      this.entries.set(subject, [1, 0]);
      return [1, undefined];
    }
    let victim: string | undefined;
    let least = Infinity;
    for (const [s, [n]] of this.entries) if (n < least) { least = n; victim = s; }
    this.entries.delete(victim!);
    this.entries.set(subject, [least + 1, least]);
    return [least + 1, victim];
  }
}

/**
 * `ratelimit_requests_total{route, policy, outcome}`, the database check's latency
 * `ratelimit_check_seconds{route}` (a histogram), and the subjects the database refused
 * most per route, `ratelimit_refused_subject_refusals{route, policy, subject}` (a gauge of
 * at most `topSubjects` per route, this process's refusals), in `register` (prom-client's
 * default unless given). `policy` is the route's policy, empty for explicit limits. Pass it
 * as the middleware's `metrics`; serve `await register.metrics()` on a route of your own.
 */
export class PrometheusMetrics implements Metrics {
  readonly register: any;
  private requests: any;
  private checkSeconds: any;
  private refusedSubjects: any;
  private readonly tops = new Map<string, TopSubjects>();
  private readonly topSubjects: number;

  constructor({ register, prefix = "ratelimit_", topSubjects = 10 }: { register?: any; prefix?: string; topSubjects?: number } = {}) {
    this.topSubjects = topSubjects;
    let client;
    try {
      // in a try: bundlers (Next.js) then leave the optional dependency out when it is absent
      client = require("prom-client");
    } catch (error) {
      throw new Error("ratelimit-web: PrometheusMetrics needs prom-client (npm install prom-client)", { cause: error });
    }
    this.register = register ?? client.register;
    this.requests = new client.Counter({ name: `${prefix}requests_total`, help: "Requests the rate-limit middleware decided, by route, policy and outcome",
      labelNames: ["route", "policy", "outcome"], registers: [this.register] });
    this.refusedSubjects = new client.Gauge({ name: `${prefix}refused_subject_refusals`,
      help: "Refusals of the subjects the database refused most, per route (at most topSubjects per route)",
      labelNames: ["route", "policy", "subject"], registers: [this.register] });
    this.checkSeconds = new client.Histogram({ name: `${prefix}check_seconds`, help: "Time the database took to answer a rate-limit check",
      labelNames: ["route"], registers: [this.register], buckets: [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1] });
  }

  count(route: string | undefined, outcome: Outcome, policy?: string): void {
    this.requests.inc({ route: route ?? "", policy: policy ?? "", outcome });
  }

  refuse(route: string, policy: string | undefined, subject: string): void {
    let top = this.tops.get(route);
    if (!top) this.tops.set(route, (top = new TopSubjects(this.topSubjects)));
    const [refusals, replaced] = top.add(subject);
    if (replaced !== undefined) this.refusedSubjects.remove({ route, policy: policy ?? "", subject: replaced });
    this.refusedSubjects.set({ route, policy: policy ?? "", subject }, refusals);
  }

  observe(route: string | undefined, seconds: number): void {
    this.checkSeconds.observe({ route: route ?? "" }, seconds);
  }
}
