//! Where a request ends, and where an attempt given up for a retry ends: the one place
//! that settles what the request owes. In order, at the end (`logging`, [`request`]): the
//! latency sample of the adaptive caps, the tenant's count and charge, the backend's error
//! record and the blame of a failing caller, the latency outlier rule's window (and the
//! blame of a slow caller), then the metrics and the access-log line ([`telemetry`]). An
//! attempt given up (`fail_to_connect`, a 502/503 or a reset taken for a retry) leaves its
//! backend's error and traffic records ([`failed_attempt`]); a cost header charges the
//! tenant at the response header ([`charge`]), at most once a request.
//!
//! [`telemetry`]: super::telemetry

use std::time::Instant;

use pingora::proxy::Session;
use pingora::Error;
use portcullis_policy::traffic::class_of;
use portcullis_policy::verdict::Outcome;
use portcullis_store::clock::{unix_ms, unix_secs};

use super::{telemetry, Ctx};
use crate::state::Shared;
use crate::upstream::BackendState;

/// An attempt given up: its backend did not answer (`status` `None`: a failed connect, a
/// reset) or answered `status` (a 502/503 retried elsewhere) after `us` µs. Counted as the
/// backend's error, and in its traffic by the answer's class.
#[inline]
pub(super) fn failed_attempt(b: &BackendState, status: Option<u16>, us: Option<u64>) {
    b.record(unix_secs(), true);
    let now_secs = crate::observe::traffic::secs(Instant::now());
    b.traffic.record(now_secs, class_of(status), us);
}

/// Charge the request's tenant `cost` units of its quota, once a request (the response
/// header's cost, or 1 at the end). Nothing for a request of no metered tenant.
#[inline]
pub(super) fn charge(shared: &Shared, ctx: &mut Ctx, cost: u64) {
    if ctx.answer.charged {
        return;
    }
    if let Some(t) = ctx
        .gates
        .caller
        .tenant
        .as_deref()
        .filter(|t| t.tier.quota > 0)
    {
        shared
            .tenant_quota
            .charge(t.quota_key, t.tier.period, cost, unix_ms());
        ctx.answer.charged = true;
    }
}

/// The request ended (`logging`): `e` is the error it ended with, if any.
pub(super) fn request(shared: &Shared, session: &mut Session, e: Option<&Error>, ctx: &mut Ctx) {
    if let Some(conn) = crate::edge::conn(session) {
        conn.request_done();
    }
    let status = session.response_written().map_or(0, |r| r.status.as_u16());
    let outcome = ctx.answer.outcome.unwrap_or(if e.is_some() {
        Outcome::UpstreamError
    } else {
        Outcome::Proxied
    });
    // One clock read for the latency sample and the request's duration.
    let now = Instant::now();
    let elapsed = now.saturating_duration_since(ctx.start);
    learn_latency(shared, ctx, e, status, now);
    if let Some(registry) = ctx.runtime.tenants.as_deref() {
        registry.count(ctx.gates.caller.tenant.as_deref(), outcome);
        // Not charged at its response header (no cost header, or no answer): 1, once the
        // request went to a backend (not when a gate refused it).
        if matches!(outcome, Outcome::Proxied | Outcome::UpstreamError) {
            charge(shared, ctx, 1);
        }
    }
    let backend = ctx.upstream.backend.take();
    if let Some(b) = &backend {
        backend_answered(ctx, b, e, status);
    }
    let route = ctx.runtime.route_at(ctx.routing.route);
    telemetry::finish(
        shared,
        session,
        &mut ctx.obs,
        telemetry::Finished {
            outcome,
            status,
            runtime: &ctx.runtime,
            route: ctx
                .runtime
                .route_series(ctx.routing.routed, ctx.routing.route),
            pool: ctx.routing.pool.as_deref(),
            backend: backend.as_deref(),
            request_id: ctx.answer.request_id.as_ref().and_then(|v| v.to_str().ok()),
            client: ctx.routing.client,
            elapsed,
            now_secs: crate::observe::traffic::secs(now),
            shadow: ctx.gates.shadow,
            // The class the gates shed it by (a tenant tier's may differ from the route's).
            priority: ctx.gates.caller.class.unwrap_or(route.priority),
            tenant: ctx.gates.caller.tenant.as_ref().map(|t| &*t.name),
        },
    );
    tracing::debug!(
        event = "request",
        status,
        outcome = outcome.as_str(),
        client = ?ctx.routing.client,
        upstream = ctx.routing.pool.as_ref().map(|p| p.name.as_str()).unwrap_or(""),
        elapsed_us = elapsed.as_micros() as u64,
    );
}

/// The adaptive caps learn from answered requests only (`status` below 500, no error):
/// the global one, and an adaptive upstream from its own latency (CONTRACT §15).
#[inline]
fn learn_latency(shared: &Shared, ctx: &Ctx, e: Option<&Error>, status: u16, now: Instant) {
    if let (Some(_), Some(t0), None) = (&ctx.upstream.backend, ctx.upstream.attempt_start, e) {
        if status > 0 && status < 500 {
            let rtt = now.saturating_duration_since(t0);
            shared.shedder.on_latency(now, rtt);
            if let Some(pool) = &ctx.routing.pool {
                pool.on_latency(now, rtt);
            }
        }
    }
}

/// The last attempt's backend: its error record (the backend's fault only: a 5xx, or an
/// error on the upstream side; a client hanging up is not), the blame of a failing caller,
/// and the latency outlier rule's window (answered attempts only, timed from the end of the
/// request body to the response header, CONTRACT §15) with the blame of a slow caller.
fn backend_answered(ctx: &Ctx, b: &BackendState, e: Option<&Error>, status: u16) {
    let now_secs = unix_secs();
    let upstream_failed = e.is_some_and(|e| matches!(e.esource(), pingora::ErrorSource::Upstream));
    let is_error = upstream_failed || status >= 500 || ctx.answer.grpc_failed;
    b.record(now_secs, is_error);
    let culling = &ctx.runtime.config.culling;
    if is_error && culling.blame_tenants {
        // Blame the caller: errors by key (the success path records nothing).
        blame(ctx, b, now_secs, false);
    }
    if let (Some(us), None, true) = (ctx.obs.backend_us(), e, status > 0) {
        if culling.params.outlier.rule == portcullis_policy::cull::OutlierRule::Latency {
            b.latency.record(now_secs, us);
            // Slow answers by key (one load and a compare for the others).
            let slow = culling.blame_tenants
                && ctx.routing.pool.as_ref().is_some_and(|p| {
                    us > p
                        .shared
                        .slow_line_us
                        .load(std::sync::atomic::Ordering::Relaxed)
                });
            if slow {
                blame(ctx, b, now_secs, true);
            }
        }
    }
}

/// `blame_tenants`: record a failing request (`slow`: an answer over the latency rule's
/// line) of the caller the gates resolved on backend `b`.
fn blame(ctx: &Ctx, b: &BackendState, now_secs: u64, slow: bool) {
    let (Some(pool), Some(who)) = (&ctx.routing.pool, ctx.gates.caller.blame) else {
        return;
    };
    let sh = &pool.shared;
    let window = ctx.runtime.config.culling.params.window_secs;
    let ledgers = (&sh.blame_ledger, &sh.slow_ledger);
    let key = crate::cull::blame::noted(&sh.key_spread, ledgers, who, now_secs, window);
    let tenant = ctx.gates.caller.tenant.as_deref().map(|t| &t.name);
    sh.blame_names.note(key, tenant);
    if slow {
        // In the slices of the backend's latency window, which it is compared with.
        let slice = b.latency.slice_secs();
        sh.slow_ledger.record(now_secs, slice, key, b.addr);
    } else {
        sh.blame_ledger.record(now_secs, window, key, b.addr);
    }
}
