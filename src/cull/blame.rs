//! Blame the tenant (CONTRACT §15, `[culling] blame_tenants`): who a request is, for the
//! blame ledgers (resolved once per request by the gates from the key they read,
//! [`crate::gate::Caller`]), and the check loop's part. The rules are
//! [`portcullis_policy::cull::find_blamed`] (errors) and
//! [`portcullis_policy::cull::attributed_slow`] (latency).
//!
//! Identity is the request's tenant (CONTRACT §14: every key of a tenant is one identity);
//! with a tenants registry, every key it does not know is one identity too (invented keys
//! cannot each stay under the threshold); without one, the request's rate-limit key
//! (`[rate_limit] key`), unless its client address used [`MANY_KEYS`] or more keys in its
//! failing or slow requests of the window, then the address ([`KeySpread`]); without a
//! key, its client address. All hashed to 64 bits: raw keys are never kept or shown.
//! `portcullis_blamed_total{tenant}` is labelled with the tenant's name, `"unknown"` for
//! any other identity (each upstream's [`BlameNames`](crate::upstream::BlameNames)).
//!
//! Scope: per upstream (the key is limited for requests to the upstream it failed on), and
//! fleet-wide through the budget store (`BudgetStore::exchange_blame`); per instance
//! without Redis.
//!
//! [`MANY_KEYS`]: portcullis_policy::cull::MANY_KEYS

use std::net::IpAddr;

use portcullis_policy::balance::stable_hash;
use portcullis_policy::cull::{BlameLedger, KeySpread, SlowLedger, SpreadNote};

use crate::ratelimit::KeyOutcome;
use crate::tenants::TenantRt;

/// A request's blame identity before key rotation is seen through ([`noted`], [`current`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub id: u64,
    /// `id` is a raw key's (no tenants registry): the client address, whose identity
    /// ([`Identity::by_addr`]) stands for the key when the address rotates keys.
    rotating_from: Option<IpAddr>,
}

impl Identity {
    /// The client address's identity, for a raw key's: hashed only when asked (a failing
    /// or slow request, or one checked while some identity is blamed).
    pub fn by_addr(&self) -> Option<u64> {
        self.rotating_from.map(|ip| address_id(Some(ip)))
    }
}

/// The blame identity of a request (see the module doc) from its `[rate_limit]` key as
/// the gates read it; `None` for a key the rate limiter refuses anyway. `registry`: a
/// tenants registry is configured (then `tenant` is `None` for a key it does not know).
pub fn identity(
    tenant: Option<&TenantRt>,
    registry: bool,
    key: &KeyOutcome<'_>,
    client: Option<IpAddr>,
) -> Option<Identity> {
    if let Some(t) = tenant {
        return Some(Identity {
            id: stable_hash(&[b"tenant:", &t.ident]),
            rotating_from: None,
        });
    }
    match key {
        KeyOutcome::Key(_) if registry => Some(Identity {
            id: stable_hash(&[b"unknown-keys"]),
            rotating_from: None,
        }),
        KeyOutcome::Key(k) => Some(Identity {
            id: stable_hash(&[b"key:", k]),
            rotating_from: client,
        }),
        KeyOutcome::Missing => Some(Identity {
            id: address_id(client),
            rotating_from: None,
        }),
        KeyOutcome::TooLong | KeyOutcome::Duplicate | KeyOutcome::Invalid => None,
    }
}

/// The identity of a client address (`ip:` and its text form, written on the stack).
fn address_id(client: Option<IpAddr>) -> u64 {
    use std::io::Write;
    let mut buf = [0u8; 48];
    let mut cur = std::io::Cursor::new(&mut buf[..]);
    if let Some(ip) = client {
        let _ = write!(cur, "{ip}");
    }
    let n = usize::try_from(cur.position()).unwrap_or(0);
    stable_hash(&[b"ip:", &buf[..n]])
}

/// The identity to record a failing or slow request under: `who`'s, or its address's once
/// the address uses many keys (noted here; what the address's earlier keys recorded in
/// the ledgers is the address's from then on).
pub fn noted(
    spread: &KeySpread,
    ledgers: (&BlameLedger, &SlowLedger),
    who: Identity,
    now_secs: u64,
    window_secs: u64,
) -> u64 {
    let Some(addr) = who.by_addr() else {
        return who.id;
    };
    match spread.note(now_secs, window_secs, addr, who.id) {
        SpreadNote::Few => who.id,
        SpreadNote::Many => addr,
        SpreadNote::Became(keys) => {
            ledgers.0.merge(&keys, addr);
            ledgers.1.merge(&keys, addr);
            addr
        }
    }
}

/// The identity a request is limited under while some identity is blamed: `who`'s, or
/// its address's when the address uses many keys.
pub fn current(spread: &KeySpread, who: Identity, now_secs: u64, window_secs: u64) -> u64 {
    who.by_addr()
        .filter(|addr| spread.many(now_secs, window_secs, *addr))
        .unwrap_or(who.id)
}

/// A short, stable, non-reversible tag of a key for logs and the journal.
pub fn tag(key: u64) -> String {
    format!("#{:08x}", key >> 32)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use portcullis_policy::cull::MANY_KEYS;

    #[test]
    fn an_address_is_hashed_as_its_text() {
        let ip: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(
            address_id(Some(ip)),
            stable_hash(&[b"ip:", ip.to_string().as_bytes()])
        );
        assert_eq!(address_id(None), stable_hash(&[b"ip:", b""]));
        let longest: IpAddr = "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255"
            .parse()
            .unwrap();
        assert_eq!(
            address_id(Some(longest)),
            stable_hash(&[b"ip:", longest.to_string().as_bytes()])
        );
    }

    #[test]
    fn keys_are_one_identity_with_a_registry_and_rotation_becomes_the_address() {
        let ip: IpAddr = "10.0.0.7".parse().unwrap();
        let with_key = |k: &'static str| KeyOutcome::Key(k.as_bytes().into());
        // With a registry, two unknown keys are one identity.
        let a = identity(None, true, &with_key("a"), Some(ip)).unwrap();
        let b = identity(None, true, &with_key("b"), Some(ip)).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.by_addr(), None);
        // Without, each key is its own, until its address rotates keys.
        let spread = KeySpread::default();
        let ledger = BlameLedger::default();
        let slow = SlowLedger::default();
        let addr = address_id(Some(ip));
        let mut ids = Vec::new();
        for k in ["k1", "k2", "k3", "k4", "k5"] {
            let who = identity(None, false, &with_key(k), Some(ip)).unwrap();
            assert_eq!(who.by_addr(), Some(addr));
            let limited_as = if ids.len() < MANY_KEYS { who.id } else { addr };
            assert_eq!(current(&spread, who, 100, 10), limited_as);
            let id = noted(&spread, (&ledger, &slow), who, 100, 10);
            ledger.record(100, 10, id, "127.0.0.1:1".parse().unwrap());
            ids.push(id);
        }
        assert!(ids[..3].iter().all(|id| *id != addr));
        assert_eq!(&ids[3..], &[addr, addr]);
        // The first three keys' records are the address's now.
        let s = ledger.snapshot(100, 10);
        assert_eq!(s.len(), 1);
        assert_eq!(s[&addr].values().sum::<u64>(), 5);
        // A new key from that address is limited as the address.
        let who = identity(None, false, &with_key("k9"), Some(ip)).unwrap();
        assert_eq!(current(&spread, who, 101, 10), addr);
        // No key: the address, as before.
        let none = identity(None, false, &KeyOutcome::Missing, Some(ip)).unwrap();
        assert_eq!(none.id, addr);
    }
}
