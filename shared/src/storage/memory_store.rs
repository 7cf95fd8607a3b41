//! The memory store: buckets in the engine's shared table ([`crate::memory`]); budgets,
//! windows, leases and policies where they always are, in the SQL store. Same protocol, same
//! answers; bucket calls need no statement and no writable transaction.

use crate::bucket::BucketState;
use crate::decision_slot::Decide;
use crate::memory::{part_of, Hash, Part, PartRef, PARTS};
use crate::store::{BucketRows, ChangeResult, Changed, PolicyGuard, StoreResult, TableRows, TablesElsewhere};
use crate::take_all::BucketItem;

/// What the engine provides: the table's parts under its locks. Work done under a lock is
/// pure arithmetic on the part; it never fails and never waits for anything else.
pub trait SharedTable {
    /// The name of `key`'s bucket (the engine knows its database and the table's secret).
    fn hash(&self, key: &str) -> Hash;
    /// The caller's database.
    fn database(&self) -> u32;
    /// Runs `work` on part `part` held in shared mode.
    fn read<R>(&mut self, part: usize, work: impl FnOnce(&PartRef) -> R) -> R;
    /// Runs `work` on `parts` (ascending, distinct) held in exclusive mode, taken in that
    /// order so that concurrent calls never wait in a cycle; `work` gets them in the same order.
    fn write<R>(&mut self, parts: &[usize], work: impl FnOnce(&mut [Part]) -> R) -> R;
}

/// Buckets in `buckets`, budgets in `table`.
pub struct MemoryStore<M, T> {
    pub buckets: M,
    pub table: T,
}

impl<M: SharedTable, T> MemoryStore<M, T> {
    fn with_bucket<R>(&mut self, key: &str, work: impl FnOnce(&mut Part, &Hash) -> R) -> R {
        let hash = self.buckets.hash(key);
        self.buckets.write(&[part_of(&hash)], |parts| work(&mut parts[0], &hash))
    }
}

/// The tables are the SQL store's, as they always are.
impl<M, T: TableRows> TablesElsewhere for MemoryStore<M, T> {
    type Tables = T;

    fn tables(&mut self) -> &mut T {
        &mut self.table
    }
}

/// Buckets in the shared table; a sweep or reset also clears buckets the table store kept
/// before the switch.
impl<M: SharedTable, T: BucketRows + TableRows> BucketRows for MemoryStore<M, T> {
    /// Shared memory takes writes even on a standby or in a read-only transaction.
    fn buckets_read_only(&mut self) -> StoreResult<bool> {
        Ok(false)
    }

    fn read_bucket(&mut self, key: &str) -> StoreResult<Option<BucketState>> {
        let hash = self.buckets.hash(key);
        Ok(self.buckets.read(part_of(&hash), |part| part.get(&hash)))
    }

    /// A new row's `refilled_at` is the time of the call that makes it (what a full part
    /// compares `full_at` with).
    fn insert_bucket(&mut self, key: &str, row: &BucketState) -> StoreResult<bool> {
        let database = self.buckets.database();
        Ok(self.with_bucket(key, |part, hash| part.insert(hash, database, row, row.refilled_at)))
    }

    fn change_bucket(&mut self, key: &str, decide: Decide<BucketState>) -> ChangeResult<BucketState> {
        Ok(self.with_bucket(key, |part, hash| part.change(hash, |row| decide(row))))
    }

    /// The memory's buckets of this database first, then any the table still holds from
    /// before the store was switched, so that nothing is left behind either way.
    fn sweep_buckets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64> {
        let database = self.buckets.database();
        let mut removed = 0;
        for part in 0..PARTS {
            if removed >= limit {
                return Ok(removed);
            }
            removed += self.buckets.write(&[part], |parts| parts[0].sweep(database, cutoff_ms, limit - removed));
        }
        Ok(removed + self.table.sweep_buckets(cutoff_ms, limit - removed)?)
    }

    /// Holds every part the keys fall in, in ascending order, for the decision and the writes.
    fn decide_buckets<R>(
        &mut self,
        items: &[&BucketItem],
        decide: impl FnOnce(&[Option<BucketState>]) -> (Vec<Option<BucketState>>, R),
    ) -> StoreResult<R> {
        let hashes: Vec<Hash> = items.iter().map(|item| self.buckets.hash(item.key)).collect();
        let mut parts: Vec<usize> = hashes.iter().map(part_of).collect();
        parts.sort_unstable();
        parts.dedup();
        let database = self.buckets.database();
        let held = |hash: &Hash| parts.binary_search(&part_of(hash)).expect("every key's part is held");
        Ok(self.buckets.write(&parts, |locked| {
            let rows: Vec<Option<BucketState>> = hashes.iter().map(|h| locked[held(h)].get(h)).collect();
            let (writes, answer) = decide(&rows);
            for (hash, new) in hashes.iter().zip(&writes) {
                if let Some(new) = new {
                    locked[held(hash)].put(hash, database, new, new.refilled_at);
                }
            }
            answer
        }))
    }

    /// The key's bucket in memory, and one the table holds under it.
    fn delete_bucket(&mut self, key: &str) -> StoreResult<i64> {
        let in_memory = self.with_bucket(key, |part, hash| part.remove(hash)) as i64;
        Ok(in_memory + self.table.delete_bucket(key)?)
    }

    /// Only at an epoch kept in memory and found unmoved: the guard's rows live in tables
    /// and the bucket here, so no one statement can test one and change the other.
    fn change_bucket_for_policy(
        &mut self,
        key: &str,
        guard: &PolicyGuard,
        decide: Decide<BucketState>,
    ) -> ChangeResult<BucketState> {
        match self.epoch_unmoved_in_memory(guard) {
            Some(true) => self.change_bucket(key, decide),
            _ => Ok(Changed { decided_on: None, written: false }),
        }
    }
}
