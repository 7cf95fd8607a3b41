//! What every kind of limit rl_take_all and policies decide (a bucket, a budget, a window)
//! answers alike, as one trait each kind's limits implement in their own module: its cost's
//! unit, how a tier scales it, how a policy shows it, the row it is decided on, its answer
//! to a take and the wait that answer makes. [`each_kind!`] is the one place that lists the
//! kinds: `take_all`, policies and rendering reach a kind through it and this trait instead
//! of matching each kind by hand.

use std::fmt::Debug;

use crate::json::Json;

/// One kind of limit, as its limits (`BucketLimits`, `BudgetLimits`, `WindowLimits`).
pub trait LimitKind: Copy + Debug + PartialEq {
    /// What its row holds, as read (a bucket's and a budget's: None when there is no row; a
    /// window's entries: none when there is no row).
    type Row: Clone + Debug + PartialEq;
    /// Its answer to a take.
    type Answer: Clone + Debug + PartialEq;
    /// A cost in its unit: tokens (f64) for a bucket, millionths (i64) for the others.
    type Cost: Cost;

    /// Whether the limit times `m` is still a valid limit.
    fn scales_by(&self, m: f64) -> bool;
    /// The limit times `m` (a tier's multiplier, or an rl_take_all item's); lengths and
    /// periods never scale. Valid where [`LimitKind::scales_by`].
    fn scaled(&self, m: f64) -> Self;
    /// The limit as a policy stores and shows it: every field, numbers as given.
    fn definition(&self) -> Json;
    /// The one question: take `cost` now from the limit whose row holds `row`?
    fn take(&self, row: &Self::Row, cost: Self::Cost, now_ms: i64) -> Self::Answer;
    fn admitted(answer: &Self::Answer) -> bool;
    /// How long the answer makes the caller wait (0 when it admits).
    fn wait_ms(answer: &Self::Answer, now_ms: i64) -> i64;
}

/// A cost in a kind's unit.
pub trait Cost: Copy + Debug + PartialEq {
    /// Nothing taken (what a refused call shows for the limits that would admit).
    const NOTHING: Self;
    /// A cost of `units` (a policy check's).
    fn of_units(units: f64) -> Self;
    /// An rl_take_all item's `cost` (None: not given, one unit), checked by its unit's rule.
    fn read(cost: Option<&crate::args::Arg>) -> crate::error::Result<Self>;
}

/// Tokens (buckets).
impl Cost for f64 {
    const NOTHING: f64 = 0.0;
    fn of_units(units: f64) -> f64 {
        units
    }
    fn read(cost: Option<&crate::args::Arg>) -> crate::error::Result<f64> {
        cost.map_or(Ok(1.0), |c| crate::args::token_number("cost", c))
    }
}

/// Millionths of a unit (budgets and windows).
impl Cost for i64 {
    const NOTHING: i64 = 0;
    fn of_units(units: f64) -> i64 {
        (units * crate::units::MICROS_PER_UNIT as f64).round() as i64
    }
    fn read(cost: Option<&crate::args::Arg>) -> crate::error::Result<i64> {
        cost.map_or(Ok(crate::units::MICROS_PER_UNIT), |c| crate::args::amount_micros("cost", c))
    }
}

/// A scaled amount of millionths: rounded, at least one.
pub(crate) fn scaled_micros(micros: i64, m: f64) -> i64 {
    ((micros as f64) * m).round().max(1.0) as i64
}

/// Whether an amount of millionths times `m` is still a valid amount.
pub(crate) fn micros_scale_by(micros: i64, m: f64) -> bool {
    let scaled = (micros as f64 * m).round();
    (1.0..=crate::units::MAX_AMOUNT * crate::units::MICROS_PER_UNIT as f64).contains(&scaled)
}

/// `$value`, one of the enums with a variant per kind (`Bucket`, `Budget`, `Window`), with
/// `$e` applied to whichever variant it holds: `each_kind!(LimitShape, shape, l =>
/// l.definition())`. With `$from => $to`, the answer is wrapped in `$to`'s variant of the
/// same kind. A kind added to the core is added here, and to each enum it names.
#[macro_export]
macro_rules! each_kind {
    ($enum:ident, $value:expr, $x:pat => $e:expr) => {
        match $value {
            $enum::Bucket($x) => $e,
            $enum::Budget($x) => $e,
            $enum::Window($x) => $e,
        }
    };
    ($from:ident => $to:ident, $value:expr, $x:pat => $e:expr) => {
        match $value {
            $from::Bucket($x) => $to::Bucket($e),
            $from::Budget($x) => $to::Budget($e),
            $from::Window($x) => $to::Window($e),
        }
    };
}
