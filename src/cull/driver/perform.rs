//! The actions a backend's state machine asks for: claim a budget token, eject, renew the
//! lease, probe, readmit and release; and the records each leaves (metric, journal, log).

use super::{Culling, Memory, Step, Tracked, Why};
use crate::cull::{http, webhook};
use crate::metrics::CullResult;
use crate::observe::journal::CullEntry;
use crate::upstream::{BackendState, Pool};
use portcullis_policy::cull::{Action, ClaimOutcome, CullParams, OutlierRule};
use portcullis_policy::StoreError;
use portcullis_store::clock::unix_ms;
use std::sync::Arc;
use std::time::Duration;

impl Culling {
    /// Carry out an action and whatever follow-up the state machine asks for.
    /// Returns the budget's answer when a claim was asked for.
    pub(super) async fn perform(
        &self,
        step: Step<'_>,
        tracked: &mut Tracked,
        mut action: Action,
        params: &CullParams,
    ) -> Option<Result<ClaimOutcome, StoreError>> {
        let Step {
            pool, b, now_ms, ..
        } = step;
        let mut claim = None;
        // Each step changes the state, so this ends; the bound is a fail-safe.
        for _ in 0..4 {
            action = match action {
                Action::None => return claim,
                Action::Claim => {
                    let res = self.claim(&step, params).await;
                    let next = tracked.state.on_claim(step.now_ms, &res, params);
                    claim = Some(res);
                    next
                }
                Action::Eject => {
                    self.eject(&step, tracked, claim.is_some()).await;
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

    /// Ask the budget for a token to cull `step.b` (unless `[budget]` holds it back), and
    /// record the answer.
    async fn claim(
        &self,
        step: &Step<'_>,
        params: &CullParams,
    ) -> Result<ClaimOutcome, StoreError> {
        let Step {
            pool,
            b,
            errors,
            why,
            ..
        } = *step;
        let total = u32::try_from(pool.backends.len()).unwrap_or(u32::MAX);
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
        res
    }

    /// Out of rotation by `step.why`'s rule (`granted`: by a claim this check won): the
    /// probe's bound remembered, the log line and the webhook.
    async fn eject(&self, step: &Step<'_>, tracked: &mut Tracked, granted: bool) {
        let Step {
            pool,
            b,
            errors,
            why,
            ..
        } = *step;
        self.take_out(b, granted).await;
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
        self.shared.observe.culls.record(CullEntry {
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

    pub(super) async fn readmit_all(&self, memory: &mut Memory, pools: &[Arc<Pool>]) {
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
