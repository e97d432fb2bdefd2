//! Blame the tenant (CONTRACT §15, `[culling] blame_tenants`): when one key's requests
//! cause most of a backend's errors on two or more backends while other keys succeed
//! there, the key is the cause (a poison tenant), not the backends. The key is limited
//! (429) for `cooldown_seconds` and its errors are taken out of what culling judges, so no
//! backend is culled for them.
//!
//! # Rule ([`find_blamed`])
//!
//! A key `k` is blamed when on at least [`MIN_BACKENDS`] backends `b`:
//! * `k` caused at least `min_errors` (the upstream's `error_threshold`) errors on `b`,
//! * and more than half of `b`'s errors in the window (`2 × errors(k, b) > errors(b)`),
//! * while other keys succeed on `b`: `b` answered at least [`MIN_OTHERS_OK`] requests
//!   without error, and the errors of all other keys are at most [`OTHERS_ERROR_SHARE`]
//!   (5 %) of the requests that were not `k`'s errors.
//!
//! # The ledger ([`BlameLedger`])
//!
//! Only errors are recorded per key (the success path costs nothing): per key, per
//! backend, an error count in two epochs of `window_seconds` (the current and the last),
//! so what is read covers between one and two windows. At most [`MAX_KEYS`] keys are
//! tracked per epoch and upstream; errors of further keys in a full epoch are not
//! attributed (they still count against their backend as usual). Keys are 64-bit hashes,
//! never the raw key.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Backends a key must be the main cause of errors on.
pub const MIN_BACKENDS: usize = 2;
/// Requests a backend must have answered without error for "other keys succeed there".
pub const MIN_OTHERS_OK: u64 = 10;
/// Largest share of errors the other keys may have on a backend the key is blamed on.
pub const OTHERS_ERROR_SHARE: f64 = 0.05;
/// Keys tracked per epoch and upstream.
pub const MAX_KEYS: usize = 4096;

type Epoch = HashMap<u64, HashMap<SocketAddr, u64>>;

#[derive(Debug, Default)]
struct Ledger {
    /// `now_secs / window_secs` of `cur`.
    epoch: u64,
    cur: Epoch,
    prev: Epoch,
}

/// Errors by key and backend over one to two windows. See the module doc.
#[derive(Debug, Default)]
pub struct BlameLedger {
    inner: Mutex<Ledger>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Ledger {
    fn roll(&mut self, now_secs: u64, window_secs: u64) {
        let epoch = now_secs / window_secs.max(1);
        if epoch == self.epoch {
            return;
        }
        if epoch == self.epoch + 1 {
            self.prev = std::mem::take(&mut self.cur);
        } else {
            // A gap of more than one epoch, or the clock went back: start over.
            self.prev.clear();
            self.cur.clear();
        }
        self.epoch = epoch;
    }
}

impl BlameLedger {
    /// One error of key `key` on `backend` at `now_secs`.
    pub fn record(&self, now_secs: u64, window_secs: u64, key: u64, backend: SocketAddr) {
        let mut l = lock(&self.inner);
        l.roll(now_secs, window_secs);
        if l.cur.len() >= MAX_KEYS && !l.cur.contains_key(&key) {
            return;
        }
        *l.cur.entry(key).or_default().entry(backend).or_insert(0) += 1;
    }

    /// Errors per key and backend, both epochs summed.
    pub fn snapshot(
        &self,
        now_secs: u64,
        window_secs: u64,
    ) -> HashMap<u64, HashMap<SocketAddr, u64>> {
        let mut l = lock(&self.inner);
        l.roll(now_secs, window_secs);
        let mut out = l.cur.clone();
        for (k, per) in &l.prev {
            let e = out.entry(*k).or_default();
            for (b, n) in per {
                *e.entry(*b).or_insert(0) += n;
            }
        }
        out
    }

    /// Forget a key's errors (it was blamed: they are accounted for).
    pub fn forget(&self, key: u64) {
        let mut l = lock(&self.inner);
        l.cur.remove(&key);
        l.prev.remove(&key);
    }
}

/// A blame as the fleet shares it: the key's hash, until when (Unix ms), and the errors
/// it caused per backend (`host:port`), so an instance that did not see them can still take
/// them out of the fleet's counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetBlame {
    pub key: u64,
    /// The instance that published it (a random id per process): counts of different
    /// instances add up, as the fleet's error counts do.
    pub from: u64,
    pub until_ms: u64,
    /// Blamed (limited); `false`: a suspect, whose errors are its own but which is not
    /// limited (yet): see [`attributed`].
    pub limit: bool,
    pub errors: Vec<(String, u64)>,
}

impl FleetBlame {
    /// The store's value: `until;L|S;backend=n,backend=n` (L: limited, S: suspect).
    pub fn encode_value(&self) -> String {
        let per: Vec<String> = self
            .errors
            .iter()
            .map(|(b, n)| format!("{b}={n}"))
            .collect();
        let kind = if self.limit { "L" } else { "S" };
        format!("{};{kind};{}", self.until_ms, per.join(","))
    }

    /// The store's field: `key:instance`, both in hex.
    pub fn encode_field(&self) -> String {
        format!("{:016x}:{:016x}", self.key, self.from)
    }

    /// A field and value as [`FleetBlame::encode_field`] and
    /// [`FleetBlame::encode_value`] wrote them.
    pub fn decode_entry(field: &str, value: &str) -> Option<Self> {
        let (key, from) = field.split_once(':')?;
        let mut b = Self::decode(u64::from_str_radix(key, 16).ok()?, value)?;
        b.from = u64::from_str_radix(from, 16).ok()?;
        Some(b)
    }

    /// The inverse of [`FleetBlame::encode_value`] (`None` for anything else).
    pub fn decode(key: u64, value: &str) -> Option<Self> {
        let (until, rest) = value.split_once(';')?;
        let (kind, per) = rest.split_once(';')?;
        let limit = match kind {
            "L" => true,
            "S" => false,
            _ => return None,
        };
        let errors = per
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (b, n) = p.rsplit_once('=')?;
                Some((b.to_string(), n.parse().ok()?))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            key,
            from: 0,
            until_ms: until.parse().ok()?,
            limit,
            errors,
        })
    }
}

/// One backend's window, for [`find_blamed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendCounts {
    pub addr: SocketAddr,
    pub requests: u64,
    pub errors: u64,
}

/// A key found to cause the errors, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blamed {
    pub key: u64,
    /// The backends it was the main cause of errors on, with its errors there.
    pub backends: Vec<(SocketAddr, u64)>,
}

impl Blamed {
    pub fn errors(&self) -> u64 {
        self.backends.iter().map(|(_, n)| n).sum()
    }
}

/// The keys to blame. See the module doc.
pub fn find_blamed(
    ledger: &HashMap<u64, HashMap<SocketAddr, u64>>,
    backends: &[BackendCounts],
    min_errors: u64,
) -> Vec<Blamed> {
    attributed(ledger, backends, min_errors)
        .into_iter()
        .filter(|b| b.backends.len() >= MIN_BACKENDS)
        .collect()
}

/// Every key that is the main cause of errors on at least one backend while other keys
/// succeed there (the per-backend part of the rule), with those backends. On those
/// backends the errors are the key's, not the backend's: culling does not count them even
/// before the key is blamed on a second backend (or when it never is).
pub fn attributed(
    ledger: &HashMap<u64, HashMap<SocketAddr, u64>>,
    backends: &[BackendCounts],
    min_errors: u64,
) -> Vec<Blamed> {
    let min_errors = min_errors.max(1);
    let mut out: Vec<Blamed> = Vec::new();
    for (key, per) in ledger {
        let mut on: Vec<(SocketAddr, u64)> = Vec::new();
        for b in backends {
            let mine = per.get(&b.addr).copied().unwrap_or(0).min(b.errors);
            if mine < min_errors || 2 * mine <= b.errors {
                continue;
            }
            let ok = b.requests.saturating_sub(b.errors);
            let others_errors = b.errors - mine;
            let others_requests = b.requests.saturating_sub(mine);
            if ok >= MIN_OTHERS_OK
                && others_errors as f64 <= OTHERS_ERROR_SHARE * others_requests as f64
            {
                on.push((b.addr, mine));
            }
        }
        if !on.is_empty() {
            on.sort();
            out.push(Blamed {
                key: *key,
                backends: on,
            });
        }
    }
    out.sort_by(|a, b| b.errors().cmp(&a.errors()).then(a.key.cmp(&b.key)));
    out
}

/// The keys limited now, until when (Unix ms). The request path reads one atomic flag
/// while nothing is blamed.
#[derive(Debug, Default)]
pub struct BlameList {
    any: AtomicBool,
    until: Mutex<HashMap<u64, u64>>,
}

impl BlameList {
    /// Limit `key` until `until_ms`.
    pub fn blame(&self, key: u64, until_ms: u64) {
        let mut m = lock(&self.until);
        let e = m.entry(key).or_insert(0);
        *e = (*e).max(until_ms);
        self.any.store(true, Ordering::Release);
    }

    /// Whether `key` is limited at `now_ms`: the seconds left (at least 1).
    #[inline]
    pub fn limited(&self, key: u64, now_ms: u64) -> Option<u64> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let until = *lock(&self.until).get(&key)?;
        (now_ms < until).then(|| (until - now_ms).div_ceil(1000).max(1))
    }

    /// Drop the keys whose time is over; the number still limited.
    pub fn expire(&self, now_ms: u64) -> usize {
        let mut m = lock(&self.until);
        m.retain(|_, until| *until > now_ms);
        self.any.store(!m.is_empty(), Ordering::Release);
        m.len()
    }

    /// Whether any key is limited (one atomic load).
    #[inline]
    pub fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    pub fn len(&self) -> usize {
        lock(&self.until).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn a(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn counts(port: u16, requests: u64, errors: u64) -> BackendCounts {
        BackendCounts {
            addr: a(port),
            requests,
            errors,
        }
    }

    fn ledger(entries: &[(u64, u16, u64)]) -> HashMap<u64, HashMap<SocketAddr, u64>> {
        let mut m: HashMap<u64, HashMap<SocketAddr, u64>> = HashMap::new();
        for (k, p, n) in entries {
            m.entry(*k).or_default().insert(a(*p), *n);
        }
        m
    }

    #[test]
    fn a_poison_key_failing_everywhere_while_others_succeed_is_blamed() {
        let l = ledger(&[(7, 1, 20), (7, 2, 18), (7, 3, 22), (9, 1, 1)]);
        let b = [counts(1, 200, 21), counts(2, 200, 18), counts(3, 200, 22)];
        let got = find_blamed(&l, &b, 5);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].key, 7);
        assert_eq!(got[0].backends.len(), 3);
        assert_eq!(got[0].errors(), 60);
    }

    #[test]
    fn one_backend_is_not_enough_to_blame_but_the_errors_are_the_keys() {
        let l = ledger(&[(7, 1, 20), (7, 2, 2)]);
        let b = [counts(1, 200, 20), counts(2, 200, 2), counts(3, 200, 0)];
        assert!(find_blamed(&l, &b, 5).is_empty());
        let a = attributed(&l, &b, 5);
        assert_eq!(a.len(), 1);
        assert_eq!(
            a[0].backends,
            vec![(SocketAddr::from(([127, 0, 0, 1], 1)), 20)]
        );
    }

    #[test]
    fn a_backend_failing_for_everyone_blames_no_key() {
        // Key 7 has many errors, but the backends fail for the other keys too.
        let l = ledger(&[(7, 1, 20), (7, 2, 20)]);
        let b = [counts(1, 100, 60), counts(2, 100, 60)];
        assert!(find_blamed(&l, &b, 5).is_empty());
        // ... or serve nobody else.
        let b = [counts(1, 25, 20), counts(2, 25, 20)];
        assert!(find_blamed(&l, &b, 5).is_empty());
    }

    #[test]
    fn not_most_of_the_errors_or_too_few_is_not_blamed() {
        // Half of the errors is not most.
        let l = ledger(&[(7, 1, 5), (7, 2, 5), (8, 1, 5), (8, 2, 5)]);
        let b = [counts(1, 400, 10), counts(2, 400, 10)];
        assert!(find_blamed(&l, &b, 5).is_empty());
        // Under the threshold.
        let l = ledger(&[(7, 1, 4), (7, 2, 4)]);
        let b = [counts(1, 400, 4), counts(2, 400, 4)];
        assert!(find_blamed(&l, &b, 5).is_empty());
    }

    #[test]
    fn the_ledger_keeps_one_to_two_windows_and_survives_clock_jumps() {
        let l = BlameLedger::default();
        let w = 10;
        let t = 1_000;
        for _ in 0..3 {
            l.record(t, w, 7, a(1));
        }
        l.record(t + 10, w, 7, a(2));
        let s = l.snapshot(t + 10, w);
        assert_eq!((s[&7][&a(1)], s[&7][&a(2)]), (3, 1));
        // Two epochs on, the first is gone.
        let s = l.snapshot(t + 20, w);
        assert_eq!(s[&7].get(&a(1)), None);
        assert_eq!(s[&7][&a(2)], 1);
        // The clock far ahead, or back: everything is forgotten, nothing panics.
        assert!(l.snapshot(t + 10_000, w).is_empty());
        l.record(t + 10_000, w, 7, a(1));
        assert!(l.snapshot(t, w).is_empty());
        l.record(t, w, 9, a(1));
        l.forget(9);
        assert!(l.snapshot(t, w).is_empty());
    }

    #[test]
    fn the_ledger_is_bounded() {
        let l = BlameLedger::default();
        for k in 0..(MAX_KEYS as u64 + 100) {
            l.record(5, 10, k, a(1));
        }
        l.record(5, 10, 0, a(1));
        let s = l.snapshot(5, 10);
        assert_eq!(s.len(), MAX_KEYS);
        assert_eq!(s[&0][&a(1)], 2);
    }

    #[test]
    fn a_fleet_blame_round_trips_through_its_value() {
        let mut b = FleetBlame {
            key: 7,
            from: 0,
            until_ms: 1_700_000_000_000,
            limit: true,
            errors: vec![("127.0.0.1:1".into(), 20), ("[::1]:2".into(), 3)],
        };
        assert_eq!(FleetBlame::decode(7, &b.encode_value()), Some(b.clone()));
        b.limit = false;
        assert_eq!(FleetBlame::decode(7, &b.encode_value()), Some(b.clone()));
        let c = FleetBlame {
            from: 0xabc,
            ..b.clone()
        };
        assert_eq!(
            FleetBlame::decode_entry(&c.encode_field(), &c.encode_value()),
            Some(c)
        );
        assert_eq!(FleetBlame::decode_entry("7", "5;S;"), None);
        assert_eq!(FleetBlame::decode(7, "junk"), None);
        assert_eq!(FleetBlame::decode(7, "5;L;a=x"), None);
        assert_eq!(FleetBlame::decode(7, "5;X;"), None);
        assert_eq!(
            FleetBlame::decode(7, "5;S;").map(|b| b.errors.len()),
            Some(0)
        );
    }

    #[test]
    fn the_list_limits_until_the_cooldown_ends() {
        let list = BlameList::default();
        assert_eq!(list.limited(7, 0), None);
        list.blame(7, 60_000);
        assert_eq!(list.limited(7, 0), Some(60));
        assert_eq!(list.limited(7, 59_500), Some(1));
        assert_eq!(list.limited(8, 0), None);
        assert_eq!(list.limited(7, 60_000), None);
        assert_eq!(list.expire(60_000), 0);
        assert!(list.is_empty());
    }
}
