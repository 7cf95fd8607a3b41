//! Concurrency caps: at most `max_in_flight` leases held on a key, each until it is
//! released or expires. Pure: the stored leases in, the answer and the leases to store out.
//!
//! A lease counts while `expires_at > now`, so an expired lease stops counting at once,
//! with no sweep needed for correctness.

use crate::units::MAX_WAIT_MS;

/// Largest `max_in_flight`, which bounds the leases one key stores and so what one call
/// rewrites: at most this many leases of about 60 bytes each.
pub const MAX_IN_FLIGHT: i64 = 1_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Numbered per key from 1, so that two leases of one key never share an id.
    pub seq: i64,
    pub issued_at: i64,
    pub expires_at: i64,
    /// 64 random bits in the id: only the caller the id was handed to can release or renew
    /// the lease (0 in a lease stored before ids carried one, whose id has none).
    pub secret: u64,
}

impl Lease {
    /// The id callers hold: opaque to them, unique per key (the issue time keeps an id
    /// from before the row was swept or reset from naming a later lease), and unguessable.
    pub fn id(&self) -> String {
        match self.secret {
            0 => format!("{}-{}", self.issued_at, self.seq),
            secret => format!("{}-{}-{secret:016x}", self.issued_at, self.seq),
        }
    }

    fn is_held(&self, now: i64) -> bool {
        self.expires_at > now
    }
}

/// What a key stores: the leases still held when it was written, and the next number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leases {
    pub next_seq: i64,
    pub held: Vec<Lease>,
}

impl Default for Leases {
    fn default() -> Self {
        Leases { next_seq: 1, held: Vec::new() }
    }
}

impl Leases {
    fn held_at(&self, now: i64) -> impl Iterator<Item = &Lease> {
        self.held.iter().filter(move |l| l.is_held(now))
    }

    /// Unexpired leases at `now`.
    pub fn in_flight(&self, now: i64) -> i64 {
        self.held_at(now).count() as i64
    }

    /// The same leases without the expired ones.
    fn pruned(&self, now: i64) -> Leases {
        Leases { next_seq: self.next_seq, held: self.held_at(now).copied().collect() }
    }

    /// The held lease named `id` (as [`Lease::id`] writes it), found without writing ids.
    fn find(&self, id: &str, now: i64) -> Option<usize> {
        let mut parts = id.splitn(3, '-');
        let (issued_at, seq): (i64, i64) = (parts.next()?.parse().ok()?, parts.next()?.parse().ok()?);
        let held = self.held.iter().position(|l| l.is_held(now) && l.issued_at == issued_at && l.seq == seq)?;
        // the whole id, secret included, in the one form id() writes ("+5" or "05" name no lease)
        (self.held[held].id() == id).then_some(held)
    }

    /// When the last lease expires (the sweep removes the row from then on).
    pub fn empty_at(&self) -> i64 {
        self.held.iter().map(|l| l.expires_at).max().unwrap_or(0)
    }

    /// The stored text: `next_seq`, then `;seq:issued_at:expires_at:secret` per lease (the
    /// secret in hex; a lease stored without one has three fields).
    pub fn encode(&self) -> String {
        let mut out = self.next_seq.to_string();
        for l in &self.held {
            out.push_str(&format!(";{}:{}:{}:{:x}", l.seq, l.issued_at, l.expires_at, l.secret));
        }
        out
    }

    /// The leases of a stored text; None if it is not one [`Leases::encode`] writes.
    pub fn decode(text: &str) -> Option<Leases> {
        let mut parts = text.split(';');
        let next_seq = parts.next()?.parse().ok()?;
        let held = parts
            .map(|p| {
                let mut f = p.split(':');
                let mut number = || f.next()?.parse::<i64>().ok();
                let (seq, issued_at, expires_at) = (number()?, number()?, number()?);
                let secret = match f.next() {
                    None => 0,
                    Some(hex) if !hex.is_empty() && hex.len() <= 16 => u64::from_str_radix(hex, 16).ok()?,
                    Some(_) => return None,
                };
                f.next().is_none().then_some(Lease { seq, issued_at, expires_at, secret })
            })
            .collect::<Option<Vec<Lease>>>()?;
        Some(Leases { next_seq, held })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireDecision {
    pub admitted: bool,
    /// The new lease, when admitted.
    pub lease: Option<Lease>,
    /// Leases held after the call.
    pub in_flight: i64,
    pub limit: i64,
    /// Until enough leases expire (they may be released sooner); 0 when admitted.
    pub retry_after_ms: i64,
    /// Some exactly when admitted: the leases to store.
    pub new_state: Option<Leases>,
}

/// The one question of a cap: hold one more lease, for `lease_ms`, now?
pub fn acquire(state: &Leases, max_in_flight: i64, lease_ms: i64, now: i64) -> AcquireDecision {
    let mut held = state.pruned(now);
    let count = held.held.len() as i64;
    if count < max_in_flight {
        let secret = crate::units::random_u64().max(1);
        let lease = Lease { seq: held.next_seq, issued_at: now, expires_at: now + lease_ms, secret };
        held.next_seq += 1;
        held.held.push(lease);
        return AcquireDecision {
            admitted: true,
            lease: Some(lease),
            in_flight: count + 1,
            limit: max_in_flight,
            retry_after_ms: 0,
            new_state: Some(held),
        };
    }
    // A cap lowered below what is held needs several leases to go: wait for the one that
    // brings the count under it.
    let mut expiries: Vec<i64> = held.held.iter().map(|l| l.expires_at).collect();
    expiries.sort_unstable();
    let freeing = expiries[(count - max_in_flight) as usize];
    AcquireDecision {
        admitted: false,
        lease: None,
        in_flight: count,
        limit: max_in_flight,
        retry_after_ms: (freeing - now).clamp(1, MAX_WAIT_MS),
        new_state: None,
    }
}

/// Gives lease `id` back: whether it was held, and the leases to store if it was.
pub fn release(state: &Leases, id: &str, now: i64) -> (bool, Option<Leases>) {
    match state.find(id, now) {
        None => (false, None),
        Some(i) => {
            let mut rest = state.clone();
            rest.held.remove(i);
            (true, Some(rest.pruned(now)))
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewDecision {
    pub renewed: bool,
    pub expires_at: Option<i64>,
    pub new_state: Option<Leases>,
}

/// Makes a held lease expire `lease_ms` from now; a lease no longer held stays gone.
pub fn renew(state: &Leases, id: &str, lease_ms: i64, now: i64) -> RenewDecision {
    match state.find(id, now) {
        None => RenewDecision { renewed: false, expires_at: None, new_state: None },
        Some(i) => {
            let mut renewed = state.clone();
            renewed.held[i].expires_at = now + lease_ms;
            let expires_at = renewed.held[i].expires_at;
            RenewDecision { renewed: true, expires_at: Some(expires_at), new_state: Some(renewed.pruned(now)) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_expiry_release_and_renewal() {
        let mut s = Leases::default();
        let a = acquire(&s, 2, 1_000, 0);
        let first = a.lease.unwrap().id();
        assert!(a.admitted && a.in_flight == 1 && first.starts_with("0-1-") && first.len() == 4 + 16, "{first}");
        s = a.new_state.unwrap();
        let b = acquire(&s, 2, 1_000, 10);
        let second = b.lease.unwrap().id();
        s = b.new_state.unwrap();
        let refused = acquire(&s, 2, 1_000, 20);
        assert_eq!((refused.admitted, refused.in_flight, refused.retry_after_ms), (false, 2, 980));
        assert!(acquire(&s, 2, 1_000, 1_000).admitted, "the first lease expired at exactly 1000");
        assert!(!acquire(&s, 2, 1_000, 999).admitted);
        assert_eq!(acquire(&s, 1, 1_000, 20).retry_after_ms, 990, "a lowered cap waits for two");

        // the number and time alone, or another secret, name no lease
        for guess in ["0-1", "0-1-0000000000000000", "0-1-", &first[..first.len() - 1], &format!("{first}0")] {
            assert_eq!(release(&s, guess, 500), (false, None), "{guess}");
            assert!(!renew(&s, guess, 5_000, 500).renewed, "{guess}");
        }
        let r = renew(&s, &first, 5_000, 500);
        assert_eq!(r.expires_at, Some(5_500));
        s = r.new_state.unwrap();
        assert_eq!(s.in_flight(2_000), 1);
        let (released, rest) = release(&s, &first, 600);
        assert!(released);
        s = rest.unwrap();
        assert_eq!(release(&s, &first, 600), (false, None), "true once");
        assert_eq!(release(&s, &second, 1_010), (false, None), "expired");
        assert_eq!(release(&s, "nonsense", 0), (false, None));
        assert!(!renew(&s, &second, 1_000, 1_010).renewed);
    }

    /// A lease stored before ids carried a secret keeps its old id.
    #[test]
    fn a_lease_without_a_secret_keeps_its_id() {
        let s = Leases::decode("2;1:5:9000").unwrap();
        assert_eq!(s.held[0].id(), "5-1");
        assert!(release(&s, "5-1", 10).0);
        assert!(!release(&s, "5-1-0", 10).0);
    }

    #[test]
    fn text_round_trips_and_damage_is_refused() {
        let s = Leases { next_seq: 3, held: vec![Lease { seq: 2, issued_at: 5, expires_at: 9, secret: 0xab }] };
        assert_eq!(s.encode(), "3;2:5:9:ab");
        assert_eq!(Leases::decode(&s.encode()), Some(s));
        assert_eq!(Leases::decode("1"), Some(Leases::default()));
        for bad in ["", "x", "1;2:3", "1;2:3:4:5:6", "1;a:b:c", "1;2:3:4:", "1;2:3:4:xyz", "1;2:3:4:11112222333344445"]
        {
            assert_eq!(Leases::decode(bad), None, "{bad}");
        }
    }
}
