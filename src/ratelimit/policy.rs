//! Several rate-limit policies per request (`[[rate_limit.policies]]`, CONTRACT §9), as
//! Envoy's descriptors and Kong's policies allow: per API key, per client IP and per route
//! (`path_prefix`) at once.
//!
//! * Each policy has its own [`Limiter`] (its own keys, window and limits); a named policy's
//!   keys are apart from every other policy's in memory and in the store
//!   ([`Limiter::for_policy`]). The `[rate_limit]` policy keeps its store keys.
//! * A request is checked against every policy whose `path_prefix` matches and whose key it
//!   carries (a named policy whose key the request lacks does not apply to it, as an Envoy
//!   descriptor that cannot be built is not sent; `[rate_limit]` keeps its `missing_key`).
//! * All must admit. Only then is the request counted, against each ([`Policies::decide`]):
//!   first every policy is asked without counting ([`Limiter::peek`]), then each counts it
//!   ([`Limiter::check`]). Should one refuse in between (another request took the last
//!   unit meanwhile), the admissions already counted for this request are taken back
//!   ([`Limiter::uncount`]), so a refused request never counts against any policy (except
//!   in the rare case a flush took such an admission in between: then it stays counted,
//!   erring on the side of the limit).
//! * A refusal names the refusing policy; when several refuse, the one that refuses
//!   longest (its `Retry-After` is when every policy admits again, as far as this one
//!   knows). An admitted response carries the fields of the policy with the fewest
//!   requests remaining.
//! * One flush carries every policy's deltas in one batch ([`super::flush`]): one store
//!   call per flush however many policies there are.

use std::sync::Arc;

use prometheus::{IntCounter, IntCounterVec};

use super::{FieldParts, KeySource};
use portcullis_policy::ratelimit::{Decision, Limiter};

/// What a policy limits by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyKey {
    /// A header, a query parameter or the bearer token (as `[rate_limit] key`).
    Source(KeySource),
    /// The client address (`key = "client_ip"`).
    ClientIp,
}

/// `portcullis_ratelimit_policy_decisions_total{policy,result}` of one policy, resolved
/// once per reload so the request path only increments.
#[derive(Debug, Clone)]
pub struct DecisionCounters {
    /// Admitted by every policy and counted against this one.
    pub allowed: IntCounter,
    /// Refused by this policy.
    pub limited: IntCounter,
    /// This policy would have admitted it, another refused it: not counted here.
    pub refused_by_other: IntCounter,
}

impl DecisionCounters {
    /// The counters of `policy` in `vec` (labels `policy`, `result`).
    pub fn of(vec: &IntCounterVec, policy: &str) -> Self {
        Self {
            allowed: vec.with_label_values(&[policy, "allowed"]),
            limited: vec.with_label_values(&[policy, "limited"]),
            refused_by_other: vec.with_label_values(&[policy, "refused_by_other"]),
        }
    }
}

/// One policy.
pub struct Policy {
    pub name: Arc<str>,
    pub key: PolicyKey,
    /// Requests whose path starts with this are checked (`""`: every request).
    pub path_prefix: String,
    pub window_secs: u64,
    pub limiter: Arc<Limiter>,
    pub counters: DecisionCounters,
    /// Its `RateLimit-Policy` and `RateLimit` field parts, made once per config.
    pub fields: Arc<FieldParts>,
    /// Shadow mode: decide and count, never refuse; `Some` holds its
    /// `portcullis_shadow_refusals_total{gate="rate_limit",policy}` (resolved per reload).
    pub shadow: Option<IntCounter>,
}

impl Policy {
    /// Whether a request for `path` is checked against this policy.
    #[inline]
    pub fn matches(&self, path: &str) -> bool {
        path.starts_with(self.path_prefix.as_str())
    }
}

/// Most `[[rate_limit.policies]]` entries a config may have.
pub const MAX_POLICIES: usize = 32;

/// Every policy of the running config: `list[0]` is `[rate_limit]` (checked only when
/// `default_enabled`), then `[[rate_limit.policies]]` in file order.
pub struct Policies {
    pub list: Vec<Policy>,
    pub default_enabled: bool,
}

/// The combined decision of [`Policies::decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combined {
    /// Every policy admitted and counted the request; `policy` (index in
    /// [`Policies::list`]) is the one with the fewest requests remaining.
    Admitted {
        policy: usize,
        limit: u64,
        remaining: u64,
        reset_secs: u64,
    },
    /// `policy` refused; nothing was counted.
    Refused {
        policy: usize,
        limit: u64,
        retry_after_secs: u64,
        reset_secs: u64,
    },
    /// Admitted with no enforcing policy applying (only policies in shadow mode): no
    /// `RateLimit` fields.
    Unlimited,
}

impl Combined {
    /// Policy `policy`'s own decision, as the combined one (a single policy).
    pub fn of(policy: usize, d: Decision) -> Self {
        match d {
            Decision::Allowed {
                limit,
                remaining,
                reset_secs,
            } => Combined::Admitted {
                policy,
                limit,
                remaining,
                reset_secs,
            },
            Decision::Limited {
                limit,
                retry_after_secs,
                reset_secs,
            } => Combined::Refused {
                policy,
                limit,
                retry_after_secs,
                reset_secs,
            },
        }
    }
}

impl Policies {
    /// The field parts of policy `i` (the `[rate_limit]` one for an index out of range).
    pub fn fields(&self, i: usize) -> Option<&FieldParts> {
        self.list.get(i).or(self.list.first()).map(|p| &*p.fields)
    }

    /// Every policy's limiter, `[rate_limit]`'s first (the flush set).
    pub fn limiters(&self) -> Vec<Arc<Limiter>> {
        self.list.iter().map(|p| Arc::clone(&p.limiter)).collect()
    }

    /// Decides a request carrying `keys`: (policy index, key) of every policy that applies
    /// to it, in policy order. Every enforcing policy must admit; only then is the request
    /// counted, against each. Counts every policy's decision in its [`DecisionCounters`].
    /// In-memory only.
    ///
    /// Policies in shadow mode are decided after the enforcing ones, each on its own: when
    /// the enforcing ones admit, a shadow policy counts the request if it would admit it
    /// and otherwise records a shadow refusal (its bit in `shadowed`), so its counts are
    /// what it would hold enforcing. A request the enforcing ones refuse is counted by none.
    pub fn decide(&self, keys: &[(usize, &[u8])], now_ms: u64, shadowed: &mut u64) -> Combined {
        let (refused, would_admit, any_shadow) = self.peek(keys, now_ms);
        if let Some(r) = refused {
            self.count_refused(keys, now_ms, would_admit);
            return r;
        }
        // Every enforcing policy would admit: count against each.
        let best = match self.commit(keys, now_ms) {
            Ok(best) => best,
            Err(refused) => return refused,
        };
        self.count_admitted(keys, now_ms, shadowed);
        debug_assert!(best.is_some() || any_shadow);
        best.unwrap_or(Combined::Unlimited)
    }

    /// Each enforcing policy's answer without counting: the refusal with the longest
    /// `Retry-After`, if any; which policies (by position in `keys`) would admit (policies
    /// are few, at most `MAX_POLICIES`; beyond 64 they are not counted as
    /// `refused_by_other`); and whether a shadow policy is among them.
    #[inline]
    fn peek(&self, keys: &[(usize, &[u8])], now_ms: u64) -> (Option<Combined>, u64, bool) {
        let mut refused: Option<Combined> = None;
        let mut would_admit = 0u64;
        let mut any_shadow = false;
        for (n, &(i, key)) in keys.iter().enumerate() {
            let p = &self.list[i];
            if p.shadow.is_some() {
                any_shadow = true;
                continue;
            }
            match p.limiter.peek(key, now_ms) {
                Decision::Allowed { .. } => would_admit |= 1u64.checked_shl(n as u32).unwrap_or(0),
                Decision::Limited {
                    limit,
                    retry_after_secs,
                    reset_secs,
                } => {
                    p.counters.limited.inc();
                    let longer = match refused {
                        Some(Combined::Refused {
                            retry_after_secs: r,
                            ..
                        }) => retry_after_secs > r,
                        _ => true,
                    };
                    if longer {
                        refused = Some(Combined::Refused {
                            policy: i,
                            limit,
                            retry_after_secs,
                            reset_secs,
                        });
                    }
                }
            }
        }
        (refused, would_admit, any_shadow)
    }

    /// A refused request, counted by the policies that would have admitted it
    /// (`refused_by_other`) and by the shadow policies as if they enforced too.
    #[inline]
    fn count_refused(&self, keys: &[(usize, &[u8])], now_ms: u64, would_admit: u64) {
        for (n, &(i, key)) in keys.iter().enumerate().take(64) {
            let p = &self.list[i];
            if p.shadow.is_some() {
                // As if it enforced too: refused by this one, or by another.
                match p.limiter.peek(key, now_ms) {
                    Decision::Allowed { .. } => p.counters.refused_by_other.inc(),
                    Decision::Limited { .. } => p.counters.limited.inc(),
                }
            } else if would_admit & (1 << n) != 0 {
                p.counters.refused_by_other.inc();
            }
        }
    }

    /// Count the request against each enforcing policy: `Ok` with the tightest admission
    /// (`None`: only shadow policies), or `Err` with the refusal of a policy whose last
    /// unit another request took since the peek (this request's admissions taken back).
    #[inline]
    fn commit(&self, keys: &[(usize, &[u8])], now_ms: u64) -> Result<Option<Combined>, Combined> {
        let mut best: Option<Combined> = None;
        for (n, &(i, key)) in keys.iter().enumerate() {
            let p = &self.list[i];
            if p.shadow.is_some() {
                continue;
            }
            match Combined::of(i, p.limiter.check(key, now_ms)) {
                c @ Combined::Admitted { remaining, .. } => {
                    let tighter = match best {
                        Some(Combined::Admitted { remaining: r, .. }) => remaining < r,
                        _ => true,
                    };
                    if tighter {
                        best = Some(c);
                    }
                }
                refused @ Combined::Refused { .. } => {
                    for &(j, k) in &keys[..n] {
                        if self.list[j].shadow.is_none() {
                            self.list[j].limiter.uncount(k, now_ms);
                            self.list[j].counters.refused_by_other.inc();
                        }
                    }
                    p.counters.limited.inc();
                    return Err(refused);
                }
                Combined::Unlimited => {}
            }
        }
        Ok(best)
    }

    /// An admitted request, counted as allowed by each policy; a shadow policy that would
    /// have refused it counts it as limited and marks it in `shadowed`.
    #[inline]
    fn count_admitted(&self, keys: &[(usize, &[u8])], now_ms: u64, shadowed: &mut u64) {
        for &(i, key) in keys {
            let p = &self.list[i];
            match &p.shadow {
                None => p.counters.allowed.inc(),
                Some(shadow) => match p.limiter.check(key, now_ms) {
                    Decision::Allowed { .. } => p.counters.allowed.inc(),
                    Decision::Limited { .. } => {
                        p.counters.limited.inc();
                        shadow.inc();
                        *shadowed |= 1u64.checked_shl(i as u32).unwrap_or(0);
                    }
                },
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use portcullis_policy::ratelimit::{LocalStore, RateLimitParams};

    const W: u64 = 60_000;
    const T0: u64 = 1_000 * W;

    fn counters(name: &str) -> DecisionCounters {
        let vec = IntCounterVec::new(
            prometheus::Opts::new("decisions", "test"),
            &["policy", "result"],
        )
        .unwrap();
        DecisionCounters::of(&vec, name)
    }

    fn policy(name: &str, limit: u64, window_secs: u64, prefix: &str) -> Policy {
        let params = RateLimitParams {
            window_secs,
            limit,
            ..Default::default()
        };
        Policy {
            name: name.into(),
            key: PolicyKey::ClientIp,
            path_prefix: prefix.into(),
            window_secs,
            limiter: Arc::new(if name == "default" {
                Limiter::new(params)
            } else {
                Limiter::for_policy(params, name)
            }),
            counters: counters(name),
            fields: Arc::new(FieldParts::new(name, limit, window_secs)),
            shadow: None,
        }
    }

    /// `[rate_limit]` 10 per minute, "burst" 3 per 10 s.
    fn two() -> Policies {
        Policies {
            list: vec![policy("default", 10, 60, ""), policy("burst", 3, 10, "/")],
            default_enabled: true,
        }
    }

    fn refused_by(c: Combined) -> Option<(usize, u64)> {
        match c {
            Combined::Refused {
                policy,
                retry_after_secs,
                ..
            } => Some((policy, retry_after_secs)),
            Combined::Admitted { .. } | Combined::Unlimited => None,
        }
    }

    #[test]
    fn both_must_admit_and_the_refusing_one_is_named() {
        let ps = two();
        let keys: [(usize, &[u8]); 2] = [(0, b"k"), (1, b"k")];
        for _ in 0..3 {
            assert_eq!(refused_by(ps.decide(&keys, T0, &mut 0)), None);
        }
        // "burst" is full: refused by it, with its own Retry-After (its 10 s window: the 3
        // admissions at the start of a window have decayed to 2 a third into the next one).
        let (p, retry) = refused_by(ps.decide(&keys, T0 + 1, &mut 0)).unwrap();
        assert_eq!(&*ps.list[p].name, "burst");
        assert_eq!(retry, 14);
        assert_eq!(ps.list[1].counters.limited.get(), 1);
        assert_eq!(ps.list[0].counters.refused_by_other.get(), 1);
        assert_eq!(ps.list[0].counters.allowed.get(), 3);
    }

    #[test]
    fn only_admitted_requests_count_against_each_policy() {
        let ps = two();
        let keys: [(usize, &[u8]); 2] = [(0, b"k"), (1, b"k")];
        let mut admitted = 0;
        // 100 requests in one second: "burst" admits 3, refuses 97.
        for i in 0..100 {
            if refused_by(ps.decide(&keys, T0 + i * 10, &mut 0)).is_none() {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 3);
        // The 97 refusals were not counted against "default": 7 left there. Once "burst"
        // has room again (two of its windows later), "default" admits exactly 7 more.
        let later = T0 + 20_000;
        let mut more = 0;
        for k in 0..20u64 {
            // Keep "burst" out of the way: one request per 10 s window at most.
            if refused_by(ps.decide(&[(0, b"k")], later + k, &mut 0)).is_none() {
                more += 1;
            }
        }
        assert_eq!(more, 7);
        assert_eq!(ps.list[0].counters.allowed.get(), 10);
    }

    #[test]
    fn the_default_policy_refusing_is_named_with_its_retry_after() {
        let ps = two();
        // Only "default" applies to these keys (distinct "burst" keys each time).
        for i in 0..10u64 {
            let k = format!("b{i}");
            let keys: [(usize, &[u8]); 2] = [(0, b"k"), (1, k.as_bytes())];
            assert_eq!(refused_by(ps.decide(&keys, T0 + 1_000, &mut 0)), None);
        }
        let keys: [(usize, &[u8]); 2] = [(0, b"k"), (1, b"fresh")];
        let (p, retry) = refused_by(ps.decide(&keys, T0 + 1_000, &mut 0)).unwrap();
        assert_eq!(&*ps.list[p].name, "default");
        // The default's 60 s window: the first admissions leave it after the window.
        assert!(retry > 10, "{retry}");
        // "fresh" was not counted against "burst": it still has its 3.
        let only: [(usize, &[u8]); 1] = [(1, b"fresh")];
        for _ in 0..3 {
            assert_eq!(refused_by(ps.decide(&only, T0 + 1_000, &mut 0)), None);
        }
        assert!(refused_by(ps.decide(&only, T0 + 1_000, &mut 0)).is_some());
    }

    #[test]
    fn when_several_refuse_the_longest_retry_after_wins() {
        let ps = Policies {
            list: vec![policy("default", 6, 60, ""), policy("burst", 3, 10, "/")],
            default_enabled: true,
        };
        let keys: [(usize, &[u8]); 2] = [(0, b"k"), (1, b"k")];
        for t in [T0, T0 + 20_000] {
            for _ in 0..3 {
                assert_eq!(refused_by(ps.decide(&keys, t, &mut 0)), None);
            }
        }
        // Both are full now: "burst" for about 10 s, "default" for about 40 s.
        let (p, retry) = refused_by(ps.decide(&keys, T0 + 20_000, &mut 0)).unwrap();
        assert_eq!(&*ps.list[p].name, "default");
        assert!(retry > 10, "{retry}");
        assert_eq!(ps.list[0].counters.limited.get(), 1);
        assert_eq!(ps.list[1].counters.limited.get(), 1);
        assert_eq!(ps.list[1].counters.refused_by_other.get(), 0);
    }

    /// "burst" (3 per 10 s) in shadow mode beside an enforcing "default" (10 per minute).
    fn with_shadow_burst() -> Policies {
        let mut ps = two();
        ps.list[1].shadow = Some(IntCounter::new("shadow", "test").unwrap());
        ps
    }

    #[test]
    fn a_shadow_policy_admits_counts_what_it_would_admit_and_records_the_rest() {
        let ps = with_shadow_burst();
        let keys: [(usize, &[u8]); 2] = [(0, b"k"), (1, b"k")];
        let mut marks = Vec::new();
        for _ in 0..12 {
            let mut shadowed = 0;
            let c = ps.decide(&keys, T0, &mut shadowed);
            marks.push((refused_by(c), shadowed));
        }
        // "default" admits its 10, then refuses: nothing is refused by "burst".
        for (n, (refused, shadowed)) in marks.iter().enumerate() {
            assert_eq!(refused.map(|r| r.0), (n >= 10).then_some(0), "request {n}");
            // "burst" would have refused from the 4th on (while "default" admitted).
            let expect = if (3..10).contains(&n) { 0b10 } else { 0 };
            assert_eq!(*shadowed, expect, "request {n}");
        }
        let burst = &ps.list[1];
        assert_eq!(burst.shadow.as_ref().unwrap().get(), 7);
        assert_eq!(burst.counters.allowed.get(), 3);
        assert_eq!(burst.counters.limited.get(), 7 + 2);
        assert_eq!(ps.list[0].counters.allowed.get(), 10);
        assert_eq!(ps.list[0].counters.limited.get(), 2);
        // Its figures are an enforcing policy's: 3 admissions counted, no more.
        assert!(matches!(
            burst.limiter.peek(b"k", T0),
            Decision::Limited { .. }
        ));
    }

    #[test]
    fn only_shadow_policies_admit_without_fields() {
        let ps = with_shadow_burst();
        let only: [(usize, &[u8]); 1] = [(1, b"k")];
        for n in 0..5 {
            let mut shadowed = 0;
            assert_eq!(ps.decide(&only, T0, &mut shadowed), Combined::Unlimited);
            assert_eq!(shadowed != 0, n >= 3, "request {n}");
        }
    }

    #[test]
    fn admitted_fields_are_the_tightest_policys() {
        let ps = two();
        let keys: [(usize, &[u8]); 2] = [(0, b"k"), (1, b"k")];
        match ps.decide(&keys, T0, &mut 0) {
            Combined::Admitted {
                policy,
                limit,
                remaining,
                ..
            } => {
                assert_eq!(&*ps.list[policy].name, "burst");
                assert_eq!((limit, remaining), (3, 2));
            }
            c => panic!("{c:?}"),
        }
    }

    #[tokio::test]
    async fn one_flush_carries_every_policys_deltas_apart() {
        let ps = two();
        let store = LocalStore::new();
        let keys: [(usize, &[u8]); 2] = [(0, b"k"), (1, b"k")];
        // Two admissions each (a key becomes shared, i.e. sent, at its second one).
        for _ in 0..2 {
            assert_eq!(refused_by(ps.decide(&keys, T0, &mut 0)), None);
        }
        let set = ps.limiters();
        let refs: Vec<&Limiter> = set.iter().map(|l| &**l).collect();
        let o = portcullis_policy::ratelimit::flush(&refs, &store, &|| T0 + 1, false)
            .await
            .unwrap();
        assert_eq!((o.keys, o.admissions), (2, 4));
        let plain = portcullis_policy::ratelimit::hash::stable_hash("k");
        let named = portcullis_policy::ratelimit::hash::stable_hash("policy:burst\0k");
        assert_eq!(store.counts(plain, T0 / W).cur, 2);
        assert_eq!(store.counts(named, T0 / 10_000).cur, 2);
        assert_eq!(store.len(), 2);
    }
}
