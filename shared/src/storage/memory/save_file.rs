//! The save file's format (see ARCHITECTURE.md, "Stored formats").

use super::{Hash, Slot};
use crate::bucket::BucketState;

const MAGIC: &[u8; 8] = b"RLBUCKT1";
const HEADER: usize = 8 + 16 + 8;
const ENTRY: usize = 16 + 24 + 8;

/// A bucket as saved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Saved {
    pub hash: Hash,
    pub database: u32,
    pub row: BucketState,
}

/// The file's bytes for these buckets, with a checksum at the end.
pub fn encode<'s>(secret: Hash, buckets: impl Iterator<Item = &'s Slot>) -> (Vec<u8>, u64) {
    let mut out = Vec::with_capacity(4096);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&secret[0].to_le_bytes());
    out.extend_from_slice(&secret[1].to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes()); // count, filled in below
    let mut count = 0u64;
    for s in buckets {
        for word in [s.hash[0], s.hash[1], s.level.to_bits(), s.refilled_at as u64, s.full_at as u64, s.database as u64]
        {
            out.extend_from_slice(&word.to_le_bytes());
        }
        count += 1;
    }
    out[24..32].copy_from_slice(&count.to_le_bytes());
    let sum = checksum(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    (out, count)
}

/// The secret and the buckets of a file, or why it is not trusted.
pub fn decode(bytes: &[u8]) -> Result<(Hash, Vec<Saved>), String> {
    if bytes.len() < HEADER + 8 || &bytes[..8] != MAGIC {
        return Err("not a pg_ratelimit bucket file of this version".into());
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    if checksum(body).to_le_bytes() != sum {
        return Err("checksum mismatch".into());
    }
    let word = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
    let count = word(24) as usize;
    if Some(body.len()) != count.checked_mul(ENTRY).and_then(|n| n.checked_add(HEADER)) {
        return Err("length does not match the bucket count".into());
    }
    let buckets = (0..count)
        .map(|i| {
            let at = HEADER + i * ENTRY;
            Saved {
                hash: [word(at), word(at + 8)],
                database: word(at + 40) as u32,
                row: BucketState {
                    level: f64::from_bits(word(at + 16)),
                    refilled_at: word(at + 24) as i64,
                    full_at: word(at + 32) as i64,
                },
            }
        })
        .collect();
    Ok(([word(8), word(16)], buckets))
}

fn checksum(bytes: &[u8]) -> u64 {
    // FNV-1a: catches a torn or truncated file, which is all it is for.
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}
