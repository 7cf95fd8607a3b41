// Generated from shared/src/kinds/limit_json.rs (KINDS) by ratelimit_codegen
// (RL_BLESS=1 cargo test -p ratelimit_codegen --test generated): do not edit.

import type { Period } from "./limiter";

/** A limit as rl_take_all takes it, without key and cost: one of the engine's kinds. */
export type Limit =
  /** A budget: `quota` units per calendar `period` ("day", "month from 15", "day in Europe/Paris": a unit, an anchor, a zone). */
  | { period: Period; quota: number }
  /** A fixed window: `limit` per epoch-aligned window, counted anew at each window's start. */
  | { limit: number; fixed_window_seconds: number }
  /** A sliding window: at most `limit` in any `window_seconds`. */
  | { limit: number; window_seconds: number }
  /** A token bucket: `burst` tokens, refilled at `refill_per_minute`. */
  | { burst: number; refill_per_minute: number };
