//! The memory store's table: buckets in a fixed-size region of shared memory (PostgreSQL,
//! `pg_ratelimit.buckets = 'memory'`). Pure and safe: the engine hands in byte regions it
//! has locked; this module lays them out and keeps them consistent.
//!
//! The table is [`PARTS`] parts, each with a lock of its own, so calls on different keys
//! rarely wait for each other. A key lives in the part its hash picks. A part holds:
//! - `slots`: the buckets, packed at the front (`in_use` of them);
//! - `index`: an open-addressing table (linear probing, at most half full) from hash to slot;
//! - `heap`: the slots ordered by `full_at`, earliest first, so that when the part is full
//!   the bucket to replace is found at once: the root is full again already if any bucket
//!   is (replacing it changes no answer), else it is the one that will be full soonest.
//!   The heap is ordered lazily: a take usually moves `full_at` later, and then the heap is
//!   left alone (its key for the slot is only a lower bound); a replacement that finds a
//!   stale root re-files it and looks again, so the root it takes is the true earliest.
//!
//! Keys are not stored: a bucket is named by a 128-bit SipHash of the database and the key
//! under a secret drawn when the table is first made (kept across restarts in the save
//! file). Two keys share a bucket only if their hashes collide: among n live keys the
//! chance that any two do is below n²/2¹²⁹ (under 10⁻²¹ for a billion keys), and without
//! the secret nobody can aim for a collision.

use bytemuck::{Pod, Zeroable};
use siphasher::sip128::{Hasher128, SipHasher13};
use std::hash::Hasher;

use crate::bucket::BucketState;
use crate::store::Changed;

/// How many parts (and locks) the table has.
pub const PARTS: usize = 16;

/// A bucket's name: 128 bits of keyed hash.
pub type Hash = [u64; 2];

/// What the table has for one bucket.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct Slot {
    pub hash: Hash,
    pub level: f64,
    pub refilled_at: i64,
    pub full_at: i64,
    /// The `full_at` the heap orders this slot by: never later than `full_at`.
    heap_key: i64,
    /// Where this slot stands in the part's heap.
    heap_pos: u32,
    /// The database (OID) whose bucket this is: rl_sweep only removes its caller's.
    pub database: u32,
    /// Pads a slot to one 64-byte cache line (parts and slots start on one), so a lookup
    /// touches one line of the slots, not two.
    reserved: u64,
}

/// The counters of one part.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct PartHeader {
    pub capacity: u64,
    pub in_use: u64,
    /// New keys that replaced a bucket that was full again (no answer changed).
    pub evicted_full: u64,
    /// New keys that replaced a bucket before it was full again (its key starts over full).
    pub evicted_early: u64,
    index_len: u64,
    reserved: [u64; 3],
}

const HEADER_BYTES: usize = std::mem::size_of::<PartHeader>();
const SLOT_BYTES: usize = std::mem::size_of::<Slot>();
/// Every part starts on a cache line of its own.
const ALIGN: usize = 64;

fn index_len(capacity: usize) -> usize {
    (capacity * 2).next_power_of_two().max(2)
}

/// Bytes one part of `capacity` buckets takes.
pub fn part_bytes(capacity: usize) -> usize {
    let raw = HEADER_BYTES + capacity * SLOT_BYTES + index_len(capacity) * 4 + capacity * 4;
    raw.div_ceil(ALIGN) * ALIGN
}

/// Buckets per part for a table of at least `capacity` buckets.
pub fn part_capacity(capacity: usize) -> usize {
    capacity.div_ceil(PARTS).max(1)
}

/// Bytes of a whole table of at least `capacity` buckets.
pub fn table_bytes(capacity: usize) -> usize {
    PARTS * part_bytes(part_capacity(capacity))
}

/// The part a hash belongs to.
pub fn part_of(hash: &Hash) -> usize {
    (hash[0] >> 60) as usize % PARTS
}

/// The name of `key`'s bucket in `database`.
pub fn bucket_hash(secret: Hash, database: u32, key: &str) -> Hash {
    let mut h = SipHasher13::new_with_keys(secret[0], secret[1]);
    h.write(&database.to_le_bytes());
    h.write(key.as_bytes());
    let out = h.finish128();
    [out.h1, out.h2]
}

/// Makes `bytes` (at least [`part_bytes`]`(capacity)`, 8-byte aligned) an empty part.
pub fn format_part(bytes: &mut [u8], capacity: usize) {
    bytes[..part_bytes(capacity)].fill(0);
    let header: &mut PartHeader = bytemuck::from_bytes_mut(&mut bytes[..HEADER_BYTES]);
    header.capacity = capacity as u64;
    header.index_len = index_len(capacity) as u64;
}

/// Splits a part's bytes into its header and arrays.
fn split(bytes: &[u8]) -> (&PartHeader, &[Slot], &[u32]) {
    let (head, rest) = bytes.split_at(HEADER_BYTES);
    let header: &PartHeader = bytemuck::from_bytes(head);
    let (cap, idx) = (header.capacity as usize, header.index_len as usize);
    let (slots, rest) = rest.split_at(cap * SLOT_BYTES);
    (header, bytemuck::cast_slice(slots), bytemuck::cast_slice(&rest[..idx * 4]))
}

fn find(slots: &[Slot], index: &[u32], hash: &Hash) -> Option<(usize, usize)> {
    let mask = index.len() - 1;
    let mut at = hash[1] as usize & mask;
    loop {
        match index[at] {
            0 => return None,
            v if slots[v as usize - 1].hash == *hash => return Some((at, v as usize - 1)),
            _ => at = (at + 1) & mask,
        }
    }
}

fn state_of(s: &Slot) -> BucketState {
    BucketState { level: s.level, refilled_at: s.refilled_at, full_at: s.full_at }
}

/// A part held under a shared lock: reads only.
pub struct PartRef<'m> {
    header: &'m PartHeader,
    slots: &'m [Slot],
    index: &'m [u32],
}

impl<'m> PartRef<'m> {
    pub fn new(bytes: &'m [u8]) -> Self {
        let (header, slots, index) = split(bytes);
        PartRef { header, slots, index }
    }

    pub fn get(&self, hash: &Hash) -> Option<BucketState> {
        find(self.slots, self.index, hash).map(|(_, s)| state_of(&self.slots[s]))
    }

    pub fn header(&self) -> PartHeader {
        *self.header
    }

    /// Every bucket of the part.
    pub fn slots(&self) -> &'m [Slot] {
        &self.slots[..self.header.in_use as usize]
    }
}

/// A part held under an exclusive lock.
pub struct Part<'m> {
    header: &'m mut PartHeader,
    slots: &'m mut [Slot],
    index: &'m mut [u32],
    heap: &'m mut [u32],
}

impl<'m> Part<'m> {
    pub fn new(bytes: &'m mut [u8]) -> Self {
        let (head, rest) = bytes.split_at_mut(HEADER_BYTES);
        let header: &mut PartHeader = bytemuck::from_bytes_mut(head);
        let (cap, idx) = (header.capacity as usize, header.index_len as usize);
        let (slots, rest) = rest.split_at_mut(cap * SLOT_BYTES);
        let (index, rest) = rest.split_at_mut(idx * 4);
        Part {
            header,
            slots: bytemuck::cast_slice_mut(slots),
            index: bytemuck::cast_slice_mut(index),
            heap: bytemuck::cast_slice_mut(&mut rest[..cap * 4]),
        }
    }

    pub fn get(&self, hash: &Hash) -> Option<BucketState> {
        find(self.slots, self.index, hash).map(|(_, s)| state_of(&self.slots[s]))
    }

    /// Hands the bucket of `hash` to `decide` and stores what it returns, if anything.
    /// Without a bucket, `decide` is not called.
    pub fn change(
        &mut self,
        hash: &Hash,
        decide: impl Fn(&BucketState) -> Option<BucketState>,
    ) -> Changed<BucketState> {
        let Some((_, slot)) = find(self.slots, self.index, hash) else {
            return Changed { decided_on: None, written: false };
        };
        let old = state_of(&self.slots[slot]);
        let new = decide(&old);
        if let Some(new) = new {
            self.write(slot, &new);
        }
        Changed { decided_on: Some(old), written: new.is_some() }
    }

    /// Stores `row` over the bucket of `hash`, adding it if missing (see [`Part::insert`]).
    pub fn put(&mut self, hash: &Hash, database: u32, row: &BucketState, now_ms: i64) {
        match find(self.slots, self.index, hash) {
            Some((_, slot)) => self.write(slot, row),
            None => {
                self.insert(hash, database, row, now_ms);
            }
        }
    }

    /// Adds the bucket of `hash` unless it exists; returns whether it did. A full part
    /// makes room by replacing the bucket with the earliest `full_at`: one that is full
    /// again by `now_ms` if there is any, else the one that will be full soonest.
    pub fn insert(&mut self, hash: &Hash, database: u32, row: &BucketState, now_ms: i64) -> bool {
        if find(self.slots, self.index, hash).is_some() {
            return false;
        }
        let used = self.header.in_use as usize;
        let slot = if used < self.slots.len() {
            self.header.in_use += 1;
            self.heap[used] = used as u32;
            self.slots[used].heap_pos = used as u32;
            used
        } else {
            let victim = self.earliest_full_at();
            if self.slots[victim].full_at <= now_ms {
                self.header.evicted_full += 1;
            } else {
                self.header.evicted_early += 1;
            }
            let old = self.slots[victim].hash;
            self.unindex(&old);
            victim
        };
        self.slots[slot].hash = *hash;
        self.slots[slot].database = database;
        self.index_add(hash, slot);
        self.slots[slot].heap_key = row.full_at;
        self.write(slot, row);
        let pos = self.slots[slot].heap_pos as usize;
        self.sift(pos);
        true
    }

    /// The slot with the earliest `full_at`: the heap's root once its key is current.
    fn earliest_full_at(&mut self) -> usize {
        loop {
            let root = self.heap[0] as usize;
            let s = &mut self.slots[root];
            if s.heap_key >= s.full_at {
                return root;
            }
            s.heap_key = s.full_at;
            self.sift_down(0);
        }
    }

    /// Removes the bucket of `hash`; returns whether there was one.
    pub fn remove(&mut self, hash: &Hash) -> bool {
        let Some((_, slot)) = find(self.slots, self.index, hash) else {
            return false;
        };
        self.remove_slot(slot);
        true
    }

    /// Removes at most `limit` buckets of `database` that are full by `cutoff_ms`; returns
    /// how many. Looks at every bucket of the part (buckets of all databases share the
    /// heap), so it is for an occasional sweep, not for every call.
    pub fn sweep(&mut self, database: u32, cutoff_ms: i64, limit: i64) -> i64 {
        let mut removed = 0;
        let mut slot = 0;
        while removed < limit && slot < self.header.in_use as usize {
            let s = &self.slots[slot];
            if s.database == database && s.full_at <= cutoff_ms {
                // The last slot moves into this one: look at it next.
                self.remove_slot(slot);
                removed += 1;
            } else {
                slot += 1;
            }
        }
        removed
    }

    /// Stores a row; the heap only moves when `full_at` went earlier than its key.
    fn write(&mut self, slot: usize, row: &BucketState) {
        let s = &mut self.slots[slot];
        s.level = row.level;
        s.refilled_at = row.refilled_at;
        s.full_at = row.full_at;
        if row.full_at < s.heap_key {
            s.heap_key = row.full_at;
            let pos = s.heap_pos as usize;
            self.sift_up(pos);
        }
    }

    fn remove_slot(&mut self, slot: usize) {
        let hash = self.slots[slot].hash;
        self.unindex(&hash);
        // Out of the heap: the last heap entry takes its place.
        let last_pos = self.header.in_use as usize - 1;
        let pos = self.slots[slot].heap_pos as usize;
        self.heap_swap(pos, last_pos);
        // Out of the slots: the last slot moves into the hole.
        let last = last_pos;
        if slot != last {
            let moved = self.slots[last];
            let (at, _) = find(self.slots, self.index, &moved.hash).expect("every slot in use is indexed");
            self.index[at] = slot as u32 + 1;
            self.slots[slot] = moved;
            self.heap[moved.heap_pos as usize] = slot as u32;
        }
        self.header.in_use -= 1;
        if pos < last_pos {
            self.sift(pos);
        }
    }

    fn index_add(&mut self, hash: &Hash, slot: usize) {
        let mask = self.index.len() - 1;
        let mut at = hash[1] as usize & mask;
        while self.index[at] != 0 {
            at = (at + 1) & mask;
        }
        self.index[at] = slot as u32 + 1;
    }

    /// Removes `hash` from the index, shifting later entries of its probe run back so
    /// that every entry stays reachable from its home position.
    fn unindex(&mut self, hash: &Hash) {
        let Some((mut hole, _)) = find(self.slots, self.index, hash) else { return };
        let mask = self.index.len() - 1;
        self.index[hole] = 0;
        let mut at = hole;
        loop {
            at = (at + 1) & mask;
            let v = self.index[at];
            if v == 0 {
                return;
            }
            let home = self.slots[v as usize - 1].hash[1] as usize & mask;
            // The entry may move to the hole unless its home lies cyclically in (hole, at].
            let stays = if hole <= at { hole < home && home <= at } else { hole < home || home <= at };
            if !stays {
                self.index[hole] = v;
                self.index[at] = 0;
                hole = at;
            }
        }
    }

    fn key_at(&self, pos: usize) -> i64 {
        self.slots[self.heap[pos] as usize].heap_key
    }

    fn heap_swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.slots[self.heap[a] as usize].heap_pos = a as u32;
        self.slots[self.heap[b] as usize].heap_pos = b as u32;
    }

    /// Restores heap order after the key at `pos` changed either way.
    fn sift(&mut self, pos: usize) {
        let pos = self.sift_up(pos);
        self.sift_down(pos);
    }

    fn sift_up(&mut self, mut pos: usize) -> usize {
        while pos > 0 {
            let parent = (pos - 1) / 2;
            if self.key_at(parent) <= self.key_at(pos) {
                break;
            }
            self.heap_swap(parent, pos);
            pos = parent;
        }
        pos
    }

    fn sift_down(&mut self, mut pos: usize) {
        let len = self.header.in_use as usize;
        loop {
            let (left, right) = (2 * pos + 1, 2 * pos + 2);
            let mut least = pos;
            if left < len && self.key_at(left) < self.key_at(least) {
                least = left;
            }
            if right < len && self.key_at(right) < self.key_at(least) {
                least = right;
            }
            if least == pos {
                return;
            }
            self.heap_swap(pos, least);
            pos = least;
        }
    }

    #[cfg(test)]
    fn check_invariants(&self) {
        let used = self.header.in_use as usize;
        for (pos, &slot) in self.heap[..used].iter().enumerate() {
            assert_eq!(self.slots[slot as usize].heap_pos as usize, pos);
            if pos > 0 {
                assert!(self.key_at((pos - 1) / 2) <= self.key_at(pos), "heap order at {pos}");
            }
            let s = &self.slots[slot as usize];
            assert!(s.heap_key <= s.full_at, "a heap key is a lower bound");
        }
        for s in 0..used {
            assert_eq!(find(self.slots, self.index, &self.slots[s].hash).map(|(_, x)| x), Some(s));
        }
        assert_eq!(self.index.iter().filter(|&&v| v != 0).count(), used);
    }
}

/// What the whole table holds and has done, for `rl_memory_stats()`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub capacity: u64,
    pub in_use: u64,
    pub evicted_full: u64,
    pub evicted_early: u64,
    /// Buckets written to the save file at the last clean shutdown.
    pub saved: u64,
    /// Buckets read back from it at this start.
    pub loaded: u64,
    pub bytes_per_bucket: u64,
}

impl MemoryStats {
    /// Adds one part's counters.
    pub fn add(&mut self, part: &PartHeader) {
        self.capacity += part.capacity;
        self.in_use += part.in_use;
        self.evicted_full += part.evicted_full;
        self.evicted_early += part.evicted_early;
    }
}

/// The save file: a header naming the format, the secret (the hashes mean nothing without
/// it), then the buckets. A file that does not match in every respect is not trusted.
pub mod save_file;

#[cfg(test)]
mod tests {
    use super::*;

    fn part(capacity: usize) -> Vec<u64> {
        let mut words = vec![0u64; part_bytes(capacity) / 8];
        format_part(bytemuck::cast_slice_mut(&mut words), capacity);
        words
    }

    fn h(n: u64) -> Hash {
        [n.wrapping_mul(0x9e37_79b9_7f4a_7c15), n.wrapping_mul(0xc2b2_ae3d_27d4_eb4f) ^ n]
    }

    fn row(full_at: i64) -> BucketState {
        BucketState { level: 1.0, refilled_at: 0, full_at }
    }

    #[test]
    fn insert_find_change_remove() {
        let mut words = part(8);
        let mut p = Part::new(bytemuck::cast_slice_mut(&mut words));
        assert!(p.insert(&h(1), 1, &row(10), 0));
        assert!(!p.insert(&h(1), 1, &row(99), 0), "an existing bucket is not replaced");
        assert_eq!(p.get(&h(1)), Some(row(10)));
        assert_eq!(p.get(&h(2)), None);
        let changed = p.change(&h(1), |r| Some(BucketState { level: r.level - 1.0, ..*r }));
        assert_eq!(changed, Changed { decided_on: Some(row(10)), written: true });
        assert_eq!(p.get(&h(1)).map(|r| r.level), Some(0.0));
        assert_eq!(p.change(&h(2), |_| panic!("no row: no decision")), Changed { decided_on: None, written: false });
        assert!(p.remove(&h(1)));
        assert!(!p.remove(&h(1)));
        p.check_invariants();
    }

    /// (full_at of each of 4 buckets, now of the insert) -> which goes, counted how.
    #[test]
    fn a_full_part_replaces_the_earliest_full_at() {
        for (full_ats, now, victim, full, early) in [
            ([50, 10, 30, 40], 20, 1, 1, 0), // bucket 1 is full again: no answer changes
            ([50, 10, 30, 40], 5, 1, 0, 1),  // none is: the soonest full goes, counted early
            ([5, 6, 7, 8], 100, 0, 1, 0),    // several full: the earliest
        ] {
            let mut words = part(4);
            let mut p = Part::new(bytemuck::cast_slice_mut(&mut words));
            for (i, f) in full_ats.iter().enumerate() {
                assert!(p.insert(&h(i as u64), 1, &row(*f), 0));
            }
            assert!(p.insert(&h(100), 1, &row(1000), now));
            assert_eq!(p.get(&h(victim)), None, "{full_ats:?} at {now}");
            for i in (0..4).filter(|&i| i != victim) {
                assert!(p.get(&h(i)).is_some());
            }
            assert_eq!((p.header.evicted_full, p.header.evicted_early), (full, early));
            assert_eq!(p.header.in_use, 4);
            p.check_invariants();
        }
    }

    /// A bucket whose full_at moved later keeps its old heap key until a replacement
    /// looks: it must still go after the bucket that is truly earliest.
    #[test]
    fn a_later_full_at_is_honoured_though_the_heap_is_lazy() {
        let mut words = part(4);
        let mut p = Part::new(bytemuck::cast_slice_mut(&mut words));
        for (i, f) in [10, 20, 30, 40].iter().enumerate() {
            p.insert(&h(i as u64), 1, &row(*f), 0);
        }
        p.put(&h(0), 1, &row(100), 0); // taken again: full at 100 now
        p.check_invariants();
        assert!(p.insert(&h(9), 1, &row(50), 25));
        assert_eq!(p.get(&h(1)), None, "20 was the earliest, not the stale 10");
        assert!(p.get(&h(0)).is_some());
        assert_eq!((p.header.evicted_full, p.header.evicted_early), (1, 0));
        p.put(&h(3), 1, &row(5), 0); // full_at earlier: the heap moves at once
        assert!(p.insert(&h(10), 1, &row(60), 1));
        assert_eq!(p.get(&h(3)), None);
        p.check_invariants();
    }

    #[test]
    fn sweep_takes_only_buckets_full_by_the_cutoff() {
        let mut words = part(16);
        let mut p = Part::new(bytemuck::cast_slice_mut(&mut words));
        for i in 0..10 {
            p.insert(&h(i), 1, &row(i as i64 * 10), 0);
        }
        p.insert(&h(99), 2, &row(0), 0);
        assert_eq!(p.sweep(1, 45, 100), 5);
        assert!((0..5).all(|i| p.get(&h(i)).is_none()) && (5..10).all(|i| p.get(&h(i)).is_some()));
        assert_eq!(p.sweep(1, 1000, 2), 2, "at most limit");
        assert_eq!(p.header.in_use, 4);
        assert!(p.get(&h(99)).is_some(), "another database's bucket stays");
        assert_eq!(p.sweep(2, 0, 100), 1);
        p.check_invariants();
    }

    /// Random operations against a plain map: the index, heap and packing stay consistent.
    #[test]
    fn random_operations_match_a_map() {
        use std::collections::HashMap;
        let mut words = part(64);
        let mut p = Part::new(bytemuck::cast_slice_mut(&mut words));
        let mut model: HashMap<u64, BucketState> = HashMap::new();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for step in 0..20_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let k = rng % 50;
            let r = row((rng >> 20) as i64 % 1000);
            match (rng >> 8) % 4 {
                0 => {
                    assert_eq!(p.insert(&h(k), 1, &r, 0), !model.contains_key(&k));
                    model.entry(k).or_insert(r);
                }
                1 => assert_eq!(p.remove(&h(k)), model.remove(&k).is_some()),
                2 => {
                    p.put(&h(k), 1, &r, 0);
                    model.insert(k, r);
                }
                _ => assert_eq!(p.get(&h(k)), model.get(&k).copied(), "step {step}"),
            }
            if step % 997 == 0 {
                p.check_invariants();
            }
        }
        assert_eq!(p.header.in_use as usize, model.len());
        p.check_invariants();
    }

    #[test]
    fn hashes_separate_keys_and_databases() {
        let s = [1, 2];
        assert_ne!(bucket_hash(s, 1, "a"), bucket_hash(s, 1, "b"));
        assert_ne!(bucket_hash(s, 1, "a"), bucket_hash(s, 2, "a"));
        assert_ne!(bucket_hash(s, 1, "a"), bucket_hash([3, 4], 1, "a"));
        assert_eq!(bucket_hash(s, 1, "a"), bucket_hash(s, 1, "a"));
    }

    #[test]
    fn save_file_round_trips_and_rejects_damage() {
        let slots = [
            Slot {
                hash: [1, 2],
                level: 2.5,
                refilled_at: 7,
                full_at: 9,
                heap_key: 9,
                heap_pos: 0,
                database: 5,
                reserved: 0,
            },
            Slot {
                hash: [3, 4],
                level: 0.0,
                refilled_at: -1,
                full_at: i64::MAX,
                heap_key: 0,
                heap_pos: 1,
                database: 6,
                reserved: 0,
            },
        ];
        let (bytes, count) = save_file::encode([5, 6], slots.iter());
        assert_eq!(count, 2);
        let (secret, saved) = save_file::decode(&bytes).unwrap();
        assert_eq!(secret, [5, 6]);
        assert_eq!(saved.len(), 2);
        assert_eq!((saved[1].hash, saved[1].database), ([3, 4], 6));
        assert_eq!(saved[1].row, BucketState { level: 0.0, refilled_at: -1, full_at: i64::MAX });
        for cut in [0, 8, 31, bytes.len() - 1] {
            assert!(save_file::decode(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
        let mut flipped = bytes.clone();
        flipped[40] ^= 1;
        assert!(save_file::decode(&flipped).is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(SLOT_BYTES, ALIGN);
        assert_eq!(part_bytes(1) % ALIGN, 0);
        // The default capacity fits well inside 128 MB.
        assert!(table_bytes(1_000_000) < 96 << 20, "{}", table_bytes(1_000_000));
    }
}
