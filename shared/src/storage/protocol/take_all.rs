//! rl_take_all: several limits, all or nothing.

use super::rows::{change_entries, empty_row, window_entries, window_kind, window_row};
use super::*;
use crate::bucket::BucketLimits;
use crate::budget::BudgetLimits;
use crate::kind::LimitKind;
use crate::take_all::{BucketItem, Item, LimitAnswer, TakeAllAnswer};
use crate::window::WindowLimits;

/// rl_refund_all: the inverse of rl_take_all, each limit given its cost back in one unit.
pub fn refund_all<S: Store>(store: &mut S, a: &TakeAllArgs) -> Result<RefundAllDecision> {
    Ok(RefundAllDecision { items: refund_limits(store, &a.limits, a.now_ms)? })
}

/// Gives each limit its cost back, all in one unit: a bucket its tokens, never above its
/// burst (rl_refund); a budget its amount, never below 0 (rl_refund_budget); a window, which
/// cannot tell one admission from another, by forgetting its newest admissions that still
/// count, up to the cost (then answered as rl_window_peek). Rows are changed in the order
/// rl_take_all holds them (budgets, windows, buckets, each by key), so a refund and a take
/// never wait for each other in a cycle; the answers keep the limits' own order.
pub(super) fn refund_limits<S: Store>(store: &mut S, limits: &[Limit], now_ms: i64) -> Result<Vec<LimitRefund>> {
    writable_for(store, limits)?;
    let mut held_order: Vec<&Limit> = limits.iter().collect();
    held_order.sort_by_key(|l| (hold_rank(l), l.row()));
    let mut answers = in_one_unit(store, |store| {
        held_order.iter().map(|l| Ok((l.position(), refund_limit(store, l, now_ms)?))).collect::<Result<Vec<_>>>()
    })?;
    answers.sort_by_key(|(position, _)| *position);
    Ok(answers.into_iter().map(|(_, answer)| answer).collect())
}

/// rl_charge_all: every limit charged its cost whatever it holds (a cost known after the
/// work), in one unit: a bucket into debt (rl_charge), a budget past its quota
/// (rl_charge_budget, keeping the item's quota with the row as a spend does), a window past
/// its limit. Each answers as an admitted take, `remaining` below 0 where it went past.
/// A debt deeper than [`crate::units::MAX_TOKENS`], a period past
/// [`budget::MAX_USED`] or a window past [`window::MAX_ENTRIES`] is a range error and
/// charges nothing.
pub fn charge_all<S: Store>(store: &mut S, a: &TakeAllArgs) -> Result<TakeAllAnswer> {
    Ok(TakeAllAnswer { admitted: true, retry_after_ms: 0, items: charge_limits(store, &a.limits, a.now_ms)? })
}

/// Charges each limit, in rl_take_all's lock order, answering in the limits' own order.
pub(super) fn charge_limits<S: Store>(store: &mut S, limits: &[Limit], now_ms: i64) -> Result<Vec<LimitAnswer>> {
    writable_for(store, limits)?;
    let mut held_order: Vec<&Limit> = limits.iter().collect();
    held_order.sort_by_key(|l| (hold_rank(l), l.row()));
    let mut answers = in_one_unit(store, |store| {
        held_order.iter().map(|l| Ok((l.position(), charge_limit(store, l, now_ms)?))).collect::<Result<Vec<_>>>()
    })?;
    answers.sort_by_key(|(position, _)| *position);
    Ok(answers.into_iter().map(|(_, answer)| answer).collect())
}

/// A budget charge against a known quota, as a row decision (None: past the most a period
/// may count, nothing written).
struct ChargeAgainst(Option<SpendDecision>);

impl RowDecision<BudgetState> for ChargeAgainst {
    fn new_row(&self) -> Option<BudgetState> {
        self.0.as_ref().and_then(|d| d.new_state)
    }
}

fn charge_limit<S: Store>(store: &mut S, limit: &Limit, now_ms: i64) -> Result<LimitAnswer> {
    Ok(crate::each_kind!(Limit => LimitAnswer, limit, item => StoredKind::charge_item(store, item, now_ms)?))
}

/// Where a limit's row comes in the order rl_take_all holds rows.
fn hold_rank(limit: &Limit) -> u8 {
    fn rank<K: StoredKind>(_: &Item<K>) -> u8 {
        K::HOLD_RANK
    }
    crate::each_kind!(Limit, limit, item => rank(item))
}

fn refund_limit<S: Store>(store: &mut S, limit: &Limit, now_ms: i64) -> Result<LimitRefund> {
    Ok(crate::each_kind!(Limit => LimitRefund, limit, item => StoredKind::refund_item(store, item, now_ms)?))
}

/// What rl_take_all (its unlocked read, its hold and its write), rl_charge_all and
/// rl_refund_all do with one kind's row, written once per kind.
pub(super) trait StoredKind: LimitKind {
    /// What giving a cost back answers.
    type Refund;
    /// The table its rows live in (whether a read-only store can take it).
    const ROWS: Rows;
    /// Where its rows come in the order rows are held (budgets, windows, buckets), so that
    /// concurrent calls never wait for each other in a cycle.
    const HOLD_RANK: u8;
    /// Its row as it stands, read without holding it.
    fn read_item<S: Store>(store: &mut S, item: &Item<Self>) -> Result<Self::Row>;
    /// Charges the item's cost whatever the row holds, answered as an admitted take.
    fn charge_item<S: Store>(store: &mut S, item: &Item<Self>, now_ms: i64) -> Result<Self::Answer>;
    /// Gives the item's cost back.
    fn refund_item<S: Store>(store: &mut S, item: &Item<Self>, now_ms: i64) -> Result<Self::Refund>;

    /// What holding its row in rl_take_all's unit keeps for the write.
    type Held;
    /// Holds the item's row until the unit ends (a bucket's is held later, with every
    /// bucket of the call, by the store's one batch: [`BucketRows::decide_buckets`]).
    fn hold_item<S: Store>(store: &mut S, item: &Item<Self>, now_ms: i64) -> Result<Self::Held>;
    /// The held row as the kind decides on it; a bucket's is the batch's next row.
    fn held_row(held: &Self::Held, batch: &mut dyn Iterator<Item = Option<BucketState>>) -> Self::Row;
    /// Its decision among an rl_take_all's decided items (None: another kind's).
    fn decided<'d, 'i, 'a>(answer: &'d ItemAnswer<'i, 'a>) -> Option<&'d all_or_none::Decided<'i, 'a, Self>>;
    /// What the store's batch writes for it when the call admits (Some: a bucket's new
    /// row, if any; None: not a bucket).
    fn batch_write(_decided: &all_or_none::Decided<Self>) -> Option<Option<BucketState>> {
        None
    }
    /// Writes what an admitted rl_take_all decided into the held row; false when the row
    /// changed while held. A bucket's was written by the batch.
    fn write_item<S: Store>(store: &mut S, decided: &all_or_none::Decided<Self>, held: &Self::Held) -> Result<bool>;
}

/// A bucket: tokens into debt (rl_charge), back up to the burst (rl_refund).
impl StoredKind for BucketLimits {
    type Refund = RefundDecision;
    const ROWS: Rows = Rows::Buckets;
    const HOLD_RANK: u8 = 2;

    fn read_item<S: Store>(store: &mut S, item: &Item<Self>) -> Result<Option<BucketState>> {
        Ok(store.read_bucket(item.key)?)
    }

    fn charge_item<S: Store>(store: &mut S, b: &Item<Self>, now_ms: i64) -> Result<TakeDecision> {
        charge(store, &TakeArgs { key: b.key, limits: b.limits, cost: b.cost, now_ms })
    }

    fn refund_item<S: Store>(store: &mut S, b: &Item<Self>, now_ms: i64) -> Result<RefundDecision> {
        refund(store, &TakeArgs { key: b.key, limits: b.limits, cost: b.cost, now_ms })
    }

    type Held = ();

    fn hold_item<S: Store>(_: &mut S, _: &Item<Self>, _: i64) -> Result<()> {
        Ok(())
    }

    fn held_row(_: &(), batch: &mut dyn Iterator<Item = Option<BucketState>>) -> Option<BucketState> {
        batch.next().flatten()
    }

    fn decided<'d, 'i, 'a>(answer: &'d ItemAnswer<'i, 'a>) -> Option<&'d all_or_none::Decided<'i, 'a, Self>> {
        if let ItemAnswer::Bucket(d) = answer {
            Some(d)
        } else {
            None
        }
    }

    fn batch_write(d: &all_or_none::Decided<Self>) -> Option<Option<BucketState>> {
        Some(d.answer.new_state)
    }

    fn write_item<S: Store>(_: &mut S, _: &all_or_none::Decided<Self>, _: &()) -> Result<bool> {
        Ok(true)
    }
}

/// A budget: past its quota, keeping the item's quota with the row as a spend does
/// (rl_charge_budget's rule); back never below 0 (rl_refund_budget).
impl StoredKind for BudgetLimits {
    type Refund = BudgetRefund;
    const ROWS: Rows = Rows::Budgets;
    const HOLD_RANK: u8 = 0;

    fn read_item<S: Store>(store: &mut S, item: &Item<Self>) -> Result<Option<BudgetState>> {
        Ok(store.read_row(budget_at(item))?)
    }

    fn charge_item<S: Store>(store: &mut S, b: &Item<Self>, now_ms: i64) -> Result<SpendDecision> {
        let (period, quota, amount) = (b.limits.period, b.limits.quota, b.cost);
        let d = change_budget(store, b.key, period, move |row| {
            ChargeAgainst(budget::charge_against(row, period, quota, amount, now_ms))
        })?;
        d.0.ok_or_else(|| Error::out_of_range(crate::messages::USE_TOO_HIGH.render(&[&(budget::MAX_USED / 1_000_000)])))
    }

    fn refund_item<S: Store>(store: &mut S, b: &Item<Self>, now_ms: i64) -> Result<BudgetRefund> {
        refund_budget(store, &RefundBudgetArgs { key: b.key, period: b.limits.period, amount: b.cost, now_ms })
    }

    /// The row as held (None: none yet).
    type Held = Option<BudgetState>;

    fn hold_item<S: Store>(store: &mut S, b: &Item<Self>, now_ms: i64) -> Result<Option<BudgetState>> {
        hold_in_unit(store, budget_at(b), || budget::untouched(b.limits.period, now_ms), true)
    }

    fn held_row(held: &Option<BudgetState>, _: &mut dyn Iterator<Item = Option<BucketState>>) -> Option<BudgetState> {
        *held
    }

    fn decided<'d, 'i, 'a>(answer: &'d ItemAnswer<'i, 'a>) -> Option<&'d all_or_none::Decided<'i, 'a, Self>> {
        if let ItemAnswer::Budget(d) = answer {
            Some(d)
        } else {
            None
        }
    }

    /// The new row, and the period it ended kept when the spend started a new one.
    fn write_item<S: Store>(store: &mut S, d: &all_or_none::Decided<Self>, _: &Option<BudgetState>) -> Result<bool> {
        let written = write_held(store, budget_at(d.item), d.row.as_ref(), d.answer.new_state.as_ref())?;
        if let (true, Some(old)) = (written, d.row.as_ref()) {
            keep_ended(store, d.item.key, d.item.limits.period, old, d.answer.new_state.as_ref())?;
        }
        Ok(written)
    }
}

/// A window, sliding or fixed: past its limit; back by forgetting its newest admissions
/// that still count (it cannot tell one from another), answered as rl_window_peek.
impl StoredKind for WindowLimits {
    type Refund = WindowDecision;
    const ROWS: Rows = Rows::Entries;
    const HOLD_RANK: u8 = 1;

    fn read_item<S: Store>(store: &mut S, item: &Item<Self>) -> Result<Vec<window::Entry>> {
        let row = store.read_row(window_at(item))?;
        window_entries(row.as_ref())
    }

    fn charge_item<S: Store>(store: &mut S, w: &Item<Self>, now_ms: i64) -> Result<WindowDecision> {
        change_entries(store, window_kind(&w.limits), w.key, |row| {
            let d = window::charge(&window_entries(row)?, &w.limits, w.cost, now_ms);
            let new = window_row(&d, w.limits.window_ms)?;
            Ok((d, new))
        })
    }

    fn refund_item<S: Store>(store: &mut S, w: &Item<Self>, now_ms: i64) -> Result<WindowDecision> {
        change_entries(store, window_kind(&w.limits), w.key, |row| {
            let given_back = window::refund(&window_entries(row)?, w.cost);
            // a peek (cost 0) answers the window as the refund left it, and keeps only the
            // entries that still count
            let d = window::take(&given_back, &w.limits, 0, now_ms);
            // a window with no row and nothing left to count stays without one
            let unchanged = row.is_none() && d.new_entries.as_ref().is_none_or(|e| e.is_empty());
            let new = if unchanged { None } else { window_row(&d, w.limits.window_ms)? };
            Ok((d, new))
        })
    }

    /// The row as stored (None: none yet), and its entries.
    type Held = (Option<EntriesRow>, Vec<window::Entry>);

    fn hold_item<S: Store>(store: &mut S, w: &Item<Self>, _: i64) -> Result<Self::Held> {
        let row = hold_in_unit(store, window_at(w), || empty_row(window_at(w).kind), true)?;
        let entries = window_entries(row.as_ref())?;
        Ok((row, entries))
    }

    fn held_row(held: &Self::Held, _: &mut dyn Iterator<Item = Option<BucketState>>) -> Vec<window::Entry> {
        held.1.clone()
    }

    fn decided<'d, 'i, 'a>(answer: &'d ItemAnswer<'i, 'a>) -> Option<&'d all_or_none::Decided<'i, 'a, Self>> {
        if let ItemAnswer::Window(d) = answer {
            Some(d)
        } else {
            None
        }
    }

    fn write_item<S: Store>(store: &mut S, d: &all_or_none::Decided<Self>, held: &Self::Held) -> Result<bool> {
        let new = window_row(&d.answer, d.item.limits.window_ms)?;
        write_held(store, window_at(d.item), held.0.as_ref(), new.as_ref())
    }
}

/// rl_take_all: every item is charged, or none. An unlocked read answers most refusals
/// without writing; otherwise every budget row is held (in a fixed order, so concurrent
/// calls never deadlock), then the bucket rows are held, everything is decided again from
/// the held rows and the buckets are written; the budgets are written last.
pub fn take_all<'i, 'a, S: Store>(store: &mut S, a: &'i TakeAllArgs<'a>) -> Result<TakeAllDecision<'i, 'a>> {
    writable_for(store, &a.limits)?;
    let first = all_or_none::decide(read_rows(store, a)?, a.now_ms);
    if !first.admitted {
        return Ok(first);
    }
    in_one_unit(store, |store| take_all_held(store, a))
}

pub(super) fn take_all_held<'i, 'a, S: Store>(
    store: &mut S,
    a: &'i TakeAllArgs<'a>,
) -> Result<TakeAllDecision<'i, 'a>> {
    // Limits are sorted buckets, budgets, windows: budgets are held, then windows, then
    // (by the store, in one batch) buckets.
    let held = a
        .limits
        .iter()
        .map(|limit| {
            Ok(crate::each_kind!(Limit => Held, limit, item => HeldItem {
                item,
                held: StoredKind::hold_item(store, item, a.now_ms)?,
            }))
        })
        .collect::<Result<Vec<_>>>()?;
    let buckets: Vec<&BucketItem> = a.limits.iter().filter_map(Limit::as_bucket).collect();
    let decision = store.decide_buckets(&buckets, |bucket_rows| {
        let mut batch = bucket_rows.iter().copied();
        let rows = held.iter().map(|h| crate::each_kind!(Held => ItemRow, h, h => h.read(&mut batch))).collect();
        let decision = all_or_none::decide(rows, a.now_ms);
        let writes = decision
            .items
            .iter()
            .filter_map(|item| crate::each_kind!(ItemAnswer, item, d => StoredKind::batch_write(d)))
            .map(|new| new.filter(|_| decision.admitted))
            .collect();
        (writes, decision)
    })?;
    if decision.admitted {
        for (h, answer) in held.iter().zip(&decision.items) {
            if !crate::each_kind!(Held, h, h => h.write(store, answer)?) {
                return Err(Error::storage("a row changed while this call held it; nothing was charged"));
            }
        }
    }
    Ok(decision)
}

/// An rl_take_all limit with what holding its row kept for the write.
struct HeldItem<'i, 'a, K: StoredKind> {
    item: &'i Item<'a, K>,
    held: K::Held,
}

/// A held limit, of any kind.
enum Held<'i, 'a> {
    Bucket(HeldItem<'i, 'a, BucketLimits>),
    Budget(HeldItem<'i, 'a, BudgetLimits>),
    Window(HeldItem<'i, 'a, WindowLimits>),
}

impl<'i, 'a, K: StoredKind> HeldItem<'i, 'a, K> {
    /// The limit with its held row, a bucket's taken from the store's batch in turn.
    fn read(&self, batch: &mut dyn Iterator<Item = Option<BucketState>>) -> all_or_none::Read<'i, 'a, K> {
        all_or_none::Read::new(self.item, K::held_row(&self.held, batch))
    }

    /// Writes what the admitted call decided for this limit (`answer`, the decision's
    /// item in the same place); false when its row changed while held.
    fn write<S: Store>(&self, store: &mut S, answer: &ItemAnswer) -> Result<bool> {
        let decided = K::decided(answer).ok_or_else(|| Error::storage("rl_take_all's answers and held rows differ"))?;
        K::write_item(store, decided, &self.held)
    }
}

/// Every limit with its row as it stands, in the order of `a.limits`.
pub(super) fn read_rows<'i, 'a, S: Store>(store: &mut S, a: &'i TakeAllArgs<'a>) -> Result<Vec<ItemRow<'i, 'a>>> {
    a.limits
        .iter()
        .map(|limit| {
            Ok(crate::each_kind!(Limit => ItemRow, limit, item => {
                all_or_none::Read::new(item, StoredKind::read_item(store, item)?)
            }))
        })
        .collect()
}

fn budget_at<'a>(item: &all_or_none::BudgetItem<'a>) -> BudgetAt<'a> {
    BudgetAt { key: item.key, period: item.limits.period }
}

fn window_at<'a>(item: &all_or_none::WindowItem<'a>) -> EntriesAt<'a> {
    EntriesAt { kind: window_kind(&item.limits), key: item.key }
}
