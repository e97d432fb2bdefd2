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

    /// Count what keys `from` recorded as `into`'s (they turned out to be one identity:
    /// [`KeySpread`]).
    pub fn merge(&self, from: &[u64], into: u64) {
        let mut guard = lock(&self.inner);
        let l = &mut *guard;
        for epoch in [&mut l.cur, &mut l.prev] {
            merge_into(epoch, from, into);
        }
    }
}

/// Slow answers by key and backend (`blame_tenants` with the latency rule), in the same
/// time slices as the backends' [`crate::cull::LatencyWindow`]s, so that what a read
/// counts of a key is within what the latency window it is compared with holds (a ledger
/// of whole windows could still count a key's slow answers of the window before, and
/// excuse a backend that is now slow for the other keys). At most [`MAX_KEYS`] keys per
/// slice; slices outside the read are dropped as the clock moves on (or back).
#[derive(Debug, Default)]
pub struct SlowLedger {
    /// `(slice unit, answers by key and backend)`, at most one per unit of the read.
    inner: Mutex<Vec<(u64, Epoch)>>,
}

impl SlowLedger {
    /// One slow answer of `key` on `backend` at `now_secs`, in slices of `slice_secs`.
    pub fn record(&self, now_secs: u64, slice_secs: u64, key: u64, backend: SocketAddr) {
        let (first, last) = crate::cull::read_units(now_secs, slice_secs);
        let mut slices = lock(&self.inner);
        slices.retain(|(u, _)| (first..=last).contains(u));
        let at = match slices.iter().position(|(u, _)| *u == last) {
            Some(i) => i,
            None => {
                slices.push((last, Epoch::new()));
                slices.len() - 1
            }
        };
        let epoch = &mut slices[at].1;
        if epoch.len() >= MAX_KEYS && !epoch.contains_key(&key) {
            return;
        }
        *epoch.entry(key).or_default().entry(backend).or_insert(0) += 1;
    }

    /// Slow answers per key and backend over the slices a latency window reads at
    /// `now_secs`.
    pub fn snapshot(&self, now_secs: u64, slice_secs: u64) -> Epoch {
        let (first, last) = crate::cull::read_units(now_secs, slice_secs);
        let slices = lock(&self.inner);
        let mut out = Epoch::new();
        for (_, e) in slices.iter().filter(|(u, _)| (first..=last).contains(u)) {
            for (k, per) in e {
                let to = out.entry(*k).or_default();
                for (b, n) in per {
                    *to.entry(*b).or_insert(0) += n;
                }
            }
        }
        out
    }

    /// As [`BlameLedger::merge`].
    pub fn merge(&self, from: &[u64], into: u64) {
        let mut slices = lock(&self.inner);
        for (_, epoch) in slices.iter_mut() {
            merge_into(epoch, from, into);
        }
    }
}

fn merge_into(epoch: &mut Epoch, from: &[u64], into: u64) {
    for key in from.iter().filter(|k| **k != into) {
        let Some(per) = epoch.remove(key) else {
            continue;
        };
        let to = epoch.entry(into).or_default();
        for (b, n) in per {
            *to.entry(b).or_insert(0) += n;
        }
    }
}

/// Distinct keys one client address may use before the address is the identity.
pub const MANY_KEYS: usize = 4;

#[derive(Debug, Default, Clone, Copy)]
struct Keys {
    n: usize,
    keys: [u64; MANY_KEYS],
}

#[derive(Debug, Default)]
struct Spread {
    epoch: u64,
    cur: HashMap<u64, Keys>,
    prev: HashMap<u64, Keys>,
}

/// Keys per client address, to see through key rotation where no tenants registry says
/// which keys are real: an address whose failing (or slow) requests carried
/// [`MANY_KEYS`] or more distinct keys in a window is one identity for blame, whatever
/// key it sends. Only the failing and slow requests are noted (the success path costs
/// nothing); per address the first [`MANY_KEYS`] keys (64-bit hashes), at most
/// [`MAX_KEYS`] addresses per epoch, two epochs of `window_seconds` as in [`BlameLedger`].
#[derive(Debug, Default)]
pub struct KeySpread {
    inner: Mutex<Spread>,
    /// Some address uses many keys (in either epoch): [`KeySpread::many`] reads this one
    /// atomic flag, without the lock, while none does.
    flagged: AtomicBool,
}

/// What [`KeySpread::note`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpreadNote {
    /// The address uses few keys: the key is the identity.
    Few,
    /// The address uses many keys: it is the identity.
    Many,
    /// This key made it many: these keys' records are the address's from now on.
    Became([u64; MANY_KEYS]),
}

impl Spread {
    fn roll(&mut self, now_secs: u64, window_secs: u64) {
        let epoch = now_secs / window_secs.max(1);
        if epoch == self.epoch {
            return;
        }
        if epoch == self.epoch + 1 {
            self.prev = std::mem::take(&mut self.cur);
        } else {
            self.prev.clear();
            self.cur.clear();
        }
        self.epoch = epoch;
    }

    fn many(&self, addr: u64) -> bool {
        [&self.cur, &self.prev]
            .iter()
            .any(|e| e.get(&addr).is_some_and(|k| k.n >= MANY_KEYS))
    }

    fn any_many(&self) -> bool {
        [&self.cur, &self.prev]
            .iter()
            .any(|e| e.values().any(|k| k.n >= MANY_KEYS))
    }
}

impl KeySpread {
    /// A failing (or slow) request of `key` from `addr`, at `now_secs`.
    pub fn note(&self, now_secs: u64, window_secs: u64, addr: u64, key: u64) -> SpreadNote {
        let mut s = lock(&self.inner);
        self.roll(&mut s, now_secs, window_secs);
        if s.many(addr) {
            // Still rotating: it stays many in this epoch too (not only until the last
            // epoch's record leaves).
            if s.cur.get(&addr).is_none_or(|k| k.n < MANY_KEYS) && s.cur.len() < MAX_KEYS {
                let was = s.prev.get(&addr).copied().unwrap_or_default();
                s.cur.insert(addr, was);
            }
            return SpreadNote::Many;
        }
        if s.cur.len() >= MAX_KEYS && !s.cur.contains_key(&addr) {
            return SpreadNote::Few;
        }
        let k = s.cur.entry(addr).or_default();
        if k.keys[..k.n].contains(&key) {
            return SpreadNote::Few;
        }
        k.keys[k.n] = key;
        k.n += 1;
        if k.n < MANY_KEYS {
            return SpreadNote::Few;
        }
        let keys = k.keys;
        self.flagged.store(true, Ordering::Release);
        SpreadNote::Became(keys)
    }

    fn roll(&self, s: &mut Spread, now_secs: u64, window_secs: u64) {
        let epoch = s.epoch;
        s.roll(now_secs, window_secs);
        if s.epoch != epoch {
            self.flagged.store(s.any_many(), Ordering::Release);
        }
    }

    /// Whether `addr` uses many keys at `now_secs` (a request's identity while some key
    /// is blamed).
    pub fn many(&self, now_secs: u64, window_secs: u64, addr: u64) -> bool {
        if !self.flagged.load(Ordering::Acquire) {
            return false;
        }
        let mut s = lock(&self.inner);
        self.roll(&mut s, now_secs, window_secs);
        s.many(addr)
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

/// Answers a backend needs in the window, not slow, for "other keys are fast there".
pub const MIN_OTHERS_FAST: u64 = 10;
/// Largest share of slow answers the other keys may have on a backend a key's slow
/// answers are taken out of: a p90 over the line needs more than 10 % over it, so at this
/// share the others alone never make the backend a latency outlier.
pub const OTHERS_SLOW_SHARE: f64 = 0.10;

/// One backend's latency window, for [`attributed_slow`]: its answers, and how many were
/// over the line ([`crate::cull::slow_line_us`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlowCounts {
    pub addr: SocketAddr,
    pub answers: u64,
    pub slow: u64,
}

/// Blame for latency (`blame_tenants` with `outlier = "latency"`): every key whose slow
/// answers (`ledger`: answers over the line, per key and backend) are the cause of a
/// backend's slowness while other keys are fast there, with those backends: on `b`, the
/// key made at least `min_slow` of the slow answers and more than half of them, `b` gave
/// at least [`MIN_OTHERS_FAST`] answers that were not slow, and the others' slow answers
/// are at most [`OTHERS_SLOW_SHARE`] of theirs. A key that is slow on every backend it
/// reaches is found on each; its slow answers are its own (taken out of what the latency
/// rule judges). A backend slow for every key is found for none.
pub fn attributed_slow(
    ledger: &HashMap<u64, HashMap<SocketAddr, u64>>,
    backends: &[SlowCounts],
    min_slow: u64,
) -> Vec<Blamed> {
    let min_slow = min_slow.max(1);
    let mut out: Vec<Blamed> = Vec::new();
    for (key, per) in ledger {
        let mut on: Vec<(SocketAddr, u64)> = Vec::new();
        for b in backends {
            let mine = per.get(&b.addr).copied().unwrap_or(0).min(b.slow);
            if mine < min_slow || 2 * mine <= b.slow {
                continue;
            }
            let fast = b.answers.saturating_sub(b.slow);
            let others_slow = b.slow - mine;
            let others = b.answers.saturating_sub(mine);
            if fast >= MIN_OTHERS_FAST && others_slow as f64 <= OTHERS_SLOW_SHARE * others as f64 {
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

    fn slow(port: u16, answers: u64, slow: u64) -> SlowCounts {
        SlowCounts {
            addr: a(port),
            answers,
            slow,
        }
    }

    #[test]
    fn a_key_slow_where_others_are_fast_has_its_slow_answers_taken_out() {
        // Key 7 made 60 of backend 1's 64 slow answers; the others' 4 of 236 are < 10 %.
        let l = ledger(&[(7, 1, 60), (9, 1, 4)]);
        let b = [slow(1, 300, 64), slow(2, 300, 3), slow(3, 300, 2)];
        let got = attributed_slow(&l, &b, 5);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].key, 7);
        assert_eq!(got[0].backends, vec![(a(1), 60)]);
        // A key slow on two backends is found on both.
        let l = ledger(&[(7, 1, 30), (7, 2, 30)]);
        let b = [slow(1, 300, 30), slow(2, 300, 31), slow(3, 300, 0)];
        assert_eq!(attributed_slow(&l, &b, 5)[0].backends.len(), 2);
    }

    #[test]
    fn a_backend_slow_for_everyone_is_not_excused_by_a_key() {
        // Backend 1 is slow for the other keys too (40 of 240 others: 17 %).
        let l = ledger(&[(7, 1, 60)]);
        let b = [slow(1, 300, 100), slow(2, 300, 3), slow(3, 300, 2)];
        assert!(attributed_slow(&l, &b, 5).is_empty());
        // The only key there: nobody is fast on it.
        let b = [slow(1, 60, 60), slow(2, 300, 3), slow(3, 300, 2)];
        assert!(attributed_slow(&l, &b, 5).is_empty());
        // Under the threshold, or not most of the slow answers.
        let l = ledger(&[(7, 1, 4)]);
        let b = [slow(1, 300, 4), slow(2, 300, 3)];
        assert!(attributed_slow(&l, &b, 5).is_empty());
        let l = ledger(&[(7, 1, 10), (8, 1, 10)]);
        let b = [slow(1, 300, 20), slow(2, 300, 3)];
        assert!(attributed_slow(&l, &b, 5).is_empty());
    }

    #[test]
    fn an_address_using_many_keys_becomes_the_identity() {
        let s = KeySpread::default();
        let (w, t, ip) = (10, 1_000, 42);
        assert_eq!(s.note(t, w, ip, 1), SpreadNote::Few);
        assert_eq!(s.note(t, w, ip, 1), SpreadNote::Few, "the same key again");
        assert_eq!(s.note(t, w, ip, 2), SpreadNote::Few);
        assert_eq!(s.note(t, w, ip, 3), SpreadNote::Few);
        assert!(!s.many(t, w, ip));
        assert_eq!(s.note(t, w, ip, 4), SpreadNote::Became([1, 2, 3, 4]));
        assert_eq!(s.note(t, w, ip, 5), SpreadNote::Many);
        assert!(s.many(t, w, ip) && !s.many(t, w, 43));
        // Kept through the next window, forgotten after two.
        assert!(s.many(t + 10, w, ip));
        assert!(!s.many(t + 20, w, ip));
        assert!(
            !s.flagged.load(Ordering::Relaxed),
            "nothing flagged: no lock to read"
        );
        // Still rotating in the next window: still many, and the window after.
        assert_eq!(s.note(t + 30, w, ip, 1), SpreadNote::Few);
        for k in 2..=4 {
            s.note(t + 30, w, ip, k);
        }
        assert_eq!(s.note(t + 40, w, ip, 9), SpreadNote::Many);
        assert!(s.many(t + 50, w, ip));
        // Another address's keys are its own.
        assert_eq!(s.note(t + 20, w, 43, 1), SpreadNote::Few);
    }

    #[test]
    fn the_slow_ledger_reads_the_latency_windows_slices() {
        let l = SlowLedger::default();
        let slice = crate::cull::latency_slice_secs(60); // 10 s slices, 7 read
        let t = 1_000_000; // the start of a slice
        for s in 0..10 {
            l.record(t + s * slice, slice, 7, a(1));
        }
        // Read at the last record: that slice and the six before it.
        let now = t + 9 * slice;
        assert_eq!(l.snapshot(now, slice)[&7][&a(1)], 7);
        // What a latency window holds for the same times.
        let w = crate::cull::LatencyWindow::new(60);
        for s in 0..10 {
            w.record(t + s * slice, 400_000);
        }
        assert_eq!(w.summary(now).samples, 7);
        // Merged, and forgotten as the clock moves on or far back.
        l.merge(&[7], 9);
        assert_eq!(l.snapshot(now, slice)[&9][&a(1)], 7);
        assert!(l.snapshot(now + 100 * slice, slice).is_empty());
        l.record(t, slice, 7, a(1));
        assert_eq!(l.snapshot(t, slice)[&7][&a(1)], 1);
        assert!(!l.snapshot(now, slice).contains_key(&7));
    }

    #[test]
    fn merged_keys_count_as_one() {
        let l = BlameLedger::default();
        for k in [1, 2, 3] {
            for _ in 0..3 {
                l.record(5, 10, k, a(1));
            }
        }
        l.record(5, 10, 9, a(2));
        l.merge(&[1, 2, 3, 9], 9);
        let s = l.snapshot(5, 10);
        assert_eq!(s.len(), 1);
        assert_eq!((s[&9][&a(1)], s[&9][&a(2)]), (9, 1));
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
