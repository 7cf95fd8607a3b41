//! The bridge for a guarded write: the engine runs one UPDATE whose WHERE clause calls
//! back into the core's decision with the row it is about to change, and whose SET clause
//! stores the row that decision wants. One statement per call, and the engine's own row
//! handling makes it atomic (PostgreSQL re-evaluates the WHERE clause on the newest
//! version of a row a concurrent call just changed; SQLite holds its write lock).
//!
//! The engines' SQL-callable guard functions reach the decision of the statement in
//! progress through a per-thread slot that holds it only while that statement runs.

use std::cell::Cell;
use std::thread::LocalKey;

use crate::bucket::BucketState;
use crate::budget::BudgetState;

/// The decision of a call: given the stored row, the row to write, or None to write nothing.
pub type Change<'a, T> = dyn FnMut(&T) -> Option<T> + 'a;

pub struct Slot<T: 'static> {
    change: Cell<Option<*mut Change<'static, T>>>,
    new_row: Cell<Option<T>>,
}

impl<T: 'static> Slot<T> {
    const fn new() -> Self {
        Slot { change: Cell::new(None), new_row: Cell::new(None) }
    }
}

thread_local! {
    pub static BUCKET: Slot<BucketState> = const { Slot::new() };
    pub static BUDGET: Slot<BudgetState> = const { Slot::new() };
}

/// A guard function was called outside the statement that sets it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotInStatement;

impl std::fmt::Display for NotInStatement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("internal function of the rate limiter, callable only from its own statements")
    }
}

/// Runs `statement` (the engine's guarded UPDATE) with `change` reachable by [`guard`].
/// The slot is emptied again when `statement` returns or unwinds.
pub fn with_change<T: Copy + 'static, R>(
    slot: &'static LocalKey<Slot<T>>,
    change: &mut Change<'_, T>,
    statement: impl FnOnce() -> R,
) -> R {
    struct Restore<T: 'static>(&'static LocalKey<Slot<T>>, Option<*mut Change<'static, T>>);
    impl<T: 'static> Drop for Restore<T> {
        fn drop(&mut self) {
            self.0.with(|s| {
                s.change.set(self.1);
                s.new_row.set(None);
            });
        }
    }
    let erased: *mut Change<'_, T> = change;
    // SAFETY: only the lifetime is erased; the pointer leaves the slot (Restore) before
    // `change` goes out of scope, and `guard` is the only user of it meanwhile.
    let erased: *mut Change<'static, T> = unsafe { std::mem::transmute(erased) };
    let previous = slot.with(|s| s.change.replace(Some(erased)));
    let _restore = Restore(slot, previous);
    statement()
}

/// The WHERE clause of a guarded UPDATE: decides on `row` and records the row to write.
/// Returns whether the statement writes. Under concurrency the engine may call it again
/// with a newer version of the row; the last call is the one that counts.
pub fn guard<T: Copy + 'static>(slot: &'static LocalKey<Slot<T>>, row: &T) -> Result<bool, NotInStatement> {
    slot.with(|s| {
        // Taken out while it runs, so a stray call from inside the decision cannot alias it.
        let change = s.change.take().ok_or(NotInStatement)?;
        // SAFETY: set by `with_change`, whose caller keeps the closure alive meanwhile.
        let new_row = unsafe { (*change)(row) };
        s.change.set(Some(change));
        s.new_row.set(new_row);
        Ok(new_row.is_some())
    })
}

/// The SET clause of a guarded UPDATE: the row the last [`guard`] call decided to write.
pub fn new_row<T: Copy + 'static>(slot: &'static LocalKey<Slot<T>>) -> Result<T, NotInStatement> {
    slot.with(|s| s.new_row.get()).ok_or(NotInStatement)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(level: f64) -> BucketState {
        BucketState { level, refilled_at: 1, full_at: 2 }
    }

    #[test]
    fn guard_reaches_the_change_only_inside_its_statement() {
        assert_eq!(guard(&BUCKET, &row(1.0)), Err(NotInStatement));
        let mut calls = 0;
        let mut change = |r: &BucketState| {
            calls += 1;
            (r.level >= 1.0).then(|| row(r.level - 1.0))
        };
        let wrote = with_change(&BUCKET, &mut change, || {
            assert_eq!(guard(&BUCKET, &row(0.5)), Ok(false));
            assert_eq!(new_row(&BUCKET), Err(NotInStatement));
            // A retry on a newer row version replaces the decision.
            assert_eq!(guard(&BUCKET, &row(3.0)), Ok(true));
            new_row(&BUCKET)
        });
        assert_eq!(wrote, Ok(row(2.0)));
        assert_eq!(calls, 2);
        assert_eq!(guard(&BUCKET, &row(1.0)), Err(NotInStatement));
        assert_eq!(new_row(&BUCKET), Err(NotInStatement));
    }

    #[test]
    fn the_slot_is_emptied_when_the_statement_unwinds() {
        let mut change = |_: &BucketState| Some(row(0.0));
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_change(&BUCKET, &mut change, || {
                guard(&BUCKET, &row(1.0)).unwrap();
                panic!("the engine raised an error mid-statement");
            })
        }));
        assert!(unwound.is_err());
        assert_eq!(guard(&BUCKET, &row(1.0)), Err(NotInStatement));
        assert_eq!(new_row(&BUCKET), Err(NotInStatement));
    }
}
