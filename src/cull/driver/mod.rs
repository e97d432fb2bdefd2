//! The culling check loop: every `check_interval_seconds` it reads the fleet's
//! claims in one round trip, evaluates each upstream's error windows (with the
//! systemic-failure guard), and drives each backend's [`CullState`]: claim a
//! disruption-budget token, eject, renew the lease while bad, probe after the
//! cooldown, readmit and release. Policy lives beside it in [`crate::cull`]
//! (`state`, `evaluate`, `budget`); this file only performs the actions. What the
//! loop remembers between ticks is a [`Memory`] the loop owns, and every tick
//! takes `now`, so a test can drive ticks on its own clock.

mod blame_pass;
mod outliers;
mod perform;
mod samples;

use crate::metrics::CullResult;
use crate::state::Shared;
use crate::upstream::{BackendState, Pool};
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::{background_service, BackgroundService, GenBackgroundService};
use portcullis_policy::cull::{
    evaluate_sharded, failing_reason, BackendSample, Buckets, BudgetSnapshot, BudgetStore,
    ClaimOutcome, CullNote, CullParams, CullState, Evaluation, FailingInput, Outlier,
    OutlierVerdict, TickInput,
};
use portcullis_policy::StoreError;
use portcullis_store::clock::unix_ms;
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
#[derive(Clone, Copy)]
struct Step<'a> {
    pool: &'a Pool,
    b: &'a Arc<BackendState>,
    /// Errors in the window (for logs and the webhook).
    errors: u64,
    now_ms: u64,
    /// The rule that made it a candidate, and an outlier's figures.
    why: Why,
}

/// What one check knows of one upstream, for each backend's turn.
#[derive(Clone, Copy)]
struct Check<'a> {
    pool: &'a Pool,
    /// The upstream's place in the store's snapshot.
    pool_index: usize,
    snapshot: &'a Result<BudgetSnapshot, StoreError>,
    params: &'a CullParams,
    now_ms: u64,
}

/// The rules' verdicts on one upstream's backends at one check (in `pool.backends` order).
struct Judged {
    samples: Vec<BackendSample>,
    eval: Evaluation,
    outliers: OutlierVerdict,
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
        let mut live: HashSet<StateKey> = HashSet::new();
        for (pool_index, pool) in rt.pools.iter().enumerate() {
            for b in &pool.backends {
                live.insert((pool.name.clone(), b.addr));
            }
            let judged = self
                .judge(pool, memory, &params, cfg.blame_tenants, now_ms)
                .await;
            let check = Check {
                pool,
                pool_index,
                snapshot: &snapshot,
                params: &params,
                now_ms,
            };
            self.step_backends(&check, &judged, memory).await;
        }
        memory.states.retain(|k, _| live.contains(k));
        memory
            .excused
            .retain(|name, _| names.contains(&name.as_str()));
    }

    /// The rules' verdicts on `pool`'s backends: their samples (blamed keys' errors taken
    /// out first, with `blame_tenants`), the error rule with its systemic guard, then the
    /// outlier rules (an upstream the error rule calls systemic culls nothing).
    async fn judge(
        &self,
        pool: &Pool,
        memory: &mut Memory,
        params: &CullParams,
        blame_tenants: bool,
        now_ms: u64,
    ) -> Judged {
        let now_secs = now_ms / 1000;
        let buckets = Buckets::new(params.window_secs, params.check_interval_secs);
        let mut samples = self
            .samples(pool, &mut memory.states, now_secs, buckets)
            .await;
        if blame_tenants {
            // Before any rule judges the backends: errors a blamed key caused are not
            // theirs (CONTRACT §15).
            self.blame(pool, &mut samples, params, now_ms).await;
        }
        let eval = evaluate_sharded(&samples, params.error_threshold, pool.balance.shard_size);
        report_systemic(&self.shared, &mut memory.systemic, pool, &eval);
        let outliers = match eval {
            Evaluation::Systemic { .. } => OutlierVerdict::Off,
            _ => {
                let excuse = blame_tenants.then_some(&mut memory.excused);
                self.outliers(pool, &samples, params, now_secs, excuse)
            }
        };
        Judged {
            samples,
            eval,
            outliers,
        }
    }

    /// Each backend's turn in the check, then who culled what: publish the culls this
    /// instance holds and learn who culled the ones it follows (one round trip, only when
    /// there is either).
    async fn step_backends(&self, check: &Check<'_>, judged: &Judged, memory: &mut Memory) {
        let pool = check.pool;
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
            self.step_backend(check, judged, bi, tracked).await;
            match (&tracked.state, tracked.rule) {
                (CullState::Culled { .. } | CullState::Probing { .. }, Some(rule)) => {
                    notes.push(CullNote {
                        backend: b.addr_str.clone(),
                        by: this_instance().to_string(),
                        rule: rule.to_string(),
                        until_ms: check.now_ms.saturating_add(check.params.lease_ttl_ms()),
                    })
                }
                (CullState::Following { .. }, _) => following = true,
                _ => {}
            }
        }
        if notes.is_empty() && !following {
            return;
        }
        if let Some(Ok(fleet)) = self
            .budget
            .exchange_cull_notes(&pool.name, &notes, check.now_ms)
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

    /// The `bi`th backend's turn: its state machine on this check's verdicts, the action it
    /// asks for performed, and what the status page shows of it.
    async fn step_backend(
        &self,
        check: &Check<'_>,
        judged: &Judged,
        bi: usize,
        tracked: &mut Tracked,
    ) {
        let Check {
            pool,
            pool_index,
            snapshot,
            params,
            now_ms,
        } = *check;
        let b = &pool.backends[bi];
        let outlier = judged.outliers.find(bi).copied();
        self.shared.observe.culls.set_outlier(
            &pool.name,
            &b.addr_str,
            outlier
                .as_ref()
                .map(crate::observe::journal::OutlierView::of),
        );
        let over_threshold = judged.eval.candidates().contains(&bi);
        let why = match outlier {
            Some(o) if !over_threshold => Why::Outlier(o),
            _ => Why::ErrorThreshold,
        };
        let input = TickInput {
            now_ms,
            candidate: over_threshold || outlier.is_some(),
            fleet_claimed: fleet_claimed(snapshot, pool_index, &b.addr_str),
        };
        let action = tracked.state.on_tick(input, params);
        if !params.dry_run || !input.candidate {
            // The dry-run report says what culling would do now: it clears once
            // the backend is no longer a candidate (or dry run is switched off).
            b.set_dry_run_cull(false);
        }
        let errors = judged.samples[bi].errors;
        let step = Step {
            pool,
            b,
            errors,
            now_ms,
            why,
        };
        let claim = self.perform(step, tracked, action, params).await;
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
        if matches!(tracked.state, CullState::Following { .. }) {
            // Another instance holds the lease: its time left, from the store.
            if let Some(left) = fleet_claim_left_ms(snapshot, pool_index, &b.addr_str) {
                self.shared.observe.culls.set_following_until(
                    &pool.name,
                    &b.addr_str,
                    now_ms.saturating_add(left),
                );
            }
        }
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
