//! The culling check loop: every `check_interval_seconds` it reads the fleet's
//! claims in one round trip, evaluates each upstream's error windows (with the
//! systemic-failure guard), and drives each backend's [`CullState`]: claim a
//! disruption-budget token, eject, renew the lease while bad, probe after the
//! cooldown, readmit and release. Policy lives beside it in [`crate::cull`]
//! (`state`, `evaluate`, `budget`); this file only performs the actions. What the
//! loop remembers between ticks is a [`Memory`] the loop owns, and every tick
//! takes `now`, so a test can drive ticks on its own clock.

use super::{
    evaluate_outliers, evaluate_sharded, failing_reason, http, webhook, Action, BackendSample,
    Buckets, BudgetSnapshot, BudgetStore, ClaimOutcome, CullParams, CullState, Evaluation,
    FailingInput, FleetDelta, LatencyBuckets, Outlier, OutlierRule, OutlierVerdict, PeerSample,
    StoreError, TickInput,
};
use crate::metrics::CullResult;
use crate::state::Shared;
use crate::store::clock::unix_ms;
use crate::upstream::{BackendState, Pool};
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::{background_service, BackgroundService, GenBackgroundService};
use portcullis_policy::cull::CullNote;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

type StateKey = (String, SocketAddr);

/// What the loop remembers about one backend.
#[derive(Debug, Default)]
struct Tracked {
    state: CullState,
    /// Totals already added to the fleet counters.
    pushed: (u64, u64),
    /// Last readmission (Unix seconds): fleet errors before it are forgiven.
    since_secs: u64,
    /// Culled as a latency outlier: the probe must also answer within this (µs).
    probe_within_us: Option<u64>,
    /// The rule it was ejected by (published while this instance holds the lease).
    rule: Option<&'static str>,
}

/// One backend's turn in a tick.
struct Step<'a> {
    pool: &'a Pool,
    b: &'a Arc<BackendState>,
    /// Errors in the window (for logs and the webhook).
    errors: u64,
    now_ms: u64,
    /// The rule that made it a candidate, and an outlier's figures.
    why: Why,
}

/// Which culling rule made a backend a candidate (CONTRACT §15: the journal says).
#[derive(Debug, Clone, Copy)]
enum Why {
    ErrorThreshold,
    Outlier(Outlier),
}

impl Why {
    fn rule(&self) -> &'static str {
        match self {
            Why::ErrorThreshold => "error_threshold",
            Why::Outlier(o) => o.rule.as_str(),
        }
    }

    fn figures(&self) -> Option<String> {
        match self {
            Why::ErrorThreshold => None,
            Why::Outlier(o) => Some(o.describe()),
        }
    }
}

/// The culling driver: performs what the policy decides.
pub struct Culling {
    shared: Arc<Shared>,
    budget: Arc<dyn BudgetStore>,
    /// The fleet view the sync keeps: `[budget]`'s `max_concurrent` and one group at a
    /// time hold culls back too (`None`: no view, as in unit tests).
    view: Option<Arc<crate::fleet::sync::FleetView>>,
    /// This process's id in the fleet's blame records.
    instance: u64,
}

/// What the loop remembers between ticks.
#[derive(Debug, Default)]
pub struct Memory {
    states: HashMap<StateKey, Tracked>,
    /// Upstreams currently failing systemically (logged once per episode).
    systemic: HashSet<String>,
    /// `blame_tenants`: the identities whose slow answers were their own at the last
    /// check, per upstream (logged once per episode).
    excused: HashMap<String, HashSet<u64>>,
}

/// The background service over `budget` (fleet-wide in Redis, or in-process).
pub fn service(
    shared: Arc<Shared>,
    budget: Arc<dyn BudgetStore>,
    view: Arc<crate::fleet::sync::FleetView>,
) -> GenBackgroundService<Culling> {
    let mut culling = Culling::new(shared, budget);
    culling.view = Some(view);
    background_service("culling", culling)
}

#[async_trait]
impl BackgroundService for Culling {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut memory = Memory::default();
        loop {
            let interval = {
                let rt = self.shared.runtime.load();
                Duration::from_secs(rt.config.culling.params.check_interval_secs.max(1))
            };
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.changed() => return,
            }
            self.tick(&mut memory, unix_ms()).await;
        }
    }
}

impl Culling {
    pub fn new(shared: Arc<Shared>, budget: Arc<dyn BudgetStore>) -> Self {
        let tokens = shared.runtime.load().config.culling.params.tokens;
        shared.metrics.cull.tokens_available.set(i64::from(tokens));
        Self {
            shared,
            budget,
            view: None,
            instance: fastrand::u64(1..),
        }
    }

    /// A cull refused by `[budget]`'s `max_concurrent` or one group at a time, from the
    /// fleet view, as the over-budget answer the state machine knows (it stays in rotation
    /// and is asked again next check); `None` when the budget may be asked.
    fn held_back(&self, pool: &Pool, b: &BackendState) -> Option<ClaimOutcome> {
        use portcullis_policy::cull::claims::{check_cull, ClaimRefusal};
        let state = self.view.as_ref()?.load()?;
        let rt = self.shared.runtime.load_full();
        let groups = |u: &str, be: &str| crate::fleet::checks::named_groups(&rt, u, be);
        let refusal =
            check_cull(&pool.name, &b.addr_str, &groups, &state, &rt.config.budget).err()?;
        tracing::warn!(event = "cull", upstream = %pool.name, backend = %b.addr_str, reason = %refusal.reason(), "cull held back by [budget]");
        let (active, max_out) = match refusal {
            ClaimRefusal::MaxConcurrent { active, max } => (active, max),
            _ => (0, 0),
        };
        Some(ClaimOutcome::OverBudget { active, max_out })
    }

    /// One check at `now_ms` (Unix ms).
    pub async fn tick(&self, memory: &mut Memory, now_ms: u64) {
        let rt = self.shared.runtime.load_full();
        let cfg = &rt.config.culling;
        if !cfg.enabled {
            self.readmit_all(memory, &rt.pools).await;
            return;
        }
        let params = cfg.params.clone();
        let names: Vec<&str> = rt.pools.iter().map(|p| p.name.as_str()).collect();
        let snapshot = self.budget.snapshot(&names, &params).await;
        match &snapshot {
            Ok(s) => self
                .shared
                .metrics
                .cull
                .tokens_available
                .set(s.tokens_available.floor() as i64),
            Err(e) => {
                tracing::warn!(event = "cull", error = %e, "budget store unreachable; no new culls")
            }
        }
        let now_secs = now_ms / 1000;
        let mut live: HashSet<StateKey> = HashSet::new();
        let buckets = Buckets::new(params.window_secs, params.check_interval_secs);
        for (pi, pool) in rt.pools.iter().enumerate() {
            for b in &pool.backends {
                live.insert((pool.name.clone(), b.addr));
            }
            let mut samples = self
                .samples(pool, &mut memory.states, now_secs, buckets)
                .await;
            if cfg.blame_tenants {
                // Before any rule judges the backends: errors a blamed key caused are not
                // theirs (CONTRACT §15).
                self.blame(pool, &mut samples, &params, now_ms).await;
            }
            let eval = evaluate_sharded(&samples, params.error_threshold, pool.balance.shard_size);
            report_systemic(&self.shared, &mut memory.systemic, pool, &eval);
            // The outlier rules; an upstream the error rule calls systemic culls nothing.
            let outliers = match eval {
                Evaluation::Systemic { .. } => OutlierVerdict::Off,
                _ => {
                    let excuse = cfg.blame_tenants.then_some(&mut memory.excused);
                    self.outliers(pool, &samples, &params, now_secs, excuse)
                }
            };
            let mut notes: Vec<CullNote> = Vec::new();
            let mut following = false;
            for (bi, b) in pool.backends.iter().enumerate() {
                if b.manual().state() == crate::upstream::ManualState::Maint {
                    // In maintenance: neither culled, probed nor readmitted by the loop
                    // until a person says `ready` (CONTRACT §12).
                    continue;
                }
                let tracked = memory
                    .states
                    .entry((pool.name.clone(), b.addr))
                    .or_default();
                let outlier = outliers.find(bi).copied();
                self.shared.observe.culls.set_outlier(
                    &pool.name,
                    &b.addr_str,
                    outlier
                        .as_ref()
                        .map(crate::observe::journal::OutlierView::of),
                );
                let over_threshold = eval.candidates().contains(&bi);
                let why = match outlier {
                    Some(o) if !over_threshold => Why::Outlier(o),
                    _ => Why::ErrorThreshold,
                };
                let input = TickInput {
                    now_ms,
                    candidate: over_threshold || outlier.is_some(),
                    fleet_claimed: fleet_claimed(&snapshot, pi, &b.addr_str),
                };
                let action = tracked.state.on_tick(input, &params);
                if !params.dry_run || !input.candidate {
                    // The dry-run report says what culling would do now: it clears once
                    // the backend is no longer a candidate (or dry run is switched off).
                    b.set_dry_run_cull(false);
                }
                let errors = samples[bi].errors;
                let step = Step {
                    pool,
                    b,
                    errors,
                    now_ms,
                    why,
                };
                let claim = self.perform(step, tracked, action, &params).await;
                b.set_failing(failing_reason(FailingInput {
                    over_threshold: errors >= params.error_threshold.max(1) || outlier.is_some(),
                    ejected: b.is_culled(),
                    candidate: input.candidate,
                    others_in_rotation: in_rotation(pool, b),
                    claim: claim.as_ref(),
                }));
                self.shared
                    .observe
                    .culls
                    .set_lease(&pool.name, &b.addr_str, &tracked.state);
                match (&tracked.state, tracked.rule) {
                    (CullState::Culled { .. } | CullState::Probing { .. }, Some(rule)) => notes
                        .push(CullNote {
                            backend: b.addr_str.clone(),
                            by: this_instance().to_string(),
                            rule: rule.to_string(),
                            until_ms: now_ms.saturating_add(params.lease_ttl_ms()),
                        }),
                    (CullState::Following { .. }, _) => following = true,
                    _ => {}
                }
                if matches!(tracked.state, CullState::Following { .. }) {
                    // Another instance holds the lease: its time left, from the store.
                    if let Some(left) = fleet_claim_left_ms(&snapshot, pi, &b.addr_str) {
                        self.shared.observe.culls.set_following_until(
                            &pool.name,
                            &b.addr_str,
                            now_ms.saturating_add(left),
                        );
                    }
                }
            }
            // Who culled what: publish the culls this instance holds, and learn who culled
            // the ones it follows (one round trip, only when there is either).
            if !notes.is_empty() || following {
                if let Some(Ok(fleet)) = self
                    .budget
                    .exchange_cull_notes(&pool.name, &notes, now_ms)
                    .await
                {
                    for n in fleet {
                        self.shared
                            .observe
                            .culls
                            .set_following_note(&pool.name, &n.backend, &n.by, &n.rule);
                    }
                }
            }
        }
        memory.states.retain(|k, _| live.contains(k));
        memory
            .excused
            .retain(|name, _| names.contains(&name.as_str()));
    }

    /// The outlier rule's verdict on `pool` (CONTRACT §15): success rates from the same
    /// samples as the error rule (fleet-wide counts), latencies from this instance's
    /// windows (each instance judges what it saw; the cull itself spends a fleet token).
    ///
    /// `excuse` (with `blame_tenants`): the slow answers of an identity that is slow where
    /// other identities are fast are taken out of each backend's latencies first
    /// ([`Self::excuse_slow`]).
    fn outliers(
        &self,
        pool: &Pool,
        samples: &[BackendSample],
        params: &CullParams,
        now_secs: u64,
        excuse: Option<&mut HashMap<String, HashSet<u64>>>,
    ) -> OutlierVerdict {
        if params.outlier.rule == OutlierRule::None {
            return OutlierVerdict::Off;
        }
        let latency = params.outlier.rule == OutlierRule::Latency;
        let mut windows: Vec<LatencyBuckets> = if latency {
            pool.backends
                .iter()
                .map(|b| LatencyBuckets(b.latency.buckets(now_secs)))
                .collect()
        } else {
            Vec::new()
        };
        if let (true, Some(excused)) = (latency, excuse) {
            self.excuse_slow(pool, &mut windows, params, now_secs, excused);
        }
        // `samples` and `windows` are in the order of `pool.backends`.
        let peers: Vec<PeerSample> = samples
            .iter()
            .enumerate()
            .map(|(i, s)| PeerSample {
                index: s.index,
                requests: s.requests,
                errors: s.errors,
                latency: windows
                    .get(i)
                    .map(LatencyBuckets::summary)
                    .unwrap_or_default(),
            })
            .collect();
        let verdict = evaluate_outliers(&peers, &params.outlier);
        if let OutlierVerdict::Systemic { judged, outliers } = verdict {
            tracing::debug!(event = "cull", upstream = %pool.name, judged, outliers, "outliers alike; culling none");
        }
        verdict
    }

    /// `blame_tenants` with the latency rule: draw the line over which an answer is slow,
    /// publish it for the request path (which records slow answers by identity), find the
    /// identities that are slow where others are fast ([`super::attributed_slow`]: at least
    /// a tenth of `outlier_min_requests` slow answers, the fewest that can move a judged
    /// backend's p90) and take their slow answers out of `windows`. Nobody is limited for
    /// being slow; the excuse is logged once per episode.
    fn excuse_slow(
        &self,
        pool: &Pool,
        windows: &mut [LatencyBuckets],
        params: &CullParams,
        now_secs: u64,
        excused: &mut HashMap<String, HashSet<u64>>,
    ) {
        let summaries: Vec<_> = windows.iter().map(LatencyBuckets::summary).collect();
        let line = super::slow_line_us(&summaries, &params.outlier);
        let counts: Vec<super::SlowCounts> = pool
            .backends
            .iter()
            .zip(windows.iter())
            .zip(&summaries)
            .map(|((b, w), s)| super::SlowCounts {
                addr: b.addr,
                answers: s.samples,
                slow: w.count_over(line),
            })
            .collect();
        // The slices the latency windows read (a reload that changed `window_seconds`
        // rebuilds no window: the backends' own slice).
        let slice = pool.backends.first().map_or_else(
            || super::latency_slice_secs(params.window_secs),
            |b| b.latency.slice_secs(),
        );
        let ledger = pool.shared.slow_ledger.snapshot(now_secs, slice);
        let min_slow = (params.outlier.min_requests / 10).max(1);
        let found = super::attributed_slow(&ledger, &counts, min_slow);
        for f in &found {
            for (addr, n) in &f.backends {
                if let Some(i) = pool.backends.iter().position(|b| b.addr == *addr) {
                    windows[i].trim_top(*n);
                }
            }
        }
        pool.shared
            .slow_line_us
            .store(line, std::sync::atomic::Ordering::Relaxed);
        let now: HashSet<u64> = found.iter().map(|f| f.key).collect();
        let before = excused.entry(pool.name.clone()).or_default();
        for f in found.iter().filter(|f| !before.contains(&f.key)) {
            let backends: Vec<String> = f.backends.iter().map(|(a, _)| a.to_string()).collect();
            let figures = format!(
                "key {} made {} answers over {:.1} ms on {} backends where other keys are fast; not counted against them",
                super::blame::tag(f.key),
                f.errors(),
                line as f64 / 1000.0,
                f.backends.len()
            );
            tracing::info!(event = "cull", result = "excused", upstream = %pool.name, backends = %backends.join(","), figures = %figures, "a key's slow answers are its own");
        }
        *before = now;
    }

    /// `blame_tenants`: blame the keys that cause most errors on two or more backends while
    /// other keys succeed there ([`super::find_blamed`]) and limit them for the cooldown;
    /// share blames and suspects (a key that is the main cause on one backend so far,
    /// [`super::attributed`]) through the store; and take the errors of every blamed or
    /// suspect key, this instance's or the fleet's, out of `samples`.
    async fn blame(
        &self,
        pool: &Pool,
        samples: &mut [BackendSample],
        params: &CullParams,
        now_ms: u64,
    ) {
        let now_secs = now_ms / 1000;
        let blamed = &pool.shared.blamed;
        blamed.expire(now_ms);
        let ledger = pool
            .shared
            .blame_ledger
            .snapshot(now_secs, params.window_secs);
        let counts: Vec<super::BackendCounts> = pool
            .backends
            .iter()
            .zip(samples.iter())
            .map(|(b, s)| super::BackendCounts {
                addr: b.addr,
                requests: s.requests,
                errors: s.errors,
            })
            .collect();
        let suspect_until =
            now_ms.saturating_add(3 * params.check_interval_secs.max(1).saturating_mul(1000));
        let mut published: Vec<super::FleetBlame> = Vec::new();
        for found in super::attributed(&ledger, &counts, params.error_threshold) {
            let limit = found.backends.len() >= super::BLAME_MIN_BACKENDS;
            let until = if limit {
                now_ms.saturating_add(params.cooldown_ms())
            } else {
                suspect_until
            };
            published.push(super::FleetBlame {
                key: found.key,
                from: self.instance,
                until_ms: until,
                limit,
                errors: ledger
                    .get(&found.key)
                    .map(|per| per.iter().map(|(a, n)| (a.to_string(), *n)).collect())
                    .unwrap_or_default(),
            });
            if !limit || blamed.limited(found.key, now_ms).is_some() {
                continue;
            }
            blamed.blame(found.key, until);
            self.record_blame(pool, &found, params);
        }
        // Keys limited already (by us or the fleet): what this instance saw of them is
        // published too, so the others can take it out of the fleet's counts.
        for (key, per) in &ledger {
            if published.iter().any(|p| p.key == *key) {
                continue;
            }
            if let Some(secs) = blamed.limited(*key, now_ms) {
                published.push(self.fleet_blame(*key, now_ms + secs * 1000, true, per));
            }
        }
        // Fleet-wide through the store, like a cull: publish ours, follow the others'.
        let fleet = match self
            .budget
            .exchange_blame(&pool.name, &published, now_ms)
            .await
        {
            Some(Ok(fleet)) => fleet,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "fleet blame unavailable; this instance's only");
                published.clone()
            }
            None => published.clone(),
        };
        // The errors to take out, per backend: what the other instances published of each
        // blamed or suspect key, plus what this one saw of it (the fleet's counts are sums).
        let mut theirs: HashMap<(u64, String), u64> = HashMap::new();
        let mut keys: HashSet<u64> = HashSet::new();
        for fb in &fleet {
            keys.insert(fb.key);
            if fb.limit {
                if blamed.limited(fb.key, now_ms).is_none() {
                    tracing::info!(event = "cull", result = "blamed", upstream = %pool.name, key = %super::blame::tag(fb.key), "following the fleet's blame");
                }
                blamed.blame(fb.key, fb.until_ms);
            }
            if fb.from == self.instance {
                continue;
            }
            for (b, n) in &fb.errors {
                *theirs.entry((fb.key, b.clone())).or_insert(0) += *n;
            }
        }
        // A key the fleet blames that this instance has errors of but did not publish yet:
        // publish them now (a second round trip, only then), so no instance mistakes them
        // for the backends' before this one's next check.
        let late: Vec<super::FleetBlame> = fleet
            .iter()
            .filter(|fb| fb.limit && !published.iter().any(|p| p.key == fb.key))
            .filter_map(|fb| {
                let per = ledger.get(&fb.key)?;
                Some(self.fleet_blame(fb.key, fb.until_ms, true, per))
            })
            .collect();
        if !late.is_empty() {
            if let Some(Err(e)) = self.budget.exchange_blame(&pool.name, &late, now_ms).await {
                tracing::debug!(error = %e, "fleet blame unavailable");
            }
        }
        for key in &keys {
            for (addr, n) in ledger.get(key).into_iter().flatten() {
                *theirs.entry((*key, addr.to_string())).or_insert(0) += *n;
            }
        }
        for (s, b) in samples.iter_mut().zip(&pool.backends) {
            let n: u64 = theirs
                .iter()
                .filter(|((_, addr), _)| *addr == b.addr_str)
                .map(|(_, n)| *n)
                .sum();
            s.errors -= n.min(s.errors);
            s.requests -= n.min(s.requests);
        }
    }

    /// This instance's record of `key` for the fleet: its errors per backend.
    fn fleet_blame(
        &self,
        key: u64,
        until_ms: u64,
        limit: bool,
        per: &HashMap<std::net::SocketAddr, u64>,
    ) -> super::FleetBlame {
        super::FleetBlame {
            key,
            from: self.instance,
            until_ms,
            limit,
            errors: per.iter().map(|(a, n)| (a.to_string(), *n)).collect(),
        }
    }

    /// A key blamed here: the metric, the log line and the journal.
    fn record_blame(&self, pool: &Pool, found: &super::Blamed, params: &CullParams) {
        let tenant = pool.shared.blame_names.label(found.key);
        self.shared
            .metrics
            .cull
            .blamed
            .with_label_values(&[&*tenant])
            .inc();
        let backends: Vec<String> = found.backends.iter().map(|(a, _)| a.to_string()).collect();
        let figures = format!(
            "key {} caused {} errors on {} backends; limited for {} s",
            super::blame::tag(found.key),
            found.errors(),
            found.backends.len(),
            params.cooldown_secs
        );
        tracing::warn!(event = "cull", result = "blamed", upstream = %pool.name, tenant = %tenant, backends = %backends.join(","), figures = %figures, "a key causes the errors: limited instead of culling backends");
        self.shared
            .observe
            .culls
            .record(crate::observe::journal::CullEntry {
                at_ms: unix_ms(),
                upstream: pool.name.clone(),
                backend: backends.join(","),
                result: "blamed",
                errors: found.errors(),
                rule: Some("blame_tenants"),
                figures: Some(figures),
                ..Default::default()
            });
    }

    /// Each backend's `(requests, errors)` over the window: the larger of this
    /// instance's window and the fleet's counters (after adding our deltas).
    async fn samples(
        &self,
        pool: &Pool,
        states: &mut HashMap<StateKey, Tracked>,
        now_secs: u64,
        buckets: Buckets,
    ) -> Vec<BackendSample> {
        let mut totals = Vec::with_capacity(pool.backends.len());
        let mut deltas = Vec::with_capacity(pool.backends.len());
        for b in &pool.backends {
            let t = states.entry((pool.name.clone(), b.addr)).or_default();
            let (r, e) = b.totals();
            totals.push((r, e));
            deltas.push(FleetDelta {
                backend: b.addr_str.clone(),
                requests: r.saturating_sub(t.pushed.0),
                errors: e.saturating_sub(t.pushed.1),
                since_secs: t.since_secs,
            });
        }
        let fleet = match self
            .budget
            .exchange_errors(&pool.name, &deltas, now_secs, buckets)
            .await
        {
            Some(Ok(f)) => Some(f),
            Some(Err(e)) => {
                // Deltas stay unsent and go with the next successful exchange.
                tracing::debug!(error = %e, "fleet error counts unavailable; using local counts");
                None
            }
            None => None,
        };
        let delivered = fleet.is_some() || self.budget.kind() == "local";
        pool.backends
            .iter()
            .enumerate()
            .map(|(index, b)| {
                if delivered {
                    if let Some(t) = states.get_mut(&(pool.name.clone(), b.addr)) {
                        t.pushed = totals[index];
                    }
                }
                let (mut requests, mut errors) = b.window.totals(now_secs);
                if let Some((fr, fe)) = fleet.as_ref().and_then(|f| f.get(index)) {
                    requests = requests.max(*fr);
                    errors = errors.max(*fe);
                }
                BackendSample {
                    index,
                    requests,
                    errors,
                }
            })
            .collect()
    }

    /// Carry out an action and whatever follow-up the state machine asks for.
    /// Returns the budget's answer when a claim was asked for.
    async fn perform(
        &self,
        step: Step<'_>,
        tracked: &mut Tracked,
        mut action: Action,
        params: &CullParams,
    ) -> Option<Result<ClaimOutcome, StoreError>> {
        let Step {
            pool,
            b,
            errors,
            now_ms,
            why,
        } = step;
        let total = u32::try_from(pool.backends.len()).unwrap_or(u32::MAX);
        let mut claim = None;
        // Each step changes the state, so this ends; the bound is a fail-safe.
        for _ in 0..4 {
            action = match action {
                Action::None => return claim,
                Action::Claim => {
                    let res = match self.held_back(pool, b) {
                        Some(refused) => Ok(refused),
                        None => {
                            self.budget
                                .claim(&pool.name, &b.addr_str, total, params)
                                .await
                        }
                    };
                    self.record_claim(pool, b, &res, errors, why);
                    if params.dry_run {
                        b.set_dry_run_cull(matches!(
                            res,
                            Ok(ClaimOutcome::Granted { dry_run: true, .. })
                        ));
                    }
                    let next = tracked.state.on_claim(now_ms, &res, params);
                    claim = Some(res);
                    next
                }
                Action::Eject => {
                    self.take_out(b, claim.is_some()).await;
                    tracked.rule = Some(why.rule());
                    tracked.probe_within_us = match why {
                        Why::Outlier(o) if o.rule == OutlierRule::Latency => Some(o.limit as u64),
                        _ => None,
                    };
                    tracing::warn!(
                        event = "cull",
                        upstream = %pool.name,
                        backend = %b.addr_str,
                        errors,
                        rule = why.rule(),
                        figures = why.figures().unwrap_or_default(),
                        "backend ejected; draining in-flight requests"
                    );
                    let url = &self.shared.runtime.load().config.culling.webhook_url;
                    webhook::notify(url, &pool.name, &b.addr_str, why.rule(), errors);
                    Action::None
                }
                Action::Renew => {
                    let res = self
                        .budget
                        .renew(&pool.name, &b.addr_str, params.lease_ttl_ms())
                        .await;
                    tracked.state.on_renew(now_ms, &res, params)
                }
                Action::Probe => {
                    let healthy = probe(pool, b, tracked.probe_within_us).await;
                    tracing::info!(event = "cull", upstream = %pool.name, backend = %b.addr_str, healthy, "probe after cooldown");
                    tracked.state.on_probe(now_ms, healthy, params)
                }
                Action::Readmit => {
                    self.readmit(pool, b, true);
                    tracked.since_secs = now_ms / 1000;
                    Action::None
                }
                Action::ReleaseAndReadmit => {
                    if let Err(e) = self.budget.release(&pool.name, &b.addr_str).await {
                        tracing::warn!(error = %e, "release failed; the lease will expire by itself");
                    }
                    self.readmit(pool, b, true);
                    tracked.since_secs = now_ms / 1000;
                    Action::None
                }
            };
        }
        claim
    }

    /// Take `b` out of rotation: `granted` here (a claim this loop just won), or followed
    /// (another instance's cull this loop saw). With the fleet view, what is out is set
    /// from one read of the store (the culls with the operations): a grant reads it again
    /// at once (the grant alone is set only if that read fails), a followed cull is set by
    /// the fleet sync's read. A cull set beside operations of an older read showed more
    /// than `max_culled_fraction` out where the store never held it.
    async fn take_out(&self, b: &BackendState, granted: bool) {
        let Some(view) = &self.view else {
            b.set_culled(true);
            return;
        };
        if !granted {
            return;
        }
        let rt = self.shared.runtime.load_full();
        let read = crate::fleet::sync::read_and_apply(&rt, &*self.budget, view).await;
        if read.is_err() || !b.is_culled() {
            b.set_culled(true);
        }
    }

    fn record_claim(
        &self,
        pool: &Pool,
        b: &BackendState,
        res: &Result<ClaimOutcome, StoreError>,
        errors: u64,
        why: Why,
    ) {
        let result = match res {
            Ok(o) => match o.decision_label() {
                Some("culled") => CullResult::Culled,
                Some("dry_run") => CullResult::DryRun,
                Some("no_token") => CullResult::NoToken,
                Some("over_budget") => CullResult::OverBudget,
                _ => CullResult::Renewed,
            },
            Err(_) => CullResult::StoreError,
        };
        self.shared.metrics.cull.decision(result);
        self.journal(pool, b, result, errors, Some(why));
        tracing::info!(
            event = "cull_decision",
            result = result.as_str(),
            upstream = %pool.name,
            backend = %b.addr_str,
            errors,
            rule = why.rule(),
            figures = why.figures().unwrap_or_default(),
        );
    }

    /// Keep the decision for the status page.
    fn journal(
        &self,
        pool: &Pool,
        b: &BackendState,
        result: CullResult,
        errors: u64,
        why: Option<Why>,
    ) {
        self.shared
            .observe
            .culls
            .record(crate::observe::journal::CullEntry {
                at_ms: unix_ms(),
                upstream: pool.name.clone(),
                backend: b.addr_str.clone(),
                result: result.as_str(),
                errors,
                rule: why.map(|w| w.rule()),
                figures: why.and_then(|w| w.figures()),
                ..Default::default()
            });
    }

    /// Back in rotation; `was_out`: the state machine had it out (a followed cull the
    /// fleet sync already put back still counts as readmitted).
    fn readmit(&self, pool: &Pool, b: &BackendState, was_out: bool) {
        let was = was_out || b.is_culled();
        b.set_culled(false);
        b.set_dry_run_cull(false);
        b.window.reset();
        b.latency.reset();
        if was {
            self.shared.metrics.cull.decision(CullResult::Readmitted);
            self.journal(pool, b, CullResult::Readmitted, 0, None);
            tracing::info!(event = "cull", upstream = %pool.name, backend = %b.addr_str, "backend readmitted");
        }
    }

    async fn readmit_all(&self, memory: &mut Memory, pools: &[Arc<Pool>]) {
        for pool in pools {
            for b in &pool.backends {
                b.set_failing(None);
                if b.is_culled() {
                    if let Err(e) = self.budget.release(&pool.name, &b.addr_str).await {
                        tracing::debug!(error = %e, "release on disable failed");
                    }
                    self.readmit(pool, b, false);
                }
            }
        }
        memory.states.clear();
    }
}

fn report_systemic(
    shared: &Shared,
    systemic: &mut HashSet<String>,
    pool: &Pool,
    eval: &Evaluation,
) {
    match eval {
        Evaluation::Systemic { failing, total } => {
            shared.metrics.cull.decision(CullResult::Systemic);
            if systemic.insert(pool.name.clone()) {
                tracing::warn!(
                    event = "cull",
                    result = "systemic",
                    upstream = %pool.name,
                    failing,
                    total,
                    "backends fail alike; culling nothing"
                );
            }
        }
        _ => {
            if systemic.remove(&pool.name) {
                tracing::info!(event = "cull", upstream = %pool.name, "no longer a systemic failure");
            }
        }
    }
}

/// Backends of `pool` other than `b` that are in rotation (not culled).
fn in_rotation(pool: &Pool, b: &BackendState) -> usize {
    pool.backends
        .iter()
        .filter(|o| o.addr != b.addr && !o.is_culled())
        .count()
}

/// This instance as the store's cull notes name it (`host:pid`).
fn this_instance() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(crate::watchdog::instance_id)
}

/// The time left of the fleet's claim on `backend` (the store's `remaining_ms`).
fn fleet_claim_left_ms(
    snapshot: &Result<BudgetSnapshot, StoreError>,
    pool_index: usize,
    backend: &str,
) -> Option<u64> {
    snapshot
        .as_ref()
        .ok()?
        .claims
        .get(pool_index)?
        .iter()
        .find(|c| c.backend == backend)
        .map(|c| c.remaining_ms)
}

fn fleet_claimed(
    snapshot: &Result<BudgetSnapshot, StoreError>,
    pool_index: usize,
    backend: &str,
) -> Option<bool> {
    match snapshot {
        Ok(s) => Some(
            s.claims
                .get(pool_index)
                .is_some_and(|c| c.iter().any(|c| c.backend == backend)),
        ),
        Err(_) => None,
    }
}

/// Probe a culled backend: its `health_check_path` (2xx = healthy) if set,
/// else a trial `GET /` (anything below 500 = healthy). A backend culled as a latency
/// outlier must also answer within `within_us` (the line it crossed).
async fn probe(pool: &Pool, b: &BackendState, within_us: Option<u64>) -> bool {
    let (path, want_2xx) = if pool.health_check_path.is_empty() {
        ("/", false)
    } else {
        (pool.health_check_path.as_str(), true)
    };
    // The health check's Host (its `host`, the `sni`, or the backend as written), so a
    // name-based virtual host answers the probe as it answers the check.
    let host = pool.probe_host(b);
    let bound = pool.connect_timeout + Duration::from_secs(2);
    let answer = http::timed_status_of(
        b.addr,
        "GET",
        path,
        &host,
        "portcullis-cull-probe",
        None,
        bound,
    )
    .await;
    let in_time = |took: Duration| {
        within_us.is_none_or(|limit| u64::try_from(took.as_micros()).unwrap_or(u64::MAX) <= limit)
    };
    match answer {
        Ok((status, took)) if want_2xx => pool.probe_passes(status) && in_time(took),
        Ok((status, took)) => status < 500 && in_time(took),
        Err(_) => false,
    }
}
