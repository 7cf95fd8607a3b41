//! How one SQL statement reaches the decision of the call in progress.
//!
//! A single-row call is one guarded UPDATE (`sql/statements/bucket_change.sql`): its WHERE clause
//! calls an internal SQL function with the row the engine is about to change, and its SET
//! clause calls others for the row to write. Those functions reach the call's decision
//! through a per-thread slot that holds it only while that statement runs:
//! [`with_decision`] fills the slot around the statement, [`decide_row`] is the WHERE
//! clause, [`decided_row`] the SET clause. Under concurrency PostgreSQL may re-check a
//! newer version of the row; the last row handed over is the one the statement wrote (or
//! left), and the caller reads the answer from it.
//!
//! The decision is an owned (`'static`) closure, so this needs no `unsafe`: only the
//! copies of the call's limits, cost and clock reading travel into the slot.

use std::cell::Cell;
use std::rc::Rc;
use std::thread::LocalKey;

use crate::bucket::BucketState;
use crate::budget::BudgetState;

/// The decision of a call on one row: given the stored row, the row to write, or None to
/// write nothing. Pure: deciding twice on the same row gives the same answer.
pub type Decide<T> = Rc<dyn Fn(&T) -> Option<T>>;

pub struct Slot<T: 'static> {
    decide: Cell<Option<Decide<T>>>,
    /// The last row handed to [`decide_row`] during the statement.
    seen: Cell<Option<T>>,
    /// What the last decision wants written, for the SET clause.
    new_row: Cell<Option<T>>,
}

impl<T: 'static> Slot<T> {
    const fn new() -> Self {
        Slot { decide: Cell::new(None), seen: Cell::new(None), new_row: Cell::new(None) }
    }
}

thread_local! {
    pub static BUCKET: Slot<BucketState> = const { Slot::new() };
    pub static BUDGET: Slot<BudgetState> = const { Slot::new() };
}

/// An internal function was called outside the statement that sets it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotInStatement;

impl std::fmt::Display for NotInStatement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("internal function of the rate limiter, callable only from its own statements")
    }
}

/// Runs `statement` (the engine's guarded UPDATE) with `decide` reachable by
/// [`decide_row`]. Returns the statement's result and the last row it decided on (None
/// when the statement found no row). The slot is emptied again when `statement` returns
/// or unwinds.
pub fn with_decision<T: Copy + 'static, R>(
    slot: &'static LocalKey<Slot<T>>,
    decide: Decide<T>,
    statement: impl FnOnce() -> R,
) -> (R, Option<T>) {
    struct Restore<T: 'static>(&'static LocalKey<Slot<T>>, Option<Decide<T>>);
    impl<T: 'static> Drop for Restore<T> {
        fn drop(&mut self) {
            self.0.with(|s| {
                s.decide.set(self.1.take());
                s.new_row.set(None);
            });
        }
    }
    let previous = slot.with(|s| {
        s.seen.set(None);
        s.decide.replace(Some(decide))
    });
    let restore = Restore(slot, previous);
    let result = statement();
    let seen = slot.with(|s| s.seen.take());
    drop(restore);
    (result, seen)
}

/// The WHERE clause of a guarded UPDATE: decides on `row` and records the row to write.
/// Returns whether the statement writes.
pub fn decide_row<T: Copy + 'static>(slot: &'static LocalKey<Slot<T>>, row: &T) -> Result<bool, NotInStatement> {
    slot.with(|s| {
        // Taken out while it runs, so a stray call from inside the decision finds nothing.
        let decide = s.decide.take().ok_or(NotInStatement)?;
        let new_row = decide(row);
        s.decide.set(Some(decide));
        s.seen.set(Some(*row));
        s.new_row.set(new_row);
        Ok(new_row.is_some())
    })
}

/// The SET clause of a guarded UPDATE: the row the last [`decide_row`] call decided to write.
pub fn decided_row<T: Copy + 'static>(slot: &'static LocalKey<Slot<T>>) -> Result<T, NotInStatement> {
    slot.with(|s| s.new_row.get()).ok_or(NotInStatement)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(level: f64) -> BucketState {
        BucketState { level, refilled_at: 1, full_at: 2 }
    }

    fn take_one() -> Decide<BucketState> {
        Rc::new(|r: &BucketState| (r.level >= 1.0).then(|| row(r.level - 1.0)))
    }

    #[test]
    fn the_decision_is_reachable_only_inside_its_statement() {
        assert_eq!(decide_row(&BUCKET, &row(1.0)), Err(NotInStatement));
        let (wrote, seen) = with_decision(&BUCKET, take_one(), || {
            assert_eq!(decide_row(&BUCKET, &row(0.5)), Ok(false));
            assert_eq!(decided_row(&BUCKET), Err(NotInStatement));
            // A re-check on a newer row version replaces the decision.
            assert_eq!(decide_row(&BUCKET, &row(3.0)), Ok(true));
            decided_row(&BUCKET)
        });
        assert_eq!(wrote, Ok(row(2.0)));
        assert_eq!(seen, Some(row(3.0)), "the last row decided on");
        assert_eq!(decide_row(&BUCKET, &row(1.0)), Err(NotInStatement));
        assert_eq!(decided_row(&BUCKET), Err(NotInStatement));
    }

    #[test]
    fn a_statement_that_finds_no_row_decided_on_none() {
        let ((), seen) = with_decision(&BUCKET, take_one(), || ());
        assert_eq!(seen, None);
    }

    #[test]
    fn the_slot_is_emptied_when_the_statement_unwinds() {
        let unwound = std::panic::catch_unwind(|| {
            with_decision(&BUCKET, take_one(), || {
                decide_row(&BUCKET, &row(1.0)).unwrap();
                panic!("the engine raised an error mid-statement");
            })
        });
        assert!(unwound.is_err());
        assert_eq!(decide_row(&BUCKET, &row(1.0)), Err(NotInStatement));
        assert_eq!(decided_row(&BUCKET), Err(NotInStatement));
    }
}
