//! rl_take_all: several limits of any kinds decided together, all or nothing, each through
//! its kind ([`crate::kind::LimitKind`]). Pure: the limits arrive parsed ([`crate::call_args::TakeAllArgs`]), the rows
//! arrive read.

use crate::bucket::BucketLimits;
use crate::budget::BudgetLimits;
use crate::kind::{Cost, LimitKind};
use crate::units::Period;
use crate::window::WindowLimits;

/// Most items one call may hold.
pub const MAX_ITEMS: usize = 64;

/// One limit of a call: where it stands in the caller's list (0-based: answers keep that
/// order), its key, its limits and its cost in the kind's unit.
#[derive(Debug, Clone, PartialEq)]
pub struct Item<'a, K: LimitKind> {
    pub position: usize,
    pub key: &'a str,
    pub limits: K,
    pub cost: K::Cost,
}

impl<'a, K: LimitKind> Item<'a, K> {
    /// The item of a policy's limit, charged `units` (a check's cost).
    pub fn new(position: usize, key: &'a str, limits: K, units: f64) -> Self {
        Item { position, key, limits, cost: Cost::of_units(units) }
    }
}

pub type BucketItem<'a> = Item<'a, BucketLimits>;
pub type BudgetItem<'a> = Item<'a, BudgetLimits>;
pub type WindowItem<'a> = Item<'a, WindowLimits>;

/// One limit of a call, of any kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Limit<'a> {
    Bucket(BucketItem<'a>),
    Budget(BudgetItem<'a>),
    Window(WindowItem<'a>),
}

impl<'a> Limit<'a> {
    pub fn position(&self) -> usize {
        crate::each_kind!(Limit, self, i => i.position)
    }

    /// The bucket, where the limit is one (buckets are held and decided in one batch).
    pub fn as_bucket(&self) -> Option<&BucketItem<'a>> {
        if let Limit::Bucket(b) = self {
            Some(b)
        } else {
            None
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
            Limit::Budget(b) => (1, b.key, Some(b.limits.period)),
            Limit::Window(w) => (if w.limits.fixed { 3 } else { 2 }, w.key, None),
        }
    }
}

/// A limit with the row it is to be decided on.
#[derive(Debug, Clone, PartialEq)]
pub struct Read<'i, 'a, K: LimitKind> {
    pub item: &'i Item<'a, K>,
    pub row: K::Row,
}

/// A limit with its row, of any kind.
#[derive(Debug, Clone, PartialEq)]
pub enum ItemRow<'i, 'a> {
    Bucket(Read<'i, 'a, BucketLimits>),
    Budget(Read<'i, 'a, BudgetLimits>),
    Window(Read<'i, 'a, WindowLimits>),
}

impl<'i, 'a, K: LimitKind> Read<'i, 'a, K> {
    pub fn new(item: &'i Item<'a, K>, row: K::Row) -> Self {
        Read { item, row }
    }
}

/// A limit, the row it was decided on, and what that limit alone answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided<'i, 'a, K: LimitKind> {
    pub item: &'i Item<'a, K>,
    pub row: K::Row,
    pub answer: K::Answer,
}

impl<'i, 'a, K: LimitKind> Decided<'i, 'a, K> {
    fn of(read: Read<'i, 'a, K>, now_ms: i64) -> Self {
        let answer = read.item.limits.take(&read.row, read.item.cost, now_ms);
        Decided { item: read.item, row: read.row, answer }
    }

    pub fn admitted(&self) -> bool {
        K::admitted(&self.answer)
    }

    /// In a refused call nothing is charged: a limit that alone would admit reports what
    /// it has left now (its answer to a cost of nothing), still admitting.
    fn charged_nothing(self, now_ms: i64) -> Self {
        if !self.admitted() {
            return self;
        }
        let answer = self.item.limits.take(&self.row, Cost::NOTHING, now_ms);
        Decided { answer, ..self }
    }

    /// How long this limit alone makes the caller wait (0 when it admits).
    fn wait_ms(&self, now_ms: i64) -> i64 {
        K::wait_ms(&self.answer, now_ms)
    }
}

/// A decided limit, of any kind.
#[derive(Debug, Clone, PartialEq)]
pub enum ItemAnswer<'i, 'a> {
    Bucket(Decided<'i, 'a, BucketLimits>),
    Budget(Decided<'i, 'a, BudgetLimits>),
    Window(Decided<'i, 'a, WindowLimits>),
}

impl ItemAnswer<'_, '_> {
    pub fn admitted(&self) -> bool {
        crate::each_kind!(ItemAnswer, self, d => d.admitted())
    }

    pub fn position(&self) -> usize {
        crate::each_kind!(ItemAnswer, self, d => d.item.position)
    }

    fn charged_nothing(self, now_ms: i64) -> Self {
        crate::each_kind!(ItemAnswer => ItemAnswer, self, d => d.charged_nothing(now_ms))
    }

    fn wait_ms(&self, now_ms: i64) -> i64 {
        crate::each_kind!(ItemAnswer, self, d => d.wait_ms(now_ms))
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
    Bucket(<BucketLimits as LimitKind>::Answer),
    Budget(<BudgetLimits as LimitKind>::Answer),
    Window(<WindowLimits as LimitKind>::Answer),
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
        in_given_order.into_iter().map(|i| crate::each_kind!(ItemAnswer => LimitAnswer, i, d => d.answer.clone()))
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
        .map(|r| crate::each_kind!(ItemRow => ItemAnswer, r, read => Decided::of(read, now_ms)))
        .collect();
    let admitted = items.iter().all(ItemAnswer::admitted);
    let retry_after_ms = if admitted { 0 } else { items.iter().map(|i| i.wait_ms(now_ms)).max().unwrap_or(0) };
    let items = if admitted { items } else { items.into_iter().map(|i| i.charged_nothing(now_ms)).collect() };
    TakeAllDecision { admitted, retry_after_ms, items }
}
