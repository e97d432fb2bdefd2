//! The per-request state the proxy phases share ([`Ctx`]).

use std::sync::Arc;
use std::time::Instant;

use crate::edge;
use crate::metrics::Outcome;
use crate::respond::{RateFields, Refusal};
use crate::shed::InflightGuard;
use crate::state::Runtime;
use crate::upstream::{Attempt, BackendState, BulkheadGuard, Pool, Tried};

/// Per-request state.
pub struct Ctx {
    pub(super) start: Instant,
    /// The configuration this request is served under, start to end.
    pub(super) runtime: Arc<Runtime>,
    pub(super) pool: Option<Arc<Pool>>,
    /// Held while the request is in flight (load shedding's count).
    pub(super) _guard: Option<InflightGuard>,
    pub(super) backend: Option<Arc<BackendState>>,
    /// Counts the current attempt in its backend's in-flight (least_requests).
    pub(super) attempt: Option<Attempt>,
    /// When the current attempt started (the adaptive limit's latency sample).
    pub(super) attempt_start: Option<Instant>,
    /// Held while the request is in flight: the upstream's bulkhead slot.
    pub(super) _bulkhead: Option<BulkheadGuard>,
    /// 502/503/reset retries taken so far.
    pub(super) retries_used: u32,
    /// `upstream_response_filter` turned a 502/503 into an error to retry.
    pub(super) retrying: bool,
    pub(super) tried: Tried,
    pub(super) outcome: Option<Outcome>,
    /// What a gate refused the request with, when it answers through an error
    /// (`early_request_filter`, `upstream_peer`).
    pub(super) refusal: Option<Refusal>,
    /// X-Request-Id sent upstream and back (the client's, or generated).
    pub(super) request_id: Option<http::HeaderValue>,
    /// The RateLimit fields of an admitted response.
    pub(super) rate: Option<RateFields>,
    /// An upgrade request's tunnel slot (reserved, then open after the `101`).
    pub(super) tunnel: Option<crate::edge::tunnel::TunnelSlot>,
    /// A gRPC call failed by gRPC semantics (`grpc-status`): a backend error.
    pub(super) grpc_failed: bool,
    /// Trace context and upstream timing for the access log and metrics.
    pub(super) obs: super::telemetry::RequestObs,
    /// The client address (CONTRACT §7): the rate-limit key's and the logs'.
    pub(super) client: Option<std::net::IpAddr>,
    /// The request was routed (`request_filter` ran): `route` is its route.
    pub(super) routed: bool,
    /// Index in `runtime.config.routes` of the route; `None`: the default route.
    pub(super) route: Option<usize>,
    /// Request body bytes seen (`max_request_body_bytes`).
    pub(super) body: edge::limits::BodyCount,
    /// Counts the request as in flight on its thread (send coalescing, `batch.rs`);
    /// an open tunnel is no longer counted.
    pub(super) _in_flight: Option<super::batch::InFlight>,
}

impl Ctx {
    pub(super) fn new(runtime: Arc<Runtime>) -> Ctx {
        Ctx {
            start: Instant::now(),
            runtime,
            pool: None,
            _guard: None,
            backend: None,
            attempt: None,
            attempt_start: None,
            _bulkhead: None,
            retries_used: 0,
            retrying: false,
            tried: Tried::default(),
            outcome: None,
            refusal: None,
            request_id: None,
            rate: None,
            tunnel: None,
            grpc_failed: false,
            obs: Default::default(),
            client: None,
            routed: false,
            route: None,
            body: edge::limits::BodyCount::default(),
            _in_flight: Some(super::batch::InFlight::new()),
        }
    }
}
