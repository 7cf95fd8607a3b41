export { Counters, LocalBucket, RateLimitCore, RefusalCache } from "./core";
export type { Decision, Options } from "./core";
export { rateLimit } from "./express";
export { fetchWithRateLimit, retryAfterMs, backoffMs } from "./fetch";
export type { RetryOptions } from "./fetch";
export { withRateLimit } from "./fetch-handler";
export type { FetchOptions } from "./fetch-handler";
export { DatabaseUnavailable, limitKey, PostgresLimiter, SqliteLimiter } from "./limiter";
export type { Answer, Limit, Limiter, Route } from "./limiter";
