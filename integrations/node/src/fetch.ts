// A fetch that waits and retries on 429 and 503: as long as Retry-After says (seconds or
// an HTTP date), else a capped exponential backoff with full jitter; bounded retries, an
// overall deadline, and cancellation through init.signal.

export interface RetryOptions {
  /** Retries of one request. Default 3. */
  maxRetries?: number;
  /** The whole time, waits included: a wait that would end later is not made and the last
   * answer is returned. Default 30 s. */
  deadlineMs?: number;
  backoffBaseMs?: number;
  backoffMaxMs?: number;
  /** Up to this much is added to a Retry-After wait. Default 1 s. */
  jitterMs?: number;
  statuses?: number[];
  /** Retry a request whose method is not idempotent (POST, PATCH): only when it is safe. */
  retrySafe?: boolean;
  fetch?: typeof fetch;
  random?: () => number;
}

const IDEMPOTENT = new Set(["GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"]);

/** Retry-After in milliseconds from `now`: seconds or an HTTP date; undefined if unreadable. */
export function retryAfterMs(value: string | null | undefined, now = Date.now()): number | undefined {
  if (value === null || value === undefined) return undefined;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v) * 1000;
  const when = Date.parse(v);
  return Number.isNaN(when) ? undefined : Math.max(0, when - now);
}

export function backoffMs(attempt: number, { backoffBaseMs = 500, backoffMaxMs = 30_000, random = Math.random }: RetryOptions = {}): number {
  return random() * Math.min(backoffMaxMs, backoffBaseMs * 2 ** attempt);
}

function sleep(ms: number, signal?: AbortSignal | null): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

export async function fetchWithRateLimit(input: string | URL | Request, init: RequestInit & RetryOptions = {}): Promise<Response> {
  const { maxRetries = 3, deadlineMs = 30_000, jitterMs = 1000, statuses = [429, 503], retrySafe = false,
    fetch: fetchImpl = fetch, random = Math.random, ...rest } = init;
  const method = (init.method ?? (input instanceof Request ? input.method : "GET")).toUpperCase();
  // a streamed body cannot be sent twice
  const replayable = !(init.body instanceof ReadableStream) && !(input instanceof Request && input.body);
  const mayRetry = (IDEMPOTENT.has(method) || retrySafe) && replayable;
  const endsAt = Date.now() + deadlineMs;
  for (let attempt = 0; ; attempt++) {
    const response = await fetchImpl(input, rest);
    if (!statuses.includes(response.status) || attempt >= maxRetries || !mayRetry) return response;
    const told = retryAfterMs(response.headers.get("retry-after"));
    const wait = told !== undefined ? told + random() * jitterMs : backoffMs(attempt, { ...init, random });
    if (Date.now() + wait > endsAt) return response;
    await response.body?.cancel();
    await sleep(wait, init.signal);
  }
}
