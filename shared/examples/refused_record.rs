//! The refused-subject summary's own cost: nanoseconds per `RefusedSlots::record` when 256
//! subjects churn through a policy's 64 entries (most records replace an entry, the dearest
//! path), one thread, the summary as large as PostgreSQL's. `bench/bench.py`'s refused
//! section prints it beside a refusal's whole cost.
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use ratelimit_core::refused::{RefusedSlots, WORDS};

fn main() {
    let words: Vec<AtomicU64> = (0..WORDS).map(|_| AtomicU64::new(0)).collect();
    let slots = RefusedSlots(&words);
    for p in 0..127 {
        slots.claim(&format!("fill{p}"));
    }
    slots.claim("flood"); // the last slot: found after a scan past all the others
    let subjects: Vec<String> = (1..=256).map(|i| format!("s{i}")).collect();
    let calls = 2_000_000;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        for i in 0..calls {
            slots.record("flood", &subjects[(i * 7919) % subjects.len()], i as i64);
        }
        best = best.min(start.elapsed().as_nanos() as f64 / calls as f64);
    }
    println!("{best:.0}");
}
