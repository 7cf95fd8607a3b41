//! Penalties and blocks: strikes against a subject that escalate into blocks, and blocks
//! set directly. Pure: the stored state in, the answer and the state to store out. A
//! subject's state is one row of entries (kind `block`, key the subject) holding JSON.

use serde_json::{json, Value};

use crate::units::{ceil_seconds, MAX_WAIT_MS};

/// Most strikes rl_penalize may let pass before it blocks (`free_strikes`).
pub const MAX_FREE_STRIKES: i64 = 1_000_000;

/// How long a subject is blocked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    Until(i64),
    /// Until rl_unblock.
    Indefinite,
}

/// What a subject stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Strikes {
    pub strikes: i64,
    pub last_strike_at: i64,
    /// When the strikes are forgotten: the latest end any strike's own window gave them,
    /// so no later call with a shorter window forgets them sooner.
    pub forgotten_at: i64,
    pub block: Option<Block>,
}

/// rl_penalize's escalation: `free_strikes` go unpunished; strike n beyond them blocks
/// for min(base × 2^(n − free), max); strikes are forgotten `window_ms` after the last.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Escalation {
    pub free_strikes: i64,
    pub base_ms: i64,
    pub max_ms: i64,
    pub window_ms: i64,
}

impl Strikes {
    /// Whether the subject is blocked at `now`, and until when.
    pub fn block_at(&self, now: i64) -> Option<Block> {
        self.block.filter(|b| match b {
            Block::Until(t) => *t > now,
            Block::Indefinite => true,
        })
    }

    /// When the row stops mattering (the sweep removes it from then on).
    pub fn empty_at(&self) -> i64 {
        let strikes_end = if self.strikes > 0 { self.forgotten_at } else { 0 };
        match self.block {
            Some(Block::Indefinite) => i64::MAX,
            Some(Block::Until(t)) => t.max(strikes_end),
            None => strikes_end,
        }
    }

    pub fn encode(&self) -> String {
        let block = match self.block {
            None => Value::Bool(false),
            Some(Block::Indefinite) => Value::Null,
            Some(Block::Until(t)) => json!(t),
        };
        json!({"strikes": self.strikes, "last_strike_at": self.last_strike_at, "forgotten_at": self.forgotten_at,
               "blocked_until": block})
        .to_string()
    }

    pub fn decode(text: &str) -> Option<Strikes> {
        let v: Value = serde_json::from_str(text).ok()?;
        let block = match v.get("blocked_until")? {
            Value::Bool(false) => None,
            Value::Null => Some(Block::Indefinite),
            t => Some(Block::Until(t.as_i64()?)),
        };
        let last_strike_at = v.get("last_strike_at")?.as_i64()?;
        Some(Strikes {
            strikes: v.get("strikes")?.as_i64()?,
            last_strike_at,
            // a row written before forgotten_at was recorded: the next strike's window decides
            forgotten_at: match v.get("forgotten_at") {
                None => last_strike_at,
                Some(t) => t.as_i64()?,
            },
            block,
        })
    }
}

/// Whether a write from `old` to `new` gives the subject a recorded block it did not have
/// (ended or not): the change that must move the checks epoch, since a thread's list of
/// blocked subjects holds every subject with a recorded block when it was made.
/// (SQLite's triggers, in sql/schema/sqlite_schema.sql, apply the same rule to the stored JSON.)
pub fn records_new_block(old: Option<&Strikes>, new: &Strikes) -> bool {
    new.block.is_some() && old.is_none_or(|o| o.block.is_none())
}

/// What rl_penalize and rl_block answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockAnswer {
    pub strikes: i64,
    pub block: Option<Block>,
    pub now: i64,
}

impl BlockAnswer {
    /// The answer's fields: strikes, blocked, blocked_until (epoch seconds, rounded up;
    /// null when not blocked or blocked until unblocked), retry_after_seconds (0 when not
    /// blocked; null when blocked until unblocked).
    pub fn fields(&self) -> (i64, bool, Option<i64>, Option<i64>) {
        match self.block {
            None => (self.strikes, false, None, Some(0)),
            Some(Block::Indefinite) => (self.strikes, true, None, None),
            Some(Block::Until(t)) => (self.strikes, true, Some(ceil_seconds(t)), Some(ceil_seconds(t - self.now))),
        }
    }
}

/// One strike at `now`. Earlier strikes still count until the later of the end their own
/// windows gave them and this call's window after the last strike: a call cannot make
/// strikes expire sooner than the window they were recorded under said.
pub fn penalize(state: Option<&Strikes>, e: &Escalation, now: i64) -> (BlockAnswer, Strikes) {
    let current = state.copied().unwrap_or_default();
    let strikes_end = current.forgotten_at.max(current.last_strike_at.saturating_add(e.window_ms));
    let remembered = current.strikes > 0 && now < strikes_end;
    let strikes = if remembered { current.strikes.saturating_add(1) } else { 1 };
    let own_end = now.saturating_add(e.window_ms).min(MAX_WAIT_MS);
    let forgotten_at = if remembered { current.forgotten_at.max(own_end) } else { own_end };
    let mut block = current.block_at(now);
    if strikes > e.free_strikes {
        let doublings = (strikes - e.free_strikes).min(62) as u32;
        let length = (e.base_ms as f64 * 2f64.powi(doublings as i32)).min(e.max_ms as f64) as i64;
        let until = now.saturating_add(length).min(MAX_WAIT_MS);
        block = match block {
            Some(Block::Indefinite) => Some(Block::Indefinite),
            Some(Block::Until(t)) => Some(Block::Until(t.max(until))),
            None => Some(Block::Until(until)),
        };
    }
    let new = Strikes { strikes, last_strike_at: now.max(current.last_strike_at), forgotten_at, block };
    (BlockAnswer { strikes, block, now }, new)
}

/// A block set directly, for `length_ms` or (None) until unblocked. Strikes are kept, and
/// a block in force is never shortened: the later end wins (until unblocked is the
/// latest), as with rl_penalize; only rl_unblock lifts a block.
pub fn block(state: Option<&Strikes>, length_ms: Option<i64>, now: i64) -> (BlockAnswer, Strikes) {
    let current = state.copied().unwrap_or_default();
    let requested = length_ms.map_or(Block::Indefinite, |l| Block::Until(now.saturating_add(l).min(MAX_WAIT_MS)));
    let block = Some(match (current.block_at(now), requested) {
        (Some(Block::Indefinite), _) | (_, Block::Indefinite) => Block::Indefinite,
        (Some(Block::Until(t)), Block::Until(u)) => Block::Until(t.max(u)),
        (None, until) => until,
    });
    let new = Strikes { block, ..current };
    (BlockAnswer { strikes: current.strikes, block, now }, new)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: Escalation = Escalation { free_strikes: 3, base_ms: 60_000, max_ms: 3_600_000, window_ms: 3_600_000 };

    /// The seed's formula: three free strikes, then 120 s, 240 s, ... capped at an hour.
    #[test]
    fn strikes_escalate_into_blocks() {
        let mut state = None;
        let mut lengths = Vec::new();
        for i in 0..10 {
            let now = i * 1000;
            let (answer, new) = penalize(state.as_ref(), &SEED, now);
            lengths.push(match answer.block {
                Some(Block::Until(t)) => (t - now) / 1000,
                _ => 0,
            });
            state = Some(new);
        }
        assert_eq!(lengths, [0, 0, 0, 120, 240, 480, 960, 1920, 3600, 3600]);
        let last = state.unwrap();
        assert_eq!(Strikes::decode(&last.encode()), Some(last));
        // a strike while blocked keeps the longer block
        let (answer, _) = penalize(Some(&last), &SEED, 10_000);
        assert_eq!((answer.strikes, answer.block), (11, Some(Block::Until(10_000 + 3_600_000))));
        // forgotten an hour after the last strike (when the last block ended too): the next is the first again
        let (answer, _) = penalize(Some(&last), &SEED, 9_000 + 3_600_000);
        assert_eq!((answer.strikes, answer.block), (1, None));
    }

    #[test]
    fn a_direct_block_and_its_answer() {
        let (answer, s) = block(None, None, 5);
        assert_eq!(answer.fields(), (0, true, None, None));
        assert_eq!(s.empty_at(), i64::MAX);
        let (answer, s) = block(None, Some(1_500), 5);
        assert_eq!(answer.fields(), (0, true, Some(2), Some(2)));
        assert_eq!(s.block_at(1_504), Some(Block::Until(1_505)));
        assert_eq!(s.block_at(1_505), None);
    }

    /// rl_block never shortens a block in force: a short block over a long one (or over one
    /// until unblocked) changes nothing; a longer one extends it; an ended one is replaced.
    #[test]
    fn a_block_in_force_is_never_shortened() {
        let (_, forever) = block(None, None, 0);
        let (answer, s) = block(Some(&forever), Some(1), 10);
        assert_eq!((answer.block, s.block), (Some(Block::Indefinite), Some(Block::Indefinite)));
        let (_, long) = block(None, Some(60_000), 0);
        let cases = [(1, 1_000, 60_000), (120_000, 1_000, 121_000), (1, 70_000, 70_001)];
        for (length, now, until) in cases {
            let (answer, s) = block(Some(&long), Some(length), now);
            assert_eq!(
                (answer.block, s.block),
                (Some(Block::Until(until)), Some(Block::Until(until))),
                "{length} at {now}"
            );
        }
        // a penalized block is kept too
        let mut state = None;
        for i in 0..4 {
            state = Some(penalize(state.as_ref(), &SEED, i).1);
        }
        let (answer, _) = block(state.as_ref(), Some(1), 10);
        assert_eq!(answer.block, Some(Block::Until(3 + 120_000)));
    }

    /// A call with a tiny window does not forget strikes recorded under a long one: called
    /// before every real strike, it still lets the strikes add up to a block.
    #[test]
    fn a_short_window_does_not_forget_earlier_strikes() {
        let tiny = Escalation { window_ms: 1, free_strikes: 1_000_000, ..SEED };
        let mut state = None;
        for i in 0..5 {
            let (answer, new) = penalize(state.as_ref(), &SEED, i * 2_000);
            if answer.block.is_some() {
                assert_eq!((i, answer.strikes), (2, 5), "every strike counted");
                return;
            }
            state = Some(penalize(Some(&new), &tiny, i * 2_000 + 1_000).1);
        }
        panic!("never blocked: strikes were forgotten on request");
    }
}
