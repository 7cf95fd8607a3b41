//! Units, ranges and calendar periods: the leaf module every other one builds on.

pub const MS_PER_MINUTE: f64 = 60_000.0;
pub const MS_PER_DAY: i64 = 86_400_000;
pub const MS_PER_HOUR: i64 = 3_600_000;

/// Longest wait ever reported (2^53 - 1 ms, about 285,000 years): keeps every reported
/// time an exact integer in any JSON reader, and times far from overflow.
pub const MAX_WAIT_MS: i64 = (1 << 53) - 1;

/// Longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;

/// Latest clock reading accepted: 9999-12-31T23:59:59.999Z. Keeps every derived time
/// (period ends, retry times) far from integer overflow and inside calendar range.
pub const MAX_NOW_MS: i64 = 253_402_300_799_999;

/// Largest budget quota or cost. Amounts are integer millionths; below 2^53 millionths
/// every amount and every sum of two is exact in f64 and in any JSON reader.
pub const MAX_AMOUNT: f64 = 1e9;

/// Largest bucket burst, refill_per_minute or cost, and the deepest debt rl_charge may
/// leave: every token count below 2^53 is an exact integer in f64 and in any JSON reader,
/// and this leaves room for a fraction.
pub const MAX_TOKENS: f64 = 1e15;

/// Longest JSON argument accepted (rl_take_all's limits, rl_policy_set's definition,
/// rl_headers' result), in bytes: 64 items with keys of the longest length fit in about
/// a third of it. Checked before anything is parsed, so no call's work grows past it.
pub const MAX_JSON_BYTES: usize = 262_144;

/// Longest window or lease: a year of 365 days, in seconds.
pub const MAX_DURATION_SECONDS: f64 = 31_536_000.0;

/// Budget amounts are counted in millionths, so costs with up to 6 decimals are exact.
pub const MICROS_PER_UNIT: i64 = 1_000_000;

/// 64 bits no caller can predict: SipHash under the keys std draws from the operating
/// system's random source for each process, over a counter it moves on every call and the
/// time. Used for lease ids and policy revisions.
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    h.finish()
}

/// Whole seconds, rounded up: a wait of 1 ms is 1 s, never 0.
pub fn ceil_seconds(ms: i64) -> i64 {
    (ms + 999).div_euclid(1000)
}

pub use crate::period::{Period, Unit};

/// The first character of every key a policy derives. Raw keys may not start with it,
/// so no rl_take key can name a policy's state.
pub const POLICY_KEY_MARK: char = '\u{1}';
