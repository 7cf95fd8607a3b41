//! What a thread (in PostgreSQL, a session) remembers between calls of rl_check: the
//! policies it parsed, by revision, and the subjects it knows have a recorded block, at a
//! checks epoch. Never trusted alone: a write proves the epoch unmoved, or checks the
//! revision and the subject in its own statement. The one state of the core that outlives
//! a call besides the counters ([`crate::stats`]); [`crate::policy`] stays pure.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use crate::error::Result;
use crate::penalty::Strikes;
use crate::policy::Policy;
use crate::store::StoredPolicy;

/// Most policies one thread keeps parsed; past it the cache starts again.
const CACHED_POLICIES: usize = 256;

/// A policy as this thread last read it.
#[derive(Clone)]
pub struct CachedPolicy {
    pub policy: Rc<Policy>,
    pub revision: i64,
    /// The store's checks epoch over the read (None: unknown, or it moved meanwhile).
    pub epoch: Option<u64>,
}

thread_local! {
    /// Policies parsed by this thread (in PostgreSQL, this session), by name. Never
    /// trusted alone: a write checks the revision in its own statement unless the store's
    /// checks epoch has not moved since the read.
    static POLICIES: RefCell<HashMap<String, CachedPolicy>> = RefCell::new(HashMap::new());
    /// The subjects with a recorded block as this thread last listed them, and the checks
    /// epoch of that list (None: more subjects with strikes than it keeps).
    static KNOWN_BLOCKS: RefCell<Option<(u64, Option<HashSet<String>>)>> = const { RefCell::new(None) };
}

/// Most subjects with strikes or blocks whose list a thread keeps; past it each check
/// finds the subject's strikes in its own statement.
pub const KNOWN_STRIKE_ROWS: i64 = 256;

/// The policy `name` as this thread last read it.
pub fn cached(name: &str) -> Option<CachedPolicy> {
    POLICIES.with(|c| c.borrow().get(name).cloned())
}

/// The parsed policy of `stored`, read at `epoch`: from the cache when its revision is
/// known, else parsed and kept.
pub fn parsed(name: &str, stored: &StoredPolicy, epoch: Option<u64>) -> Result<Rc<Policy>> {
    let policy = match cached(name) {
        Some(c) if c.revision == stored.revision => c.policy,
        _ => Rc::new(Policy::parse(&stored.definition)?),
    };
    POLICIES.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= CACHED_POLICIES && !c.contains_key(name) {
            c.clear();
        }
        c.insert(name.to_owned(), CachedPolicy { policy: policy.clone(), revision: stored.revision, epoch });
    });
    Ok(policy)
}

/// Forgets what this thread read of policy `name` (it has just set or dropped it).
pub fn forget(name: &str) {
    POLICIES.with(|c| c.borrow_mut().remove(name));
}

/// Forgets this thread's list of blocked subjects (it has just recorded a new block).
pub fn forget_blocks() {
    KNOWN_BLOCKS.with(|k| *k.borrow_mut() = None);
}

/// Whether this thread's list of blocked subjects was made at `epoch`.
pub fn blocks_known_at(epoch: u64) -> bool {
    KNOWN_BLOCKS.with(|k| k.borrow().as_ref().is_some_and(|(at, _)| *at == epoch))
}

/// Keeps the subjects with a recorded block among `rows` (subject, entries) as read at
/// `epoch`; a list longer than [`KNOWN_STRIKE_ROWS`] is not kept, and a row that does not
/// decode counts as a block.
pub fn know_blocks(epoch: u64, rows: Vec<(String, String)>) {
    let subjects = (rows.len() as i64 <= KNOWN_STRIKE_ROWS).then(|| {
        rows.into_iter()
            .filter(|(_, entries)| Strikes::decode(entries).is_none_or(|s| s.block.is_some()))
            .map(|(subject, _)| subject)
            .collect()
    });
    KNOWN_BLOCKS.with(|k| *k.borrow_mut() = Some((epoch, subjects)));
}

/// Whether, at `epoch`, this thread knows `subject` has no recorded block.
pub fn known_unblocked(epoch: u64, subject: &str) -> bool {
    KNOWN_BLOCKS.with(|k| match &*k.borrow() {
        Some((at, Some(blocked))) => *at == epoch && !blocked.contains(subject),
        _ => false,
    })
}
