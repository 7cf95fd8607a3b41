export { Counters, LocalBucket, RateLimitCore, RefusalCache, RequestLimits, addressSubject, bounded, charge, clientAddress, databaseOf,
  networks, normalizeIdentifier, normalizePath, parseAddress, refund, refundRule, routeFor, IDENTIFIER_MAX_BYTES } from "./core";
export type { Address, Decision, Network, Options } from "./core";
export { rateLimit } from "./express";
export { fetchWithRateLimit, retryAfterMs, backoffMs } from "./fetch";
export type { RetryOptions } from "./fetch";
export { peers, withRateLimit } from "./fetch-handler";
export type { FetchOptions } from "./fetch-handler";
export { DatabaseUnavailable, isMissingPolicy, limitKey, PostgresLimiter, SqliteLimiter, UNKNOWN_POLICY_PREFIXES,
  UNKNOWN_POLICY_SQLSTATE } from "./limiter";
export type { Answer, Limit, Limiter, RefundOn, Route } from "./limiter";
export { PrometheusMetrics, TopSubjects } from "./metrics";
export type { Metrics, Outcome } from "./metrics";
export { AdminView, headerToken, MAX_BODY_BYTES } from "./admin";
export type { AdminAnswer, AdminOptions, AdminRequest } from "./admin";
