//! The subjects rl_check refuses most, per policy: a space-saving summary (Metwally,
//! Agrawal and El Abbadi, 2005) of [`ENTRIES`] subjects for each of [`POLICIES`] policies,
//! in a fixed block of atomic words, so PostgreSQL keeps it in shared memory and SQLite
//! (and a PostgreSQL session without preload) in the process, with one rule.
//!
//! A refusal of a subject the summary holds adds 1 to its count. A new subject takes a
//! free entry (count 1, error 0) or, when all are used, the entry with the least count
//! `m`: count `m + 1`, error `m`. So a listed subject was refused between `refusals -
//! error` and `refusals` times, and any subject refused more than `total / ENTRIES` times
//! since the reset is listed.
//!
//! Layout of one policy's slot: the policy name's hash (0: free), a lock word, then the
//! entries: the subject's hash (0: free), refusals, error, last refusal (epoch ms), the
//! subject's length in bytes and its first [`SUBJECT_BYTES`] bytes. An entry changes only
//! under its slot's lock, a short spin lock held for one pass over the entries with no
//! allocation and nothing that can fail; a slot's policy changes only under the lock of
//! its slot and the caller's exclusive lock (claim, reset), as in [`crate::stats`].

use std::sync::atomic::{AtomicU64, Ordering};

use crate::json::Json;

/// Subjects kept per policy.
pub const ENTRIES: usize = 64;
/// Policies with a summary; a policy beyond them has none.
pub const POLICIES: usize = 128;
const SUBJECT_WORDS: usize = 12;
/// Bytes of a subject an entry shows; a longer one is known by its hash and shown cut.
pub const SUBJECT_BYTES: usize = SUBJECT_WORDS * 8;
const ENTRY_WORDS: usize = 5 + SUBJECT_WORDS;
const SLOT_WORDS: usize = 2 + ENTRIES * ENTRY_WORDS;
/// Words of the whole summary: about 1.1 MB.
pub const WORDS: usize = POLICIES * SLOT_WORDS;

/// One listed subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub subject: String,
    /// At least the true count, at most `error` more.
    pub refusals: u64,
    pub error: u64,
    pub last_refused_ms: i64,
}

/// The summaries over `WORDS` atomic words.
pub struct RefusedSlots<'a>(pub &'a [AtomicU64]);

/// A slot's spin lock, released when dropped.
struct SlotLock<'a>(&'a AtomicU64);

impl<'a> SlotLock<'a> {
    fn take(word: &'a AtomicU64) -> Self {
        let mut spins = 0u32;
        while word.compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            spins += 1;
            if spins.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        SlotLock(word)
    }
}

impl Drop for SlotLock<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

/// The bytes of `s` an entry keeps: at most [`SUBJECT_BYTES`], cut at a character's start.
fn shown(s: &str) -> &str {
    let mut end = s.len().min(SUBJECT_BYTES);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl RefusedSlots<'_> {
    fn slots(&self) -> impl Iterator<Item = &[AtomicU64]> {
        self.0.chunks_exact(SLOT_WORDS)
    }

    fn slot_of(&self, policy: &str) -> Option<&[AtomicU64]> {
        let hash = crate::stats::name_hash(policy);
        self.slots().find(|s| s[0].load(Ordering::Acquire) == hash)
    }

    /// Counts a refusal of `subject` under `policy`; false when the policy has no slot yet
    /// (claim one first).
    pub fn record(&self, policy: &str, subject: &str, now_ms: i64) -> bool {
        let Some(slot) = self.slot_of(policy) else { return false };
        let _lock = SlotLock::take(&slot[1]);
        if slot[0].load(Ordering::Relaxed) != crate::stats::name_hash(policy) {
            return false; // reset and claimed by another policy meanwhile
        }
        let hash = crate::stats::name_hash(subject);
        let entries = slot[2..].chunks_exact(ENTRY_WORDS);
        let mut least: Option<(&[AtomicU64], u64)> = None;
        for e in entries {
            let (h, count) = (e[0].load(Ordering::Relaxed), e[1].load(Ordering::Relaxed));
            if h == hash {
                e[1].store(count + 1, Ordering::Relaxed);
                e[3].store(now_ms as u64, Ordering::Relaxed);
                return true;
            }
            let count = if h == 0 { 0 } else { count };
            if least.is_none_or(|(_, m)| count < m) {
                least = Some((e, count));
            }
        }
        let Some((e, m)) = least else { return true };
        let name = shown(subject).as_bytes();
        e[0].store(hash, Ordering::Relaxed);
        e[1].store(m + 1, Ordering::Relaxed);
        e[2].store(m, Ordering::Relaxed);
        e[3].store(now_ms as u64, Ordering::Relaxed);
        e[4].store(name.len() as u64, Ordering::Relaxed);
        for (i, w) in e[5..].iter().enumerate() {
            let mut b = [0u8; 8];
            let part = name.get(i * 8..).unwrap_or_default();
            let n = part.len().min(8);
            b[..n].copy_from_slice(&part[..n]);
            w.store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
        true
    }

    /// Whether some slot is free (read without a lock: a refusal of a policy without a
    /// slot asks before it takes the caller's exclusive lock to claim one).
    pub fn has_free(&self) -> bool {
        self.slots().any(|s| s[0].load(Ordering::Acquire) == 0)
    }

    /// Gives `policy` a free slot (under the caller's exclusive lock); false when full.
    pub fn claim(&self, policy: &str) -> bool {
        if self.slot_of(policy).is_some() {
            return true;
        }
        let Some(slot) = self.slots().find(|s| s[0].load(Ordering::Acquire) == 0) else { return false };
        let _lock = SlotLock::take(&slot[1]);
        for w in &slot[2..] {
            w.store(0, Ordering::Relaxed);
        }
        slot[0].store(crate::stats::name_hash(policy), Ordering::Release);
        true
    }

    /// The `n` subjects of `policy` refused most, most first (then by subject).
    pub fn top(&self, policy: &str, n: usize) -> Vec<Refused> {
        let Some(slot) = self.slot_of(policy) else { return Vec::new() };
        let mut out = Vec::new();
        {
            let _lock = SlotLock::take(&slot[1]);
            if slot[0].load(Ordering::Relaxed) != crate::stats::name_hash(policy) {
                return Vec::new();
            }
            for e in slot[2..].chunks_exact(ENTRY_WORDS).filter(|e| e[0].load(Ordering::Relaxed) != 0) {
                let len = (e[4].load(Ordering::Relaxed) as usize).min(SUBJECT_BYTES);
                let bytes: Vec<u8> =
                    e[5..].iter().flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes()).take(len).collect();
                out.push(Refused {
                    subject: String::from_utf8_lossy(&bytes).into_owned(),
                    refusals: e[1].load(Ordering::Relaxed),
                    error: e[2].load(Ordering::Relaxed),
                    last_refused_ms: e[3].load(Ordering::Relaxed) as i64,
                });
            }
        }
        out.sort_by(|a, b| b.refusals.cmp(&a.refusals).then_with(|| a.subject.cmp(&b.subject)));
        out.truncate(n);
        out
    }

    /// Frees every slot (under the caller's exclusive lock).
    pub fn reset(&self) {
        for slot in self.0.chunks_exact(SLOT_WORDS) {
            let _lock = SlotLock::take(&slot[1]);
            slot[0].store(0, Ordering::Release);
            for w in &slot[2..] {
                w.store(0, Ordering::Relaxed);
            }
        }
    }
}

/// rl_top_refused's JSON.
pub fn to_json(policy: &str, scope: &str, top: &[Refused]) -> Json {
    let subjects = top
        .iter()
        .map(|r| {
            Json::Object(vec![
                ("subject", Json::Str(r.subject.clone())),
                ("refusals", Json::Int(r.refusals as i64)),
                ("error", Json::Int(r.error as i64)),
                ("last_refused_ms", Json::Int(r.last_refused_ms)),
            ])
        })
        .collect();
    Json::Object(vec![
        ("policy", Json::Str(policy.to_owned())),
        ("scope", Json::Str(scope.to_owned())),
        ("subjects", Json::Array(subjects)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words() -> Vec<AtomicU64> {
        (0..SLOT_WORDS * 2).map(|_| AtomicU64::new(0)).collect()
    }

    #[test]
    fn counts_until_full_then_replaces_the_least() {
        let w = words();
        let s = RefusedSlots(&w);
        assert!(!s.record("login", "a", 1), "no slot yet");
        assert!(s.claim("login") && s.claim("login") && s.claim("api"));
        assert!(!s.claim("third") && !s.has_free(), "full");
        for i in 0..ENTRIES {
            for _ in 0..=i {
                assert!(s.record("login", &format!("s{i:02}"), 10 + i as i64));
            }
        }
        let top = s.top("login", 3);
        assert_eq!(top[0], Refused { subject: "s63".into(), refusals: 64, error: 0, last_refused_ms: 73 });
        assert_eq!(top.len(), 3);
        // a new subject replaces s00 (1 refusal): count 2, error 1
        assert!(s.record("login", "new", 99));
        let all = s.top("login", ENTRIES);
        assert_eq!(all.len(), ENTRIES);
        assert!(!all.iter().any(|r| r.subject == "s00"));
        let new = all.iter().find(|r| r.subject == "new").unwrap();
        assert_eq!((new.refusals, new.error, new.last_refused_ms), (2, 1, 99));
        assert!(s.top("api", 5).is_empty() && s.top("unknown", 5).is_empty());
    }

    #[test]
    fn long_subjects_are_cut_at_a_character() {
        let w = words();
        let s = RefusedSlots(&w);
        s.claim("p");
        let long = "é".repeat(100); // 200 bytes
        s.record("p", &long, 1);
        s.record("p", &long, 2);
        let top = s.top("p", 1);
        assert_eq!(top[0].refusals, 2, "known by the whole subject's hash");
        assert_eq!(top[0].subject, "é".repeat(SUBJECT_BYTES / 2));
    }

    #[test]
    fn reset_frees_every_slot() {
        let w = words();
        let s = RefusedSlots(&w);
        s.claim("p");
        s.record("p", "x", 1);
        s.reset();
        assert!(s.top("p", 5).is_empty());
        assert!(!s.record("p", "x", 2));
    }

    #[test]
    fn concurrent_records_are_all_counted() {
        let w = words();
        let s = RefusedSlots(&w);
        s.claim("p");
        std::thread::scope(|t| {
            for _ in 0..4 {
                t.spawn(|| {
                    for i in 0..1000 {
                        s.record("p", if i % 2 == 0 { "even" } else { "odd" }, i);
                    }
                });
            }
        });
        let top = s.top("p", 2);
        assert_eq!(top.iter().map(|r| r.refusals).sum::<u64>(), 4000);
    }
}
