//! Claims on the disruption budget (CONTRACT §12, the disruption-budget article's safety
//! policy): may a deploy tool take `backend` out now? The limit policies (max operations
//! at once, grace periods after a group's last claim and last release, one group at a
//! time), the health policy (no voluntary operation on an upstream already failing), the
//! fraction shared with culls and drains, the fleet's tokens, and emergency claims that
//! pass every limit but the last backend and block the rest of their upstream.
//!
//! [`check_claim`] is plain arithmetic over a [`FleetState`] read at `now_ms`: dry runs and
//! the feasibility audit run it on the instance's in-memory view; a real claim runs it on
//! a fresh read and commits only if nothing changed meanwhile (the store's version).

use std::collections::HashMap;

use super::max_out;
use super::ops::{budget_for, outside_budget, OpKind, OpRecord};

/// `[budget]`: the limit and health policies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetPolicy {
    /// Operations out at once, fleet-wide, over all upstreams (culls, drains, maint,
    /// claims); 0 = no limit.
    pub max_concurrent: u32,
    /// A new claim in a group waits this long after the group's last claim started.
    pub min_between_claims_ms: u64,
    /// And this long after the group's last claim ended.
    pub min_after_release_ms: u64,
    /// An operation in one named group refuses claims in any other.
    pub one_group_at_a_time: bool,
    /// No voluntary operation on an upstream whose other backends are failing or culled.
    pub refuse_when_failing: bool,
}

impl Default for BudgetPolicy {
    fn default() -> Self {
        Self {
            max_concurrent: 0,
            min_between_claims_ms: 0,
            min_after_release_ms: 0,
            one_group_at_a_time: false,
            refuse_when_failing: true,
        }
    }
}

/// The global group every backend is in.
pub const GLOBAL_GROUP: &str = "global";

/// The group of an upstream's backends.
pub fn upstream_group(upstream: &str) -> String {
    format!("upstream:{upstream}")
}

/// The fleet's budget as one read sees it, at `now_ms` on the store's clock.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetState {
    pub now_ms: u64,
    /// Changes on every write that takes a backend out: a claim commits only on the
    /// version it was checked on.
    pub version: u64,
    /// Tokens in the fleet bucket, and when the next one comes if there is none.
    pub tokens: f64,
    pub token_retry_ms: u64,
    /// Active cull claims: (upstream, backend).
    pub culls: Vec<(String, String)>,
    /// Operations in force (drains, maint, weights, claims): (upstream, record).
    pub ops: Vec<(String, OpRecord)>,
    /// Group → (last claim started, last claim ended), Unix ms.
    pub groups: HashMap<String, (u64, u64)>,
}

impl FleetState {
    /// The distinct backends of `upstream` out now (culled, or under an operation that
    /// takes them out).
    pub fn out_of(&self, upstream: &str) -> Vec<&str> {
        self.out_where(upstream, |_| true)
    }

    /// The backends of `upstream` out within the budget: culled, or taken out by an
    /// operation that is neither forced nor an emergency claim ([`outside_budget`]), each
    /// once.
    pub fn within_budget_of(&self, upstream: &str) -> Vec<&str> {
        self.out_where(upstream, |r| !outside_budget(r))
    }

    /// The distinct backends of `upstream` culled, or taken out by an operation in force
    /// that `keep` accepts, sorted.
    fn out_where(&self, upstream: &str, keep: impl Fn(&OpRecord) -> bool) -> Vec<&str> {
        let mut out: Vec<&str> = self
            .culls
            .iter()
            .filter(|(u, _)| u == upstream)
            .map(|(_, b)| b.as_str())
            .collect();
        for (u, r) in &self.ops {
            if u == upstream && r.active(self.now_ms) && r.kind.takes_out() && keep(r) {
                out.push(&r.backend);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Every (upstream, backend) out now, fleet-wide, each once.
    pub fn all_out(&self) -> Vec<(&str, &str)> {
        let mut out: Vec<(&str, &str)> = self
            .culls
            .iter()
            .map(|(u, b)| (u.as_str(), b.as_str()))
            .collect();
        for (u, r) in &self.ops {
            if r.active(self.now_ms) && r.kind.takes_out() {
                out.push((u, &r.backend));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The active claims, fleet-wide.
    pub fn claims(&self) -> impl Iterator<Item = (&str, &OpRecord)> {
        self.ops.iter().filter_map(move |(u, r)| {
            (matches!(r.kind, OpKind::Claim { .. }) && r.active(self.now_ms))
                .then_some((u.as_str(), r))
        })
    }
}

/// What a claim asks.
pub struct ClaimAsk<'a> {
    pub upstream: &'a str,
    pub backend: &'a str,
    /// Backends of the upstream.
    pub total: u32,
    /// `max_culled_fraction`.
    pub fraction: f64,
    pub emergency: bool,
    /// The named groups (zones, racks) of a backend, from the configuration.
    pub named_groups: &'a (dyn Fn(&str, &str) -> Vec<String> + Sync),
    /// The health policy's input: another backend of the upstream is failing or culled.
    pub peers_failing: bool,
}

/// Why a claim was refused: the policy, and when waiting would help.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimRefusal {
    /// The backend already has an active claim.
    Claimed {
        id: u64,
    },
    LastBackend {
        total: u32,
    },
    /// An emergency claim is active on the upstream.
    Emergency,
    Failing,
    Fraction {
        out: u32,
        max_out: u32,
        total: u32,
    },
    MaxConcurrent {
        active: u32,
        max: u32,
    },
    GracePeriod {
        group: String,
        retry_ms: u64,
    },
    OneGroup {
        group: String,
    },
    Tokens {
        retry_ms: u64,
    },
}

impl ClaimRefusal {
    /// The policy's name in a refusal (CONTRACT §12).
    pub fn policy(&self) -> &'static str {
        match self {
            ClaimRefusal::Claimed { .. } => "claimed",
            ClaimRefusal::LastBackend { .. } => "last_backend",
            ClaimRefusal::Emergency => "emergency",
            ClaimRefusal::Failing => "failing",
            ClaimRefusal::Fraction { .. } => "fraction",
            ClaimRefusal::MaxConcurrent { .. } => "max_concurrent",
            ClaimRefusal::GracePeriod { .. } => "grace_period",
            ClaimRefusal::OneGroup { .. } => "one_group",
            ClaimRefusal::Tokens { .. } => "tokens",
        }
    }

    /// When a retry could succeed, if waiting is what helps.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            ClaimRefusal::GracePeriod { retry_ms, .. } | ClaimRefusal::Tokens { retry_ms } => {
                Some(*retry_ms)
            }
            _ => None,
        }
    }

    /// A sentence a person can act on.
    pub fn reason(&self) -> String {
        match self {
            ClaimRefusal::Claimed { id } => {
                format!("claimed: the backend is already claimed ({id:016x}); release that claim first")
            }
            ClaimRefusal::LastBackend { total } => format!(
                "last_backend: this would take out all {total} backends of the upstream; bring another back first"
            ),
            ClaimRefusal::Emergency => {
                "emergency: an emergency claim is active on this upstream; wait until it is released".into()
            }
            ClaimRefusal::Failing => "failing: other backends of this upstream are failing or culled; \
                 no voluntary operation until they recover"
                .into(),
            ClaimRefusal::Fraction { out, max_out, total } => format!(
                "fraction: {out} of {total} backends would be out (culled, drained, in maintenance or claimed), \
                 over max_culled_fraction's {max_out}; wait for one to come back"
            ),
            ClaimRefusal::MaxConcurrent { active, max } => format!(
                "max_concurrent: {active} operations are out across the fleet, the most [budget] allows at once is {max}"
            ),
            ClaimRefusal::GracePeriod { group, retry_ms } => format!(
                "grace_period: group {group:?} had an operation start or end too recently; retry in {} s",
                retry_ms.div_ceil(1000)
            ),
            ClaimRefusal::OneGroup { group } => format!(
                "one_group: group {group:?} is being operated on, and [budget] one_group_at_a_time allows one group at a time"
            ),
            ClaimRefusal::Tokens { retry_ms } => format!(
                "tokens: the fleet's disruption tokens are spent; the next comes in {} s",
                retry_ms.div_ceil(1000)
            ),
        }
    }
}

/// The groups a claim on `backend` of `upstream` counts in: the global group, the
/// upstream's, and its named ones.
pub fn groups_of(upstream: &str, named: Vec<String>) -> Vec<String> {
    let mut g = vec![GLOBAL_GROUP.to_string(), upstream_group(upstream)];
    g.extend(named);
    g
}

/// Whether `ask` may be granted on `state` under `policy`.
pub fn check_claim(
    ask: &ClaimAsk<'_>,
    state: &FleetState,
    policy: &BudgetPolicy,
) -> Result<(), ClaimRefusal> {
    if let Some((_, r)) = state
        .claims()
        .find(|(u, r)| *u == ask.upstream && r.backend == ask.backend)
    {
        if let OpKind::Claim { id, .. } = r.kind {
            return Err(ClaimRefusal::Claimed { id });
        }
    }
    let out = state.out_of(ask.upstream);
    let already_out = out.contains(&ask.backend);
    let after = u32::try_from(out.len()).unwrap_or(u32::MAX) + u32::from(!already_out);
    if after >= ask.total {
        return Err(ClaimRefusal::LastBackend { total: ask.total });
    }
    if ask.emergency {
        return Ok(());
    }
    let emergency_here = state.claims().any(|(u, r)| {
        u == ask.upstream
            && matches!(
                r.kind,
                OpKind::Claim {
                    emergency: true,
                    ..
                }
            )
    });
    if emergency_here {
        return Err(ClaimRefusal::Emergency);
    }
    if policy.refuse_when_failing && ask.peers_failing {
        return Err(ClaimRefusal::Failing);
    }
    // A backend out only past the budget (a forced operation) is not out already for the
    // fraction: the claim would keep it out once the forced operation ends, so it counts as
    // one more on top of those out within the budget (as the stores count a put).
    let within = state.within_budget_of(ask.upstream);
    let (within_out, counted) = budget_for(ask.backend, &out, &within);
    let limit = max_out(ask.total, ask.fraction);
    let after_budget = counted + u32::from(!within_out);
    if !within_out && after_budget > limit {
        return Err(ClaimRefusal::Fraction {
            out: after_budget,
            max_out: limit,
            total: ask.total,
        });
    }
    let all = state.all_out();
    let active = u32::try_from(all.len()).unwrap_or(u32::MAX);
    if policy.max_concurrent > 0 && !already_out && active + 1 > policy.max_concurrent {
        return Err(ClaimRefusal::MaxConcurrent {
            active,
            max: policy.max_concurrent,
        });
    }
    check_groups(ask, state, policy, &all)?;
    if state.tokens < 1.0 {
        return Err(ClaimRefusal::Tokens {
            retry_ms: state.token_retry_ms,
        });
    }
    Ok(())
}

/// The groups' rules for a voluntary claim: each of the backend's groups waits out its
/// grace periods (`min_between_claims_ms` after the last claim began,
/// `min_after_release_ms` after the last ended; the longest wait is the answer), and with
/// `one_group_at_a_time` nothing of another group may be out.
fn check_groups(
    ask: &ClaimAsk<'_>,
    state: &FleetState,
    policy: &BudgetPolicy,
    all: &[(&str, &str)],
) -> Result<(), ClaimRefusal> {
    let now = state.now_ms;
    let named = (ask.named_groups)(ask.upstream, ask.backend);
    let mut wait: Option<(String, u64)> = None;
    for g in groups_of(ask.upstream, named.clone()) {
        let (start, end) = state.groups.get(&g).copied().unwrap_or((0, 0));
        let after = |at: u64, gap: u64| if at > 0 { at.saturating_add(gap) } else { 0 };
        let ready =
            after(start, policy.min_between_claims_ms).max(after(end, policy.min_after_release_ms));
        if ready > now && wait.as_ref().is_none_or(|(_, w)| ready - now > *w) {
            wait = Some((g, ready - now));
        }
    }
    if let Some((group, retry_ms)) = wait {
        return Err(ClaimRefusal::GracePeriod { group, retry_ms });
    }
    if policy.one_group_at_a_time {
        for (u, b) in all {
            for g in (ask.named_groups)(u, b) {
                if !named.contains(&g) {
                    return Err(ClaimRefusal::OneGroup { group: g });
                }
            }
        }
    }
    Ok(())
}

/// The limits an automatic cull of `backend` answers to besides the fraction and the
/// tokens (which the store checks atomically): `max_concurrent` and one group at a time.
/// A cull is the answer to a failure, so grace periods and the health policy do not hold
/// it back. Checked on the instance's fleet view.
pub fn check_cull(
    upstream: &str,
    backend: &str,
    named_groups: &dyn Fn(&str, &str) -> Vec<String>,
    state: &FleetState,
    policy: &BudgetPolicy,
) -> Result<(), ClaimRefusal> {
    let all = state.all_out();
    if all.contains(&(upstream, backend)) {
        return Ok(());
    }
    let active = u32::try_from(all.len()).unwrap_or(u32::MAX);
    if policy.max_concurrent > 0 && active + 1 > policy.max_concurrent {
        return Err(ClaimRefusal::MaxConcurrent {
            active,
            max: policy.max_concurrent,
        });
    }
    if policy.one_group_at_a_time {
        let mine = named_groups(upstream, backend);
        for (u, b) in &all {
            if let Some(g) = named_groups(u, b).into_iter().find(|g| !mine.contains(g)) {
                return Err(ClaimRefusal::OneGroup { group: g });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cull::ops::OpRequest;

    fn state(now: u64) -> FleetState {
        FleetState {
            now_ms: now,
            tokens: 5.0,
            ..FleetState::default()
        }
    }

    fn claim(st: &mut FleetState, up: &str, b: &str, id: u64, emergency: bool) {
        let req = OpRequest {
            kind: OpKind::Claim { id, emergency },
            by: "deploy".into(),
            reason: "r".into(),
            ttl_ms: Some(600_000),
            force: false,
        };
        st.ops.push((up.into(), OpRecord::new(b, &req, st.now_ms)));
    }

    fn zones(_: &str, b: &str) -> Vec<String> {
        match b {
            "a1" | "a2" => vec!["zone-a".into()],
            "b1" | "b2" => vec!["zone-b".into()],
            _ => vec![],
        }
    }

    fn ask<'a>(b: &'a str, f: &'a (dyn Fn(&str, &str) -> Vec<String> + Sync)) -> ClaimAsk<'a> {
        ClaimAsk {
            upstream: "app",
            backend: b,
            total: 4,
            fraction: 0.5,
            emergency: false,
            named_groups: f,
            peers_failing: false,
        }
    }

    #[test]
    fn a_backend_out_only_by_a_forced_drain_is_held_to_the_fraction() {
        let p = BudgetPolicy::default();
        let mut st = state(1_000);
        // a1 and a2 out within the budget (2 of 4 at 0.5), b1 out by a forced drain past it
        st.culls.push(("app".into(), "a1".into()));
        claim(&mut st, "app", "a2", 1, false);
        let forced = OpRequest {
            kind: OpKind::Drain,
            by: "ops".into(),
            reason: "r".into(),
            ttl_ms: Some(600_000),
            force: true,
        };
        st.ops
            .push(("app".into(), OpRecord::new("b1", &forced, st.now_ms)));
        assert_eq!(st.within_budget_of("app"), vec!["a1", "a2"]);
        // a claim on b1 would keep it out when the forced drain ends: 3 of 4, over the budget
        let r = check_claim(&ask("b1", &zones), &st, &p);
        assert_eq!(r.as_ref().map_err(ClaimRefusal::policy), Err("fraction"));
        // once the budget has room, it is granted
        st.culls.clear();
        assert_eq!(check_claim(&ask("b1", &zones), &st, &p), Ok(()));
    }

    #[test]
    fn fraction_tokens_and_the_last_backend() {
        let p = BudgetPolicy::default();
        let mut st = state(1_000);
        st.culls.push(("app".into(), "a1".into()));
        assert_eq!(check_claim(&ask("a2", &zones), &st, &p), Ok(()));
        claim(&mut st, "app", "a2", 1, false);
        let r = check_claim(&ask("b1", &zones), &st, &p);
        assert_eq!(r.as_ref().map_err(ClaimRefusal::policy), Err("fraction"));
        assert_eq!(
            check_claim(&ask("a2", &zones), &st, &p).map_err(|r| r.policy()),
            Err("claimed")
        );
        // an emergency passes the fraction, never the last backend
        let mut e = ask("b1", &zones);
        e.emergency = true;
        assert_eq!(check_claim(&e, &st, &p), Ok(()));
        claim(&mut st, "app", "b1", 2, true);
        e.backend = "b2";
        assert_eq!(
            check_claim(&e, &st, &p).map_err(|r| r.policy()),
            Err("last_backend")
        );
        // and while it lasts other claims on the upstream are refused
        st.culls.clear();
        st.ops.retain(|(_, r)| r.backend != "a2");
        assert_eq!(
            check_claim(&ask("a1", &zones), &st, &p).map_err(|r| r.policy()),
            Err("emergency")
        );
        // no token: the refusal says when the next comes
        let mut st = state(0);
        st.tokens = 0.4;
        st.token_retry_ms = 12_000;
        let r = check_claim(&ask("a1", &zones), &st, &p).err();
        assert_eq!(
            r.as_ref().and_then(ClaimRefusal::retry_after_ms),
            Some(12_000)
        );
        assert!(r.is_some_and(|r| r.reason().contains("12 s")));
    }

    #[test]
    fn max_concurrent_counts_every_operation_fleet_wide() {
        let p = BudgetPolicy {
            max_concurrent: 2,
            ..BudgetPolicy::default()
        };
        let mut st = state(0);
        st.culls.push(("other".into(), "x".into()));
        claim(&mut st, "app", "a1", 1, false);
        let r = check_claim(&ask("b1", &zones), &st, &p);
        assert_eq!(r, Err(ClaimRefusal::MaxConcurrent { active: 2, max: 2 }));
    }

    #[test]
    fn grace_periods_after_a_groups_last_start_and_end() {
        let p = BudgetPolicy {
            min_between_claims_ms: 60_000,
            min_after_release_ms: 30_000,
            ..BudgetPolicy::default()
        };
        let mut st = state(100_000);
        st.groups.insert("zone-a".into(), (50_000, 0));
        let r = check_claim(&ask("a1", &zones), &st, &p);
        assert_eq!(
            r,
            Err(ClaimRefusal::GracePeriod {
                group: "zone-a".into(),
                retry_ms: 10_000
            })
        );
        // another zone is not held back
        assert_eq!(check_claim(&ask("b1", &zones), &st, &p), Ok(()));
        st.groups.insert("upstream:app".into(), (0, 90_000));
        let r = check_claim(&ask("b1", &zones), &st, &p);
        assert_eq!(r.as_ref().ok(), None);
        assert_eq!(r.err().and_then(|r| r.retry_after_ms()), Some(20_000));
        st.now_ms = 120_000;
        assert_eq!(check_claim(&ask("b1", &zones), &st, &p), Ok(()));
        assert_eq!(check_claim(&ask("a1", &zones), &st, &p), Ok(()));
    }

    #[test]
    fn one_group_at_a_time_and_the_health_policy() {
        let p = BudgetPolicy {
            one_group_at_a_time: true,
            ..BudgetPolicy::default()
        };
        let mut st = state(0);
        claim(&mut st, "app", "a1", 1, false);
        assert_eq!(check_claim(&ask("a2", &zones), &st, &p), Ok(()));
        assert_eq!(
            check_claim(&ask("b1", &zones), &st, &p),
            Err(ClaimRefusal::OneGroup {
                group: "zone-a".into()
            })
        );
        let mut failing = ask("a2", &zones);
        failing.peers_failing = true;
        assert_eq!(check_claim(&failing, &st, &p), Err(ClaimRefusal::Failing));
        let lenient = BudgetPolicy {
            refuse_when_failing: false,
            ..p
        };
        assert_eq!(check_claim(&failing, &st, &lenient), Ok(()));
    }

    #[test]
    fn culls_answer_to_max_concurrent_and_one_group_only() {
        let mut st = state(0);
        claim(&mut st, "app", "a1", 1, false);
        let cap = BudgetPolicy {
            max_concurrent: 1,
            min_between_claims_ms: 3_600_000,
            ..BudgetPolicy::default()
        };
        st.groups.insert("zone-a".into(), (1, 0));
        assert_eq!(
            check_cull("app", "b1", &zones, &st, &cap),
            Err(ClaimRefusal::MaxConcurrent { active: 1, max: 1 })
        );
        // already out: nothing more is taken
        assert_eq!(check_cull("app", "a1", &zones, &st, &cap), Ok(()));
        let zone = BudgetPolicy {
            one_group_at_a_time: true,
            min_between_claims_ms: 3_600_000,
            ..BudgetPolicy::default()
        };
        assert_eq!(
            check_cull("app", "b1", &zones, &st, &zone),
            Err(ClaimRefusal::OneGroup {
                group: "zone-a".into()
            })
        );
        // the grace period does not hold a cull back
        assert_eq!(check_cull("app", "a2", &zones, &st, &zone), Ok(()));
    }
}
