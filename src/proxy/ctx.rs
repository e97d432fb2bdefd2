//! The per-request state the proxy phases share ([`Ctx`]), grouped by the phase that fills
//! it: routing, the gates' admissions, the upstream attempts and the answer.

use std::sync::Arc;
use std::time::Instant;

use crate::edge;
use crate::gate::Admitted;
use crate::respond::Refusal;
use crate::state::Runtime;
use crate::upstream::{Attempt, BackendState, Pool, Tried};
use portcullis_policy::verdict::Outcome;

/// Per-request state, grouped by the phase that fills it.
pub struct Ctx {
    pub(super) start: Instant,
    /// The configuration this request is served under, start to end.
    pub(super) runtime: Arc<Runtime>,
    pub(super) routing: Routing,
    /// What the gates admitted the request with (slots released when it ends).
    pub(super) gates: Admitted,
    pub(super) upstream: Upstream,
    pub(super) answer: Answer,
    /// Trace context and upstream timing for the access log and metrics.
    pub(super) obs: super::telemetry::RequestObs,
    /// Request body bytes seen (`max_request_body_bytes`).
    pub(super) body: edge::limits::BodyCount,
    /// Counts the request as in flight on its thread (send coalescing, `batch.rs`);
    /// an open tunnel is no longer counted.
    pub(super) _in_flight: Option<super::batch::InFlight>,
}

/// Where the request goes: its route, its upstream and its client.
#[derive(Default)]
pub(super) struct Routing {
    /// The request was routed (`request_filter` ran): `route` is its route.
    pub(super) routed: bool,
    /// Index in `runtime.config.routes` of the route; `None`: the default route.
    pub(super) route: Option<usize>,
    pub(super) pool: Option<Arc<Pool>>,
    /// The client address (CONTRACT §7): the rate-limit key's and the logs'.
    pub(super) client: Option<std::net::IpAddr>,
}

/// The upstream attempts: the backend of the current one, and what retries may use.
#[derive(Default)]
pub(super) struct Upstream {
    pub(super) backend: Option<Arc<BackendState>>,
    /// Counts the current attempt in its backend's in-flight (least_requests).
    pub(super) attempt: Option<Attempt>,
    /// When the current attempt started (the adaptive limit's latency sample).
    pub(super) attempt_start: Option<Instant>,
    /// 502/503/reset retries taken so far.
    pub(super) retries_used: u32,
    /// `upstream_response_filter` turned a 502/503 into an error to retry.
    pub(super) retrying: bool,
    pub(super) tried: Tried,
}

/// How the request was answered, for the response filters, logs and metrics.
#[derive(Default)]
pub(super) struct Answer {
    pub(super) outcome: Option<Outcome>,
    /// What a gate refused the request with, when it answers through an error
    /// (`early_request_filter`, `upstream_peer`).
    pub(super) refusal: Option<Refusal>,
    /// X-Request-Id sent upstream and back (the client's, or generated).
    pub(super) request_id: Option<http::HeaderValue>,
    /// A gRPC call failed by gRPC semantics (`grpc-status`): a backend error.
    pub(super) grpc_failed: bool,
    /// The request's cost was charged to its tenant's quota (at the response header).
    pub(super) charged: bool,
}

/// A routed request leaves its route's in-flight count when its context goes,
/// whichever way the request ended.
impl Drop for Ctx {
    fn drop(&mut self) {
        if self.routing.routed {
            self.runtime
                .route_series(true, self.routing.route)
                .traffic
                .exit();
        }
    }
}

impl Ctx {
    pub(super) fn new(runtime: Arc<Runtime>) -> Ctx {
        Ctx {
            start: Instant::now(),
            runtime,
            routing: Routing::default(),
            gates: Admitted::default(),
            upstream: Upstream::default(),
            answer: Answer::default(),
            obs: Default::default(),
            body: edge::limits::BodyCount::default(),
            _in_flight: Some(super::batch::InFlight::new()),
        }
    }
}
