//! Caps as fleet totals (`[shedding] fleet_max_concurrency`, `[[upstreams]]
//! fleet_max_inflight`): each instance takes the fleet's cap times its share of the
//! fleet's recent traffic, as the instances publish it to the store.
//!
//! Every instance publishes, in the background, how many requests it saw over the last
//! [`WINDOW_MS`] (one count for the whole instance, [`SCOPE_ALL`], and one per upstream)
//! and reads back every instance's fresh counts ([`TrafficStore::exchange`], one round
//! trip). [`effective_cap`] turns that view into this instance's cap. Plain Rust taking
//! `now`; the app drives it.

use std::collections::VecDeque;

use async_trait::async_trait;

use crate::store_error::StoreError;
use crate::tenant::concurrency_allowance;

/// The scope of the whole instance's traffic (the global cap); an upstream's scope is
/// its name.
pub const SCOPE_ALL: &str = "*";
/// The traffic an instance's share is computed from: requests over this many ms.
pub const WINDOW_MS: u64 = 2_000;

/// What one instance publishes: its counts by scope, kept `ttl_ms` in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrafficPublish {
    pub instance: String,
    pub ttl_ms: u64,
    pub counts: Vec<(String, u64)>,
}

/// The fleet's fresh counts (entries older than the TTL left out), sorted by instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrafficView {
    /// The store's clock.
    pub now_ms: u64,
    pub instances: Vec<(String, Vec<(String, u64)>)>,
}

impl TrafficView {
    /// `(own, fleet sum, instances)` for a scope. Every live instance counts, those that
    /// published nothing for the scope with 0; `instances` is at least 1 (this one).
    pub fn share(&self, me: &str, scope: &str) -> Share {
        let count = |counts: &[(String, u64)]| {
            counts
                .iter()
                .find(|(s, _)| s == scope)
                .map_or(0, |(_, n)| *n)
        };
        let mut own = 0;
        let mut fleet = 0u64;
        let mut seen_me = false;
        for (instance, counts) in &self.instances {
            let n = count(counts);
            if instance == me {
                own = n;
                seen_me = true;
            }
            fleet = fleet.saturating_add(n);
        }
        let instances = self.instances.len() as u64 + u64::from(!seen_me);
        Share {
            own,
            fleet: fleet.saturating_add(if seen_me { 0 } else { own }),
            instances: instances.max(1),
        }
    }
}

/// One scope's traffic: this instance's, the fleet's, and how many instances are live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub own: u64,
    pub fleet: u64,
    pub instances: u64,
}

impl Share {
    /// The same view with this instance's count replaced by `own`: the count it published
    /// one exchange earlier, as old as the others' are on average. Its fresh count against
    /// the others' older ones would overstate its share while traffic grows (at the onset
    /// of load every instance would find itself alone and take the whole cap).
    pub fn with_own(self, own: u64) -> Share {
        Share {
            own,
            fleet: self.fleet.saturating_sub(self.own).saturating_add(own),
            instances: self.instances,
        }
    }

    /// The fraction of the fleet's traffic that is this instance's (an equal part when
    /// the fleet saw nothing).
    pub fn fraction(&self) -> f64 {
        if self.fleet == 0 {
            1.0 / self.instances.max(1) as f64
        } else {
            self.own.min(self.fleet) as f64 / self.fleet as f64
        }
    }
}

/// Encodes counts as the store's payload: one `count name` line per scope.
pub fn encode_counts(counts: &[(String, u64)]) -> String {
    let mut out = String::new();
    for (scope, n) in counts {
        if scope.contains('\n') {
            continue;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&n.to_string());
        out.push(' ');
        out.push_str(scope);
    }
    out
}

/// Decodes [`encode_counts`]' payload (unreadable lines left out).
pub fn decode_counts(payload: &str) -> Vec<(String, u64)> {
    payload
        .split('\n')
        .filter_map(|line| {
            let (n, scope) = line.split_once(' ')?;
            Some((scope.to_owned(), n.parse().ok()?))
        })
        .collect()
}

/// The store of the fleet's traffic counts (Redis, or in process).
#[async_trait]
pub trait TrafficStore: Send + Sync + std::fmt::Debug {
    /// Publishes this instance's counts and reads every instance's fresh ones, pruning
    /// the stale, in one round trip.
    async fn exchange(&self, req: &TrafficPublish) -> Result<TrafficView, StoreError>;
}

/// Requests over the last [`WINDOW_MS`] from a monotonic total sampled now and then:
/// the total now minus the total at the oldest sample still inside the window.
#[derive(Debug, Default)]
pub struct RecentCount {
    samples: VecDeque<(u64, u64)>,
}

impl RecentCount {
    /// Records `total` at `now_ms` and gives the count over the window (a total that went
    /// down, e.g. a backend removed, counts from the new value).
    pub fn observe(&mut self, now_ms: u64, total: u64) -> u64 {
        if self.samples.back().is_some_and(|&(_, t)| t > total) {
            self.samples.clear();
        }
        self.samples.push_back((now_ms, total));
        while self.samples.len() > 1
            && self
                .samples
                .get(1)
                .is_some_and(|&(at, _)| at + WINDOW_MS <= now_ms)
        {
            self.samples.pop_front();
        }
        let first = self.samples.front().map_or(total, |&(_, t)| t);
        total.saturating_sub(first)
    }
}

/// Where this instance's cap comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapSource {
    /// No fleet cap configured: the per-instance value.
    Instance,
    /// The fleet cap times this instance's share.
    Fleet,
    /// A fleet cap without `[redis]`: the per-instance value.
    NoStore,
    /// The store has not answered for longer than [`STALE_MS`]: the per-instance value.
    StoreDown,
}

impl CapSource {
    pub fn as_str(self) -> &'static str {
        match self {
            CapSource::Instance => "instance",
            CapSource::Fleet => "fleet",
            CapSource::NoStore => "instance (no store)",
            CapSource::StoreDown => "instance (store down)",
        }
    }
}

/// A fleet view older than this (no successful exchange since) is not used.
pub const STALE_MS: u64 = 3_000;

/// This instance's cap and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EffectiveCap {
    pub cap: u64,
    pub source: CapSource,
    /// This instance's share of the fleet's traffic (with [`CapSource::Fleet`]).
    pub share: Option<f64>,
}

/// This instance's cap at `now_ms`:
/// - `fleet_cap == 0`: `instance_cap` ([`CapSource::Instance`]);
/// - no store: `instance_cap` ([`CapSource::NoStore`]);
/// - no fleet view, or one read at `read_at_ms` more than [`STALE_MS`] ago:
///   `instance_cap` ([`CapSource::StoreDown`]);
/// - otherwise the fleet cap times this instance's share of the traffic
///   ([`concurrency_allowance`]: the fractional part granted as one more with that
///   probability, `draw` in `[0, 1)`, so the fleet's caps add up to `fleet_cap` in
///   expectation and never beyond `fleet_cap + instances − 1`), but at least `floor`
///   (itself at most `fleet_cap`).
pub fn effective_cap(
    fleet_cap: u64,
    instance_cap: u64,
    floor: u64,
    store: bool,
    view: Option<(u64, Share)>,
    now_ms: u64,
    draw: f64,
) -> EffectiveCap {
    let instance = |source| EffectiveCap {
        cap: instance_cap,
        source,
        share: None,
    };
    if fleet_cap == 0 {
        return instance(CapSource::Instance);
    }
    if !store {
        return instance(CapSource::NoStore);
    }
    let Some((read_at_ms, share)) = view else {
        return instance(CapSource::StoreDown);
    };
    if now_ms.saturating_sub(read_at_ms) > STALE_MS {
        return instance(CapSource::StoreDown);
    }
    let fleet = (share.fleet > 0).then_some(share.fleet);
    let cap = concurrency_allowance(fleet_cap, share.own, fleet, share.instances, draw);
    EffectiveCap {
        cap: cap.max(floor.min(fleet_cap)),
        source: CapSource::Fleet,
        share: Some(if share.instances <= 1 {
            1.0
        } else {
            share.fraction()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(entries: &[(&str, &[(&str, u64)])]) -> TrafficView {
        TrafficView {
            now_ms: 1,
            instances: entries
                .iter()
                .map(|(i, c)| {
                    (
                        (*i).to_owned(),
                        c.iter().map(|(s, n)| ((*s).to_owned(), *n)).collect(),
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn counts_round_trip_through_the_payload() {
        let c = vec![("*".to_owned(), 120), ("api v2".to_owned(), 7)];
        assert_eq!(decode_counts(&encode_counts(&c)), c);
        assert_eq!(decode_counts(""), vec![]);
        assert_eq!(decode_counts("x y\n3 ok"), vec![("ok".to_owned(), 3)]);
    }

    #[test]
    fn the_share_sums_every_live_instance() {
        let v = view(&[
            ("a", &[("*", 30), ("api", 10)]),
            ("b", &[("*", 90)]),
            ("c", &[]),
        ]);
        let s = v.share("a", "*");
        assert_eq!((s.own, s.fleet, s.instances), (30, 120, 3));
        assert!((s.fraction() - 0.25).abs() < 1e-9);
        let s = v.share("a", "api");
        assert_eq!((s.own, s.fleet, s.instances), (10, 10, 3));
        // Not in the view yet (its own entry expired): counted as one more, with nothing.
        let s = v.share("d", "*");
        assert_eq!((s.own, s.fleet, s.instances), (0, 120, 4));
        // The count published one exchange earlier in place of the fresh one.
        let s = v.share("a", "*").with_own(20);
        assert_eq!((s.own, s.fleet, s.instances), (20, 110, 3));
        // Nobody saw traffic: an equal part.
        let s = view(&[("a", &[]), ("b", &[])]).share("a", "*");
        assert!((s.fraction() - 0.5).abs() < 1e-9);
    }

    #[test]
    fn the_recent_count_covers_the_window() {
        let mut r = RecentCount::default();
        assert_eq!(r.observe(0, 100), 0);
        assert_eq!(r.observe(500, 150), 50);
        assert_eq!(r.observe(1_000, 200), 100);
        assert_eq!(r.observe(2_000, 300), 200);
        // The sample at 0 leaves the window once the one at 500 is 2 s old too.
        assert_eq!(r.observe(2_500, 300), 150);
        assert_eq!(r.observe(10_000, 300), 0);
        // A total that went down starts over.
        assert_eq!(r.observe(10_500, 10), 0);
        assert_eq!(r.observe(11_000, 30), 20);
    }

    fn share(own: u64, fleet: u64, instances: u64) -> Share {
        Share {
            own,
            fleet,
            instances,
        }
    }

    #[test]
    fn the_cap_is_the_fleet_cap_times_the_share() {
        let at = Some((1_000, share(25, 100, 4)));
        let c = effective_cap(40, 100, 1, true, at, 1_500, 0.0);
        assert_eq!((c.cap, c.source), (10, CapSource::Fleet));
        assert_eq!(c.share, Some(0.25));
        // One instance: the whole fleet cap (not the per-instance value).
        let c = effective_cap(40, 100, 1, true, Some((0, share(5, 5, 1))), 0, 0.9);
        assert_eq!((c.cap, c.share), (40, Some(1.0)));
        // Two instances, 3/4 of the traffic here.
        let c = effective_cap(40, 100, 1, true, Some((0, share(75, 100, 2))), 0, 0.0);
        assert_eq!(c.cap, 30);
    }

    #[test]
    fn never_below_the_floor() {
        let idle = Some((0, share(0, 1_000, 4)));
        assert_eq!(effective_cap(40, 100, 8, true, idle, 0, 0.0).cap, 8);
        assert_eq!(effective_cap(40, 100, 1, true, idle, 0, 0.0).cap, 1);
        // A floor above the fleet cap is the fleet cap.
        assert_eq!(effective_cap(4, 100, 8, true, idle, 0, 0.0).cap, 4);
    }

    #[test]
    fn the_per_instance_value_without_the_store_or_a_fresh_view() {
        let at = Some((1_000, share(25, 100, 4)));
        let c = effective_cap(0, 100, 1, true, at, 1_000, 0.0);
        assert_eq!((c.cap, c.source, c.share), (100, CapSource::Instance, None));
        let c = effective_cap(40, 100, 1, false, at, 1_000, 0.0);
        assert_eq!((c.cap, c.source), (100, CapSource::NoStore));
        let c = effective_cap(40, 100, 1, true, None, 1_000, 0.0);
        assert_eq!((c.cap, c.source), (100, CapSource::StoreDown));
        // Fresh up to STALE_MS, stale after.
        let c = effective_cap(40, 100, 1, true, at, 1_000 + STALE_MS, 0.0);
        assert_eq!(c.source, CapSource::Fleet);
        let c = effective_cap(40, 100, 1, true, at, 1_001 + STALE_MS, 0.0);
        assert_eq!((c.cap, c.source), (100, CapSource::StoreDown));
        assert_eq!(c.source.as_str(), "instance (store down)");
    }

    #[test]
    fn the_fleet_total_is_the_cap_in_expectation() {
        // 3 instances with equal traffic and cap 40: 13.33 each; the total averages 40
        // and stays within cap + instances - 1.
        let mut total = 0u64;
        let runs = 3_000u64;
        for i in 0..runs {
            let mut sum = 0;
            for k in 0..3u64 {
                let draw = (((i * 3 + k) * 2_654_435_761) % 1_000) as f64 / 1_000.0;
                let c = effective_cap(40, 100, 1, true, Some((0, share(1, 3, 3))), 0, draw);
                sum += c.cap;
            }
            assert!((39..=42).contains(&sum), "{sum}");
            total += sum;
        }
        let mean = total as f64 / runs as f64;
        assert!((mean - 40.0).abs() < 0.1, "mean {mean}");
    }
}
