//! The memory store's table in the server's shared memory, after pg_stat_statements: asked
//! for at start when the library is in `shared_preload_libraries` (size from
//! `pg_ratelimit.memory_buckets`), one LWLock per part, saved to a file by the postmaster
//! at a clean shutdown and read back at the next start. The table's rules live in
//! [`ratelimit_core::memory`]; this module only finds the memory, takes the locks and
//! reads and writes the file.
//!
//! `unsafe` is allowed here alone for the hooks, the locks and the views of shared memory.
//! The invariant every view relies on: a part's bytes are only read under its lock (shared
//! or exclusive) and only written under its exclusive lock, except in the postmaster
//! before any backend exists (format, load) and after every backend is gone (save).

#![allow(unsafe_code)]

use std::ffi::CStr;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use pgrx::prelude::*;
use pgrx::{pg_sys, GucContext, GucFlags, GucRegistry, GucSetting};
use ratelimit_core::memory::{self, save_file, Hash, MemoryStats, Part, PartRef, PARTS};
use ratelimit_core::memory_store::SharedTable;
use ratelimit_core::refused::{self, Refused, RefusedSlots};
use ratelimit_core::stats::{CounterSink, CounterSlots, Outcome, PolicyCounts, ProcessCounters, SLOT_WORDS};

/// Buckets the table holds, fixed at server start.
pub static MEMORY_BUCKETS: GucSetting<i32> = GucSetting::<i32>::new(1_000_000);

const TRANCHE: &CStr = c"pg_ratelimit";
const SEGMENT: &CStr = c"pg_ratelimit buckets";
const COUNTER_SEGMENT: &CStr = c"pg_ratelimit counters";
const REFUSED_SEGMENT: &CStr = c"pg_ratelimit refused subjects";
/// Policies the counters hold (rl_policy_stats); a policy beyond them is not counted.
const COUNTER_SLOTS: usize = 1024;
/// The lock after the parts' serializes claiming a counter slot and resetting them.
const COUNTER_LOCK: usize = PARTS;
/// In the data directory, like pg_stat_statements' file; removed once read, so a crash
/// never brings back an old state.
const SAVE_FILE: &str = "pg_stat/pg_ratelimit_buckets.dat";
const SAVE_FILE_C: &CStr = c"pg_stat/pg_ratelimit_buckets.dat";
const SAVE_FILE_TMP_C: &CStr = c"pg_stat/pg_ratelimit_buckets.dat.tmp";
/// AddinShmemInitLock's place in MainLWLockArray (21 in lwlocknames.txt, 15 to 18): a C
/// macro, which bindgen does not carry over.
const ADDIN_SHMEM_INIT_LOCK: usize = 21;

/// The table's first 64 bytes; the parts follow.
#[repr(C)]
struct Header {
    secret: Hash,
    part_capacity: u64,
    part_bytes: u64,
    saved: u64,
    loaded: u64,
    reserved: [u64; 2],
}

const HEADER_BYTES: usize = 64;
const _: () = assert!(std::mem::size_of::<Header>() == HEADER_BYTES);

static TABLE: AtomicPtr<u8> = AtomicPtr::new(null_mut());
static COUNTER_WORDS: AtomicPtr<AtomicU64> = AtomicPtr::new(null_mut());
static REFUSED_WORDS: AtomicPtr<AtomicU64> = AtomicPtr::new(null_mut());
static LOCKS: AtomicPtr<pg_sys::LWLockPadded> = AtomicPtr::new(null_mut());
static mut PREV_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

fn part_capacity() -> usize {
    memory::part_capacity(MEMORY_BUCKETS.get().max(1) as usize)
}

fn total_bytes() -> usize {
    HEADER_BYTES + PARTS * memory::part_bytes(part_capacity())
}

/// Loaded at server start: defines the setting of the table's size and asks for the
/// memory. Loaded later, there is no table (and a setting fixed at start cannot be made).
pub fn init() {
    // SAFETY: a flag PostgreSQL sets while it loads shared_preload_libraries.
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        return;
    }
    GucRegistry::define_int_guc(
        c"pg_ratelimit.memory_buckets",
        c"Buckets the memory store holds (set at server start).",
        c"Each takes about 76 bytes of shared memory; rounded up to a multiple of 16.",
        &MEMORY_BUCKETS,
        1_000,
        200_000_000,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    // SAFETY: _PG_init runs once in the postmaster, before any hook is called.
    unsafe {
        PREV_REQUEST_HOOK = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(request_memory);
        PREV_STARTUP_HOOK = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(make_table);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn request_memory() {
    // SAFETY: PostgreSQL calls this hook once in the postmaster, where requests are allowed.
    unsafe {
        if let Some(previous) = PREV_REQUEST_HOOK {
            previous();
        }
        pg_sys::RequestAddinShmemSpace(total_bytes());
        pg_sys::RequestAddinShmemSpace(counter_bytes());
        pg_sys::RequestAddinShmemSpace(refused_bytes());
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), PARTS as i32 + 1);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn make_table() {
    // SAFETY: the startup hook runs in the postmaster (and after a crash, again there) with
    // the memory and the tranche granted by request_memory; AddinShmemInitLock is the lock
    // every extension holds while it looks its segment up.
    unsafe {
        if let Some(previous) = PREV_STARTUP_HOOK {
            previous();
        }
        let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(ADDIN_SHMEM_INIT_LOCK)).lock;
        pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let base = pg_sys::ShmemInitStruct(SEGMENT.as_ptr(), total_bytes(), &mut found).cast::<u8>();
        let locks = pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr());
        if !found {
            format(base);
        }
        let counters = pg_sys::ShmemInitStruct(COUNTER_SEGMENT.as_ptr(), counter_bytes(), &mut found).cast::<u8>();
        if !found {
            counters.write_bytes(0, counter_bytes()); // every slot free
        }
        let refused = pg_sys::ShmemInitStruct(REFUSED_SEGMENT.as_ptr(), refused_bytes(), &mut found).cast::<u8>();
        if !found {
            refused.write_bytes(0, refused_bytes()); // every slot free, every lock open
        }
        pg_sys::LWLockRelease(init_lock);
        COUNTER_WORDS.store(counters.cast(), Ordering::Release);
        REFUSED_WORDS.store(refused.cast(), Ordering::Release);
        TABLE.store(base, Ordering::Release);
        LOCKS.store(locks, Ordering::Release);
        if !pg_sys::IsUnderPostmaster {
            pg_sys::on_shmem_exit(Some(save_at_exit), pg_sys::Datum::from(0));
            if !found {
                load();
            }
        }
    }
}

/// An empty table with a new secret.
///
/// # Safety
/// `base` points at `total_bytes()` bytes nobody else uses yet.
unsafe fn format(base: *mut u8) {
    let (capacity, part_bytes) = (part_capacity(), memory::part_bytes(part_capacity()));
    let mut secret: Hash = [0; 2];
    // SAFETY: as the function's contract says; pg_strong_random fills the 16 bytes given.
    unsafe {
        if !pg_sys::pg_strong_random(secret.as_mut_ptr().cast(), 16) {
            pgrx::error!("pg_ratelimit: could not draw a random secret for the memory store");
        }
        base.cast::<Header>().write(Header {
            secret,
            part_capacity: capacity as u64,
            part_bytes: part_bytes as u64,
            saved: 0,
            loaded: 0,
            reserved: [0; 2],
        });
        for part in 0..PARTS {
            let bytes = std::slice::from_raw_parts_mut(base.add(HEADER_BYTES + part * part_bytes), part_bytes);
            memory::format_part(bytes, capacity);
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Reads the file of the last clean shutdown into the new table, then removes it.
///
/// # Safety
/// Only in the postmaster, before any backend exists.
unsafe fn load() {
    let Ok(bytes) = std::fs::read(SAVE_FILE) else { return };
    let _ = std::fs::remove_file(SAVE_FILE);
    let (secret, saved) = match save_file::decode(&bytes) {
        Ok(decoded) => decoded,
        Err(why) => {
            pgrx::log!("pg_ratelimit: ignoring {SAVE_FILE}: {why}; buckets start full");
            return;
        }
    };
    // SAFETY: no backend exists yet, so nothing else touches the table.
    let table = unsafe { &mut *TABLE.load(Ordering::Acquire).cast::<Header>() };
    table.secret = secret;
    let now = now_ms();
    let mut loaded = 0;
    for bucket in saved.iter().filter(|b| b.row.full_at > now) {
        let part = memory::part_of(&bucket.hash);
        // SAFETY: as above.
        unsafe { Part::new(part_bytes_mut(part)) }.insert(&bucket.hash, bucket.database, &bucket.row, now);
        loaded += 1;
    }
    table.saved = saved.len() as u64;
    table.loaded = loaded;
    pgrx::log!("pg_ratelimit: loaded {loaded} of {} buckets saved at the last shutdown", saved.len());
}

/// Whether the server stopped cleanly: its last checkpoint was a shutdown checkpoint, as
/// the control file says (`DB_SHUTDOWNED`, or on a standby `DB_SHUTDOWNED_IN_RECOVERY`).
/// The postmaster exits with code 0 after an immediate shutdown too, which stopped every
/// backend with SIGQUIT wherever it was (perhaps inside a bucket's write); only a fast or
/// smart shutdown writes that checkpoint. Read as bytes at the field's offset in this
/// major's `ControlFileData`: no allocation and no error path at exit.
fn shut_down_cleanly() -> bool {
    const STATE: usize = std::mem::offset_of!(pg_sys::ControlFileData, state);
    // (the postmaster's working directory is the data directory)
    let Ok(control) = std::fs::read("global/pg_control") else { return false };
    let Some(bytes) = control.get(STATE..STATE + 4).and_then(|b| <[u8; 4]>::try_from(b).ok()) else {
        return false;
    };
    let state: pg_sys::DBState::Type = u32::from_ne_bytes(bytes);
    state == pg_sys::DBState::DB_SHUTDOWNED || state == pg_sys::DBState::DB_SHUTDOWNED_IN_RECOVERY
}

/// Writes every bucket that is not yet full again to the file, at a clean shutdown only.
#[pg_guard]
unsafe extern "C-unwind" fn save_at_exit(code: std::ffi::c_int, _arg: pg_sys::Datum) {
    if code != 0 || TABLE.load(Ordering::Acquire).is_null() {
        return; // after a crash the table is not trusted: buckets start full
    }
    if !shut_down_cleanly() {
        pgrx::log!("pg_ratelimit: not saving buckets: the server did not shut down cleanly; buckets start full");
        return;
    }
    let now = now_ms();
    // SAFETY: the postmaster runs this as it exits, after every backend has stopped.
    let (secret, parts) = unsafe {
        let header = &*TABLE.load(Ordering::Acquire).cast::<Header>();
        (header.secret, (0..PARTS).map(|p| PartRef::new(part_bytes_ref(p))).collect::<Vec<_>>())
    };
    let live = parts.iter().flat_map(|p| p.slots().iter()).filter(|s| s.full_at > now);
    let (bytes, count) = save_file::encode(secret, live);
    let tmp = SAVE_FILE_TMP_C.to_str().expect("an ASCII name");
    // durable_rename, as pg_stat_statements saves its file: it syncs the new file, renames it
    // over the old one and syncs the folder, so a power cut leaves one whole file or the other.
    let written = std::fs::write(tmp, &bytes).and_then(|()| {
        // SAFETY: two NUL-terminated paths; PostgreSQL reports a failure at LOG and returns -1.
        let renamed =
            unsafe { pg_sys::durable_rename(SAVE_FILE_TMP_C.as_ptr(), SAVE_FILE_C.as_ptr(), pg_sys::LOG as i32) };
        if renamed == 0 {
            Ok(())
        } else {
            Err(std::io::Error::other("durable_rename failed (its LOG line says why)"))
        }
    });
    match written {
        Ok(()) => pgrx::log!("pg_ratelimit: saved {count} buckets to {SAVE_FILE}"),
        Err(e) => pgrx::log!("pg_ratelimit: could not save buckets to {SAVE_FILE}: {e}"),
    }
}

/// # Safety
/// The table exists and the caller holds part `part`'s lock (or is alone, see the module).
unsafe fn part_bytes_ref(part: usize) -> &'static [u8] {
    // SAFETY: as the function's contract says.
    unsafe {
        let base = TABLE.load(Ordering::Acquire);
        let part_bytes = (*base.cast::<Header>()).part_bytes as usize;
        std::slice::from_raw_parts(base.add(HEADER_BYTES + part * part_bytes), part_bytes)
    }
}

/// # Safety
/// The table exists and the caller holds part `part`'s lock exclusively (or is alone).
#[allow(clippy::mut_from_ref)]
unsafe fn part_bytes_mut(part: usize) -> &'static mut [u8] {
    // SAFETY: as the function's contract says.
    unsafe {
        let base = TABLE.load(Ordering::Acquire);
        let part_bytes = (*base.cast::<Header>()).part_bytes as usize;
        std::slice::from_raw_parts_mut(base.add(HEADER_BYTES + part * part_bytes), part_bytes)
    }
}

/// Part locks held by this backend, released when dropped (also if the work panics).
struct Held(Vec<*mut pg_sys::LWLock>);

impl Held {
    fn take(parts: &[usize], mode: pg_sys::LWLockMode::Type) -> Held {
        let locks = LOCKS.load(Ordering::Acquire);
        Held(
            parts
                .iter()
                .map(|&p| {
                    // SAFETY: the tranche has PARTS locks; LWLockAcquire waits without
                    // raising errors and holds interrupts until the release.
                    unsafe {
                        let lock = &raw mut (*locks.add(p)).lock;
                        pg_sys::LWLockAcquire(lock, mode);
                        lock
                    }
                })
                .collect(),
        )
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        for &lock in self.0.iter().rev() {
            // SAFETY: each lock was acquired by Held::take and is released once.
            unsafe { pg_sys::LWLockRelease(lock) };
        }
    }
}

/// The table as this backend's calls see it: its database's buckets.
pub struct SharedBuckets {
    secret: Hash,
    database: u32,
}

/// The table, or None when the library was not loaded at server start.
pub fn table() -> Option<SharedBuckets> {
    let base = TABLE.load(Ordering::Acquire);
    if base.is_null() {
        return None;
    }
    // SAFETY: the secret is written before any backend exists and never changes after;
    // MyDatabaseId is this backend's own.
    let (secret, database) = unsafe { ((*base.cast::<Header>()).secret, pg_sys::MyDatabaseId.to_u32()) };
    Some(SharedBuckets { secret, database })
}

impl SharedTable for SharedBuckets {
    fn hash(&self, key: &str) -> Hash {
        memory::bucket_hash(self.secret, self.database, key)
    }

    fn database(&self) -> u32 {
        self.database
    }

    fn read<R>(&mut self, part: usize, work: impl FnOnce(&PartRef) -> R) -> R {
        let _held = Held::take(&[part], pg_sys::LWLockMode::LW_SHARED);
        // SAFETY: part `part` is held in shared mode until `_held` drops.
        work(&PartRef::new(unsafe { part_bytes_ref(part) }))
    }

    fn write<R>(&mut self, parts: &[usize], work: impl FnOnce(&mut [Part]) -> R) -> R {
        let _held = Held::take(parts, pg_sys::LWLockMode::LW_EXCLUSIVE);
        // SAFETY: every part in `parts` (distinct) is held exclusively until `_held` drops.
        let mut views: Vec<Part> = parts.iter().map(|&p| Part::new(unsafe { part_bytes_mut(p) })).collect();
        work(&mut views)
    }
}

/// What `rl_memory_stats()` reports, or None when the table does not exist.
pub fn stats() -> Option<MemoryStats> {
    let base = TABLE.load(Ordering::Acquire);
    if base.is_null() {
        return None;
    }
    // SAFETY: saved and loaded are written only in the postmaster before backends exist.
    let header = unsafe { &*base.cast::<Header>() };
    let mut stats = MemoryStats {
        saved: header.saved,
        loaded: header.loaded,
        bytes_per_bucket: (total_bytes() / (PARTS * part_capacity())) as u64,
        ..MemoryStats::default()
    };
    let mut table = table()?;
    for part in 0..PARTS {
        table.read(part, |p| stats.add(&p.header()));
    }
    Some(stats)
}

fn counter_bytes() -> usize {
    COUNTER_SLOTS * SLOT_WORDS * 8
}

fn refused_bytes() -> usize {
    refused::WORDS * 8
}

/// rl_check's counters: in shared memory when the library was preloaded (every session of
/// the server), else in this backend (its own session's calls only).
pub struct Counters {
    session: std::sync::LazyLock<ProcessCounters>,
}

pub static COUNTERS: Counters = Counters { session: std::sync::LazyLock::new(ProcessCounters::default) };

impl Counters {
    fn slots(&self) -> Option<CounterSlots<'static>> {
        let words = COUNTER_WORDS.load(Ordering::Acquire);
        // SAFETY: the segment holds counter_bytes() of atomic words for the server's life;
        // a slot's identity changes only under COUNTER_LOCK (CounterSlots' rule).
        (!words.is_null())
            .then(|| CounterSlots(unsafe { std::slice::from_raw_parts(words, COUNTER_SLOTS * SLOT_WORDS) }))
    }

    fn refused(&self) -> Option<RefusedSlots<'static>> {
        let words = REFUSED_WORDS.load(Ordering::Acquire);
        // SAFETY: the segment holds refused_bytes() of atomic words for the server's life;
        // an entry changes only under its slot's lock word and a slot's policy also under
        // COUNTER_LOCK (RefusedSlots' rule).
        (!words.is_null()).then(|| RefusedSlots(unsafe { std::slice::from_raw_parts(words, refused::WORDS) }))
    }
}

impl CounterSink for Counters {
    fn count(&self, policy: &str, outcome: Outcome) {
        let Some(slots) = self.slots() else { return self.session.count(policy, outcome) };
        if !slots.add(policy, outcome) {
            let _held = Held::take(&[COUNTER_LOCK], pg_sys::LWLockMode::LW_EXCLUSIVE);
            if slots.claim(policy) {
                slots.add(policy, outcome);
            }
        }
    }

    fn snapshot(&self) -> Vec<(String, PolicyCounts)> {
        self.slots().map_or_else(|| self.session.snapshot(), |s| s.snapshot())
    }

    fn reset(&self) -> usize {
        match self.slots() {
            None => self.session.reset(),
            Some(slots) => {
                let _held = Held::take(&[COUNTER_LOCK], pg_sys::LWLockMode::LW_EXCLUSIVE);
                if let Some(refused) = self.refused() {
                    refused.reset();
                }
                slots.reset()
            }
        }
    }

    fn refuse(&self, policy: &str, subject: &str, now_ms: i64) {
        let Some(slots) = self.refused() else { return self.session.refuse(policy, subject, now_ms) };
        // once every slot is taken, a policy without one costs no lock
        if !slots.record(policy, subject, now_ms) && slots.has_free() {
            let _held = Held::take(&[COUNTER_LOCK], pg_sys::LWLockMode::LW_EXCLUSIVE);
            if slots.claim(policy) {
                slots.record(policy, subject, now_ms);
            }
        }
    }

    fn top_refused(&self, policy: &str, n: usize) -> Vec<Refused> {
        self.refused().map_or_else(|| self.session.top_refused(policy, n), |s| s.top(policy, n))
    }

    fn scope(&self) -> &'static str {
        if self.slots().is_some() {
            "server"
        } else {
            "session"
        }
    }
}
