//! rl_take_all: several buckets, budgets and sliding windows decided together, all or
//! nothing. Pure: the limits arrive parsed ([`crate::call_args::TakeAllArgs`]), the rows
//! arrive read.

use crate::bucket::{self, BucketLimits, BucketState, TakeDecision};
use crate::budget::{self, BudgetState, SpendDecision};
use crate::units::Period;
use crate::window::{self, WindowDecision, WindowLimits};

/// Most items one call may hold.
pub const MAX_ITEMS: usize = 64;

#[derive(Debug, Clone, PartialEq)]
pub struct BucketItem<'a> {
    /// Where the item stands in the caller's list (0-based): answers keep that order.
    pub position: usize,
    pub key: &'a str,
    pub limits: BucketLimits,
    pub cost: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BudgetItem<'a> {
    pub position: usize,
    pub key: &'a str,
    pub period: Period,
    pub quota: i64,
    pub cost: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct WindowItem<'a> {
    pub position: usize,
    pub key: &'a str,
    pub limits: WindowLimits,
    /// Millionths.
    pub cost: i64,
}

/// One limit of a call.
#[derive(Debug, Clone, PartialEq)]
pub enum Limit<'a> {
    Bucket(BucketItem<'a>),
    Budget(BudgetItem<'a>),
    Window(WindowItem<'a>),
}

impl<'a> Limit<'a> {
    pub fn position(&self) -> usize {
        match self {
            Limit::Bucket(b) => b.position,
            Limit::Budget(b) => b.position,
            Limit::Window(w) => w.position,
        }
    }

    /// Which state row the limit touches. Limits are kept in this order (buckets, then
    /// budgets, then sliding windows, then fixed windows, each by key and period; the
    /// number is the kind's place in [`crate::limit_json::Kind::ALL`]) and rows locked in
    /// it, budgets first, then windows, then buckets, the same for every call, so that
    /// concurrent calls never wait in a cycle; two limits on one row are one limit given
    /// twice.
    pub fn row(&self) -> (u8, &'a str, Option<Period>) {
        match self {
            Limit::Bucket(b) => (0, b.key, None),
            Limit::Budget(b) => (1, b.key, Some(b.period)),
            Limit::Window(w) => (if w.limits.fixed { 3 } else { 2 }, w.key, None),
        }
    }
}

/// A limit with the row it is decided on (None: no row, a full bucket or an unused budget).
#[derive(Debug, Clone, PartialEq)]
pub enum ItemRow<'i, 'a> {
    Bucket(&'i BucketItem<'a>, Option<BucketState>),
    Budget(&'i BudgetItem<'a>, Option<BudgetState>),
    /// The window's entries, decoded (none when there is no row).
    Window(&'i WindowItem<'a>, Vec<window::Entry>),
}

/// A limit, the row it was decided on, and what that limit alone answers.
#[derive(Debug, Clone, PartialEq)]
pub enum ItemAnswer<'i, 'a> {
    Bucket { item: &'i BucketItem<'a>, row: Option<BucketState>, answer: TakeDecision },
    Budget { item: &'i BudgetItem<'a>, row: Option<BudgetState>, answer: SpendDecision },
    Window { item: &'i WindowItem<'a>, entries: Vec<window::Entry>, answer: WindowDecision },
}

impl ItemAnswer<'_, '_> {
    pub fn admitted(&self) -> bool {
        match self {
            ItemAnswer::Bucket { answer, .. } => answer.admitted,
            ItemAnswer::Budget { answer, .. } => answer.admitted,
            ItemAnswer::Window { answer, .. } => answer.admitted,
        }
    }

    pub fn position(&self) -> usize {
        match self {
            ItemAnswer::Bucket { item, .. } => item.position,
            ItemAnswer::Budget { item, .. } => item.position,
            ItemAnswer::Window { item, .. } => item.position,
        }
    }

    /// In a refused call nothing is charged: a limit that alone would admit reports what
    /// it has left now (its answer to a cost of 0), still admitting.
    fn charged_nothing(self, now_ms: i64) -> Self {
        if !self.admitted() {
            return self;
        }
        match self {
            ItemAnswer::Bucket { item, row, .. } => {
                ItemAnswer::Bucket { item, row, answer: bucket::take(row.as_ref(), &item.limits, 0.0, now_ms) }
            }
            ItemAnswer::Budget { item, row, .. } => {
                let answer = budget::spend(row.as_ref(), item.period, item.quota, 0, now_ms);
                ItemAnswer::Budget { item, row, answer }
            }
            ItemAnswer::Window { item, entries, .. } => {
                let answer = window::take(&entries, &item.limits, 0, now_ms);
                ItemAnswer::Window { item, entries, answer }
            }
        }
    }

    /// How long this limit alone makes the caller wait (0 when it admits).
    fn wait_ms(&self, now_ms: i64) -> i64 {
        match self {
            ItemAnswer::Bucket { answer, .. } => answer.retry_after_ms,
            ItemAnswer::Window { answer, .. } => answer.retry_after_ms,
            ItemAnswer::Budget { answer, .. } if !answer.admitted => answer.resets_at_ms - now_ms,
            ItemAnswer::Budget { .. } => 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TakeAllDecision<'i, 'a> {
    pub admitted: bool,
    pub retry_after_ms: i64,
    /// Per item, in the order rows were read: what that limit alone answers.
    pub items: Vec<ItemAnswer<'i, 'a>>,
}

/// What one limit answers, apart from the item and the row it was decided on.
#[derive(Debug, Clone, PartialEq)]
pub enum LimitAnswer {
    Bucket(TakeDecision),
    Budget(SpendDecision),
    Window(WindowDecision),
}

/// A [`TakeAllDecision`] as the caller is answered: owned (free of the items and keys a
/// flow made), the limits in the order given.
#[derive(Debug, Clone, PartialEq)]
pub struct TakeAllAnswer {
    pub admitted: bool,
    pub retry_after_ms: i64,
    pub items: Vec<LimitAnswer>,
}

impl TakeAllDecision<'_, '_> {
    /// Each item's answer in the order the caller gave the limits.
    pub fn answers_in_given_order(&self) -> impl Iterator<Item = LimitAnswer> + '_ {
        let mut in_given_order: Vec<&ItemAnswer> = self.items.iter().collect();
        in_given_order.sort_by_key(|i| i.position());
        in_given_order.into_iter().map(|i| match i {
            ItemAnswer::Bucket { answer, .. } => LimitAnswer::Bucket(answer.clone()),
            ItemAnswer::Budget { answer, .. } => LimitAnswer::Budget(answer.clone()),
            ItemAnswer::Window { answer, .. } => LimitAnswer::Window(answer.clone()),
        })
    }

    pub fn answer(&self) -> TakeAllAnswer {
        TakeAllAnswer {
            admitted: self.admitted,
            retry_after_ms: self.retry_after_ms,
            items: self.answers_in_given_order().collect(),
        }
    }
}

/// Decides every item from its row. Admitted only if every item admits; otherwise nothing
/// is to be written, the items that refuse say so (with their waits) and the others show
/// what they have left now.
pub fn decide<'i, 'a>(rows: Vec<ItemRow<'i, 'a>>, now_ms: i64) -> TakeAllDecision<'i, 'a> {
    let items: Vec<ItemAnswer> = rows
        .into_iter()
        .map(|r| match r {
            ItemRow::Bucket(item, row) => {
                let answer = bucket::take(row.as_ref(), &item.limits, item.cost, now_ms);
                ItemAnswer::Bucket { item, row, answer }
            }
            ItemRow::Budget(item, row) => {
                let answer = budget::spend(row.as_ref(), item.period, item.quota, item.cost, now_ms);
                ItemAnswer::Budget { item, row, answer }
            }
            ItemRow::Window(item, entries) => {
                let answer = window::take(&entries, &item.limits, item.cost, now_ms);
                ItemAnswer::Window { item, entries, answer }
            }
        })
        .collect();
    let admitted = items.iter().all(ItemAnswer::admitted);
    let retry_after_ms = if admitted { 0 } else { items.iter().map(|i| i.wait_ms(now_ms)).max().unwrap_or(0) };
    let items = if admitted { items } else { items.into_iter().map(|i| i.charged_nothing(now_ms)).collect() };
    TakeAllDecision { admitted, retry_after_ms, items }
}
