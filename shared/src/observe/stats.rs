//! Counters per policy: how rl_check answered (admitted, refused, would refuse in shadow
//! mode, refused while blocked). Counting writes no row: the counts live in memory, the
//! engine's choice of where ([`install`]): PostgreSQL's shared memory when the library is
//! preloaded, else this process ([`ProcessCounters`]).
//!
//! [`CounterSlots`] is the layout PostgreSQL keeps in shared memory: fixed slots of
//! atomic words, found by the policy name's hash, incremented without a lock.

use std::collections::BTreeMap;
use std::hash::{Hash as _, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::json::Json;
use crate::refused::{self, Refused, RefusedSlots};

/// How one rl_check was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Admitted,
    Refused,
    /// A shadow policy admitted what enforcement would have refused (counted as admitted too).
    WouldRefuse,
    RefusedBlocked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PolicyCounts {
    pub admitted: u64,
    pub refused: u64,
    pub would_refuse: u64,
    pub refused_blocked: u64,
}

impl PolicyCounts {
    fn add(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Admitted => self.admitted += 1,
            Outcome::Refused => self.refused += 1,
            Outcome::WouldRefuse => {
                self.admitted += 1;
                self.would_refuse += 1
            }
            Outcome::RefusedBlocked => self.refused_blocked += 1,
        }
    }
}

/// Where counts go.
pub trait CounterSink: Sync {
    fn count(&self, policy: &str, outcome: Outcome);
    fn snapshot(&self) -> Vec<(String, PolicyCounts)>;
    /// Forgets every count; returns how many policies had some.
    fn reset(&self) -> usize;
    /// What the counts cover, as rl_stats reports it.
    fn scope(&self) -> &'static str;
    /// Notes that rl_check refused `subject` under `policy` ([`crate::refused`]).
    fn refuse(&self, policy: &str, subject: &str, now_ms: i64);
    /// The `n` subjects of `policy` refused most since the last reset, most first.
    fn top_refused(&self, policy: &str, n: usize) -> Vec<Refused>;
}

/// Counts of this process only (SQLite; PostgreSQL without preload: this session), and
/// the refused subjects' summary, made at the first refusal.
#[derive(Default)]
pub struct ProcessCounters(Mutex<BTreeMap<String, PolicyCounts>>, Mutex<Vec<AtomicU64>>);

impl ProcessCounters {
    fn with_refused<R>(&self, f: impl FnOnce(RefusedSlots) -> R) -> R {
        let mut words = self.1.lock().unwrap_or_else(|p| p.into_inner());
        if words.is_empty() {
            words.extend((0..refused::WORDS).map(|_| AtomicU64::new(0)));
        }
        f(RefusedSlots(&words))
    }
}

impl CounterSink for ProcessCounters {
    fn count(&self, policy: &str, outcome: Outcome) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(policy.to_owned()).or_default().add(outcome);
    }

    fn snapshot(&self) -> Vec<(String, PolicyCounts)> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    fn reset(&self) -> usize {
        self.1.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *map).len()
    }

    fn scope(&self) -> &'static str {
        "process"
    }

    fn refuse(&self, policy: &str, subject: &str, now_ms: i64) {
        self.with_refused(|slots| {
            slots.record(policy, subject, now_ms) || (slots.claim(policy) && slots.record(policy, subject, now_ms))
        });
    }

    fn top_refused(&self, policy: &str, n: usize) -> Vec<Refused> {
        if self.1.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
            return Vec::new();
        }
        self.with_refused(|slots| slots.top(policy, n))
    }
}

static SINK: OnceLock<&'static dyn CounterSink> = OnceLock::new();

/// Chooses where counts go, once per process, before the first count; later calls are ignored.
pub fn install(sink: &'static dyn CounterSink) {
    let _ = SINK.set(sink);
}

/// Where counts go: the installed sink, else this process.
pub fn sink() -> &'static dyn CounterSink {
    *SINK.get_or_init(|| Box::leak(Box::<ProcessCounters>::default()))
}

/// rl_stats' JSON: policy name to its counts, and what they cover.
pub fn to_json(sink: &dyn CounterSink) -> Json {
    let policies = sink
        .snapshot()
        .into_iter()
        .map(|(name, c)| {
            let counts = Json::Object(vec![
                ("admitted", Json::Int(c.admitted as i64)),
                ("refused", Json::Int(c.refused as i64)),
                ("would_refuse", Json::Int(c.would_refuse as i64)),
                ("refused_blocked", Json::Int(c.refused_blocked as i64)),
            ]);
            (name, counts)
        })
        .collect();
    Json::Object(vec![("scope", Json::Str(sink.scope().to_owned())), ("policies", Json::Map(policies))])
}

/// Words of one slot: hash, name length, name bytes, four counts.
pub const SLOT_WORDS: usize = 2 + NAME_WORDS + 4;
const NAME_WORDS: usize = 15;
/// Bytes of a name a slot keeps; a longer name is kept by its hash and shown cut.
pub const NAME_BYTES: usize = NAME_WORDS * 8;

/// A 64-bit name of a policy, never 0 (0 marks a free slot).
pub(crate) fn name_hash(policy: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    policy.hash(&mut h);
    h.finish().max(1)
}

/// Counter slots over atomic words (PostgreSQL's shared memory). Counting only reads a
/// slot's identity and adds to its counts; claiming a free slot and resetting need the
/// caller's exclusive lock, so a slot's identity never changes under a shared one.
pub struct CounterSlots<'a>(pub &'a [AtomicU64]);

impl CounterSlots<'_> {
    fn slots(&self) -> impl Iterator<Item = &[AtomicU64]> {
        self.0.chunks_exact(SLOT_WORDS)
    }

    /// Adds `outcome` to `policy`'s slot; false when it has none yet (claim one first).
    pub fn add(&self, policy: &str, outcome: Outcome) -> bool {
        let hash = name_hash(policy);
        let Some(slot) = self.slots().find(|s| s[0].load(Ordering::Acquire) == hash) else { return false };
        let count = |i: usize| slot[2 + NAME_WORDS + i].fetch_add(1, Ordering::Relaxed);
        match outcome {
            Outcome::Admitted => count(0),
            Outcome::Refused => count(1),
            Outcome::WouldRefuse => {
                count(0);
                count(2)
            }
            Outcome::RefusedBlocked => count(3),
        };
        true
    }

    /// Gives `policy` a free slot (under the caller's exclusive lock); false when full.
    pub fn claim(&self, policy: &str) -> bool {
        let hash = name_hash(policy);
        if self.slots().any(|s| s[0].load(Ordering::Acquire) == hash) {
            return true;
        }
        let Some(slot) = self.slots().find(|s| s[0].load(Ordering::Acquire) == 0) else { return false };
        let name = &policy.as_bytes()[..policy.len().min(NAME_BYTES)];
        let mut words = [0u64; NAME_WORDS];
        for (i, chunk) in name.chunks(8).enumerate() {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            words[i] = u64::from_le_bytes(b);
        }
        slot[1].store(name.len() as u64, Ordering::Relaxed);
        for (w, v) in slot[2..2 + NAME_WORDS].iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        for c in &slot[2 + NAME_WORDS..] {
            c.store(0, Ordering::Relaxed);
        }
        slot[0].store(hash, Ordering::Release);
        true
    }

    pub fn snapshot(&self) -> Vec<(String, PolicyCounts)> {
        let mut out: Vec<(String, PolicyCounts)> = self
            .slots()
            .filter(|s| s[0].load(Ordering::Acquire) != 0)
            .map(|s| {
                let len = (s[1].load(Ordering::Relaxed) as usize).min(NAME_BYTES);
                let bytes: Vec<u8> = s[2..2 + NAME_WORDS]
                    .iter()
                    .flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes())
                    .take(len)
                    .collect();
                let c = |i: usize| s[2 + NAME_WORDS + i].load(Ordering::Relaxed);
                let counts = PolicyCounts { admitted: c(0), refused: c(1), would_refuse: c(2), refused_blocked: c(3) };
                (String::from_utf8_lossy(&bytes).into_owned(), counts)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Frees every slot (under the caller's exclusive lock); returns how many were used.
    pub fn reset(&self) -> usize {
        let used = self.slots().filter(|s| s[0].load(Ordering::Acquire) != 0).count();
        for w in self.0 {
            w.store(0, Ordering::Relaxed);
        }
        used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_count_claim_and_reset() {
        let words: Vec<AtomicU64> = (0..SLOT_WORDS * 2).map(|_| AtomicU64::new(0)).collect();
        let slots = CounterSlots(&words);
        assert!(!slots.add("login", Outcome::Admitted), "no slot yet");
        assert!(slots.claim("login") && slots.claim("login"));
        let long = "x".repeat(200);
        assert!(slots.claim(&long));
        assert!(!slots.claim("third"), "full");
        for outcome in [Outcome::Admitted, Outcome::WouldRefuse, Outcome::Refused, Outcome::RefusedBlocked] {
            assert!(slots.add("login", outcome));
        }
        let snapshot = slots.snapshot();
        let counts = PolicyCounts { admitted: 2, refused: 1, would_refuse: 1, refused_blocked: 1 };
        assert_eq!(snapshot[0], ("login".to_owned(), counts));
        assert_eq!(snapshot[1].0.len(), NAME_BYTES, "a long name is shown cut");
        assert_eq!(slots.reset(), 2);
        assert!(slots.snapshot().is_empty());
    }
}
