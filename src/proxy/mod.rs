//! The Pingora `ProxyHttp` implementation. Each phase only delegates, in the
//! order of Pingora's phase chart; a gate returns a verdict and [`respond`]
//! alone turns a refusal into a response:
//!
//! 1. `early_request_filter`: framing and target checks (400), header block size
//!    (431). See [`crate::framing`].
//! 2. `request_filter`: route, then load shedding ([`crate::gate`], 503), then the
//!    rate limiter ([`crate::gate`], 429 / 401 / 400). Nothing here
//!    awaits I/O or reads the body.
//! 3. `upstream_peer`: next healthy, not-culled backend ([`crate::upstream`]);
//!    none → 503.
//! 4. `fail_to_connect`: count the error against the backend, retry on another.
//! 5. `upstream_request_filter`: X-Forwarded-For/-Proto, X-Request-Id.
//! 6. `response_filter`: RateLimit fields, X-Request-Id, `Connection: close`
//!    while draining.
//! 7. `fail_to_proxy`: the refusal for an error (`failure.rs`), logged once.
//! 8. `logging`: where the request ends ([`settle`]): the tenant's charge, the backend's
//!    error window (which culling reads) and blame, latency, metrics and the access log.
//!
//! Before the sends that follow 5 and 6 (and a gate's refusal), a request yields once
//! while others are in flight on its thread, so one turn's sends go out together
//! ([`batch`]).
//!
//! [`respond`]: crate::respond

mod admission;
mod batch;
mod ctx;
mod early;
mod failure;
mod queue;
mod request;
mod response;
mod retry;
mod settle;
mod telemetry;
mod upstream_request;

use std::sync::Arc;
use std::time::{Duration, Instant};

use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use pingora::ErrorType;

use crate::gate;
use crate::respond::{self, Refusal};
use crate::state::Shared;
use crate::upstream::Attempt;
pub use ctx::Ctx;
use portcullis_policy::verdict::Outcome;

pub struct Proxy {
    pub shared: Arc<Shared>,
}

impl Proxy {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

impl ProxyHttp for Proxy {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx::new(self.shared.runtime.load_full())
    }

    /// None: Pingora's default is a disabled compression module, set up and called on every
    /// request (4 allocations). portcullis compresses nothing.
    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {}

    async fn early_request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<()> {
        self.shared.note_proxy_runtime();
        let server = &ctx.runtime.config.server;
        request::set_connection_options(session, server);
        match early::first_refusal(session, server)? {
            None => Ok(()),
            Some(refusal) => {
                if refusal == Refusal::PayloadTooLarge {
                    self.shared
                        .metrics
                        .edge
                        .refusal(crate::metrics::EdgeRefusal::BodyTooLarge);
                }
                Self::refuse_early(session, ctx, refusal)
            }
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        self.route(session, ctx);
        if let Some(answer) = Self::route_answer(session, ctx) {
            return match answer {
                Ok((status, location)) => self.redirect(session, ctx, status, location).await,
                Err(refusal) => self.refuse(session, ctx, refusal).await,
            };
        }
        // The gates; a queue's wait (at the cap, or for the upstream's room) and then on.
        loop {
            let stop = match self.run_gates(session, ctx) {
                Ok(()) => break,
                Err(stop) => stop,
            };
            let shedding = &ctx.runtime.config.shedding;
            let retry_after = shedding.retry_after_secs;
            let left = match stop {
                gate::Stop::Refused(refusal) => return self.refuse(session, ctx, refusal).await,
                gate::Stop::Queue(rank) => {
                    let (timeout, max_queue) = (shedding.queue_timeout, shedding.max_queue);
                    match queue::slot(&self.shared, session, rank, timeout, max_queue, retry_after)
                        .await
                    {
                        Ok(slot) => {
                            ctx.gates.inflight = Some(slot);
                            ctx.gates.passed = 1;
                            continue;
                        }
                        Err(left) => left,
                    }
                }
                gate::Stop::Upstream => {
                    let Some(pool) = ctx.routing.pool.clone() else {
                        return self
                            .refuse(session, ctx, Refusal::NoBackend { retry_after })
                            .await;
                    };
                    match queue::upstream(&self.shared, session, &pool, retry_after, || match pool
                        .enter()
                    {
                        crate::upstream::Bulkhead::Entered(g) => Some(Some(g)),
                        crate::upstream::Bulkhead::Unlimited => Some(None),
                        crate::upstream::Bulkhead::Full => None,
                    })
                    .await
                    {
                        queue::Room::Got(slot) => {
                            ctx.gates.bulkhead = slot;
                            ctx.gates.passed = 3;
                            continue;
                        }
                        queue::Room::Left(left) => left,
                    }
                }
            };
            return match left {
                queue::Left::Refused(refusal) => self.refuse(session, ctx, refusal).await,
                queue::Left::ClientGone => {
                    // Over the cap and never given a slot: shed (the client gave up first).
                    ctx.answer.outcome = Some(Outcome::Shed);
                    Error::e_explain(ErrorType::ConnectionClosed, "client left while queued")
                }
            };
        }
        let rt = &*ctx.runtime;
        if ctx.gates.tunnel.is_some() {
            Self::time_tunnel(session, rt.config.server.tunnel_idle_timeout);
        }
        // An adaptive cap does not count a request while its body is arriving (until
        // `request_body_filter` sees the body's end).
        let adaptive = rt.config.shedding.adaptive;
        if (adaptive || ctx.gates.bulkhead.as_ref().is_some_and(|b| b.is_adaptive()))
            && !session.is_body_done()
        {
            ctx.gates.start_upload(adaptive);
        }
        Ok(false)
    }

    async fn upstream_peer(&self, session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        let retry_after = ctx.runtime.config.shedding.retry_after_secs;
        let Some(pool) = ctx.routing.pool.as_deref() else {
            return Self::refuse_early(session, ctx, Refusal::NoBackend { retry_after });
        };
        if ctx.upstream.attempt_start.is_none() {
            // Woken from a pause: the drains and claims granted meanwhile are read first
            // (at once otherwise).
            self.shared.fleet_view.fresh_after_pause().await;
            // First attempt: the retry budget counts requests, not attempts.
            pool.shared
                .budget
                .record_request(portcullis_store::clock::unix_secs());
        }
        let key = pool.balance.needs_key().then(|| {
            let req = session.req_header();
            crate::balance::key::hash_bytes(
                &pool.balance.hash_key,
                &req.headers,
                &req.uri,
                ctx.routing.client,
            )
        });
        let mut picked = pool.select(&ctx.upstream.tried, key.as_deref().unwrap_or(b""));
        if picked.is_none()
            && !pool.balance.queue_timeout.is_zero()
            && pool.full_by_max_conn(&ctx.upstream.tried)
        {
            // Every backend it may use is at its `max_conn`: wait for one to have room.
            let key = key.map(std::borrow::Cow::into_owned).unwrap_or_default();
            let tried = &ctx.upstream.tried;
            let got = queue::upstream(&self.shared, session, pool, retry_after, || {
                pool.select(tried, &key)
            })
            .await;
            match got {
                queue::Room::Got(b) => picked = Some(b),
                queue::Room::Left(queue::Left::Refused(refusal)) => {
                    return Self::refuse_early(session, ctx, refusal)
                }
                queue::Room::Left(queue::Left::ClientGone) => {
                    ctx.answer.outcome = Some(Outcome::Shed);
                    return Error::e_explain(
                        ErrorType::ConnectionClosed,
                        "client left while queued",
                    );
                }
            }
        }
        let Some(backend) = picked else {
            return Self::refuse_early(session, ctx, Refusal::NoBackend { retry_after });
        };
        ctx.upstream.tried.push(backend.addr);
        let now = Instant::now();
        ctx.obs.backend_chosen(now);
        ctx.upstream.attempt = Some(Attempt::new(&backend));
        ctx.upstream.attempt_start = Some(now);
        let keep_case = self.shared.keep_header_case;
        let mut peer = crate::upstream::peer::peer(backend.addr, &pool.transport, keep_case);
        peer.options.connection_timeout = Some(pool.connect_timeout);
        // Until a response, `read_timeout_ms` times the backend, an upgrade's too (HAProxy's
        // `timeout server` before `timeout tunnel`): one that never answers gets a 504.
        peer.options.read_timeout = Some(pool.read_timeout);
        if ctx.gates.tunnel.is_some() {
            peer.options.upgraded_read_timeout = Some(if crate::edge::conn(session).is_some() {
                // After the `101` the edge stream closes the tunnel once nothing has gone
                // either way for `tunnel_idle_timeout_seconds`; the backend may be quiet
                // while the client talks.
                None
            } else {
                Some(ctx.runtime.config.server.tunnel_idle_timeout)
            });
        }
        peer.options.write_timeout = Some(pool.read_timeout);
        peer.options.idle_timeout = Some(Duration::from_secs(60));
        ctx.upstream.backend = Some(backend);
        Ok(Box::new(peer))
    }

    /// `max_request_body_bytes` for bodies without a `Content-Length`: the
    /// chunk that crosses it is never forwarded. At the body's end, the request counts
    /// against an adaptive cap again ([`gate::Admitted::start_upload`]).
    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if end_of_stream {
            ctx.gates.end_upload();
        }
        let max = ctx.runtime.config.server.max_request_body_bytes;
        if body
            .as_ref()
            .is_none_or(|chunk| ctx.body.add(chunk.len(), max))
        {
            if end_of_stream && ctx.body.seen() > 0 {
                // The backend's time starts once the body has been handed on
                // (`backend_us`); without a body, from the choice of the backend (one
                // clock read saved per request).
                ctx.obs.request_sent(Instant::now());
            }
            return Ok(());
        }
        *body = None;
        self.shared
            .metrics
            .edge
            .refusal(crate::metrics::EdgeRefusal::BodyTooLarge);
        ctx.answer.refusal = Some(Refusal::PayloadTooLarge);
        ctx.answer.outcome = Some(Outcome::Rejected);
        Error::e_explain(ErrorType::HTTPStatus(413), "request body too large")
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        peer: &HttpPeer,
        ctx: &mut Ctx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        // Nothing was sent upstream: count it against that backend and try another.
        tracing::warn!(
            event = "connect_failed",
            backend = %pingora::upstreams::peer::Peer::address(peer),
            error = e.etype().as_str(),
            cause = failure::plain_cause(&e).unwrap_or_default(),
        );
        if let Some(b) = ctx.upstream.backend.take() {
            settle::failed_attempt(&b, None, None);
            if let Some(pool) = &ctx.routing.pool {
                self.shared.metrics.proxy.record_backend(
                    &b.series,
                    &pool.name,
                    &b.addr_str,
                    None,
                    None,
                );
            }
        }
        ctx.upstream.attempt = None;
        let untried = ctx.routing.pool.as_ref().is_some_and(|p| {
            p.backends
                .iter()
                .any(|b| !ctx.upstream.tried.contains(&b.addr))
        });
        if untried {
            if let Some(p) = &ctx.routing.pool {
                // Outside the budget (nothing was sent), but counted in it.
                p.shared
                    .budget
                    .record_retry(portcullis_store::clock::unix_secs());
                self.shared.metrics.proxy.retry(&p.name, true);
            }
            e.set_retry(true);
        } else {
            let retry_after = ctx.runtime.config.shedding.retry_after_secs;
            ctx.answer.refusal = Some(Refusal::NoBackend { retry_after });
            e.set_retry(false);
        }
        e
    }

    /// A 502/503 from an idempotent request goes to another backend when the
    /// retry rules allow it ([`retry`]): the answer becomes an error that
    /// `error_while_proxy` marks for retry, before anything reaches the client.
    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        let status = resp.status.as_u16();
        ctx.obs.upstream_answered(status);
        if (status == 502 || status == 503) && retry::take(session, ctx, &self.shared.metrics) {
            if let Some(b) = ctx.upstream.backend.take() {
                settle::failed_attempt(&b, Some(status), ctx.obs.upstream_us());
            }
            ctx.upstream.attempt = None;
            ctx.upstream.retrying = true;
            return Error::e_explain(
                ErrorType::HTTPStatus(status),
                "backend answered 502/503; retrying on another backend",
            );
        }
        if let Some(name) = &ctx.runtime.config.rate_limit.cost_header {
            // The request's cost against its tenant's quota, charged before the client
            // sees the response (its next request sees the spending); never shown to it.
            let tenant = ctx
                .gates
                .caller
                .tenant
                .as_deref()
                .filter(|t| t.tier.quota > 0);
            // At most the quota: a larger cost spends it (and the store takes it).
            let quota = tenant.map_or(0, |t| t.tier.quota);
            let cost = crate::tenants::cost_of(resp.headers.get(name), quota);
            resp.remove_header(name);
            settle::charge(&self.shared, ctx, cost);
        }
        Ok(())
    }

    /// Errors after connect: our retry of a 502/503, a stale pooled
    /// connection (Pingora's rule; the same backend may be tried again), or a
    /// reset that [`retry`] allows; nothing else is retried.
    fn error_while_proxy(
        &self,
        _peer: &HttpPeer,
        session: &mut Session,
        mut e: Box<Error>,
        ctx: &mut Ctx,
        client_reused: bool,
    ) -> Box<Error> {
        if std::mem::take(&mut ctx.upstream.retrying) {
            e.set_retry(true);
            return e;
        }
        let stale = client_reused
            && matches!(e.retry, pingora::RetryType::ReusedOnly)
            && retry::replayable(session);
        if stale {
            if let Some(b) = &ctx.upstream.backend {
                ctx.upstream.tried.forget(&b.addr);
            }
            e.set_retry(true);
            return e;
        }
        if retry::is_reset(&e) && retry::take(session, ctx, &self.shared.metrics) {
            if let Some(b) = ctx.upstream.backend.take() {
                settle::failed_attempt(&b, None, None);
            }
            ctx.upstream.attempt = None;
            e.set_retry(true);
            return e;
        }
        e.set_retry(false);
        e
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        req: &mut pingora::http::RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        // The request header is sent upstream right after this phase. The preparation is
        // synchronous, so the phase's boxed future holds no second future.
        batch::coalesce(session).await;
        upstream_request::prepare(&self.shared, session, req, ctx)
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        // The response is sent to the client right after this phase.
        batch::coalesce(session).await;
        response::prepare(&self.shared, session, resp, ctx)
    }

    fn upstream_response_trailer_filter(
        &self,
        _session: &mut Session,
        trailers: &mut http::HeaderMap,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if let Some(code) = crate::edge::grpc::status_of(trailers) {
            ctx.answer.grpc_failed = crate::edge::grpc::is_backend_error(code);
        }
        Ok(())
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        _body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> Result<Option<Duration>> {
        if end_of_stream {
            // The response is complete: the request leaves the in-flight count (shedding
            // and the bulkhead) before its last bytes go out, not after, in `logging`. A
            // client that sends its next request as soon as it has this response must
            // find the slot free (a serial client is never shed at a cap of one).
            ctx.gates.inflight = None;
            ctx.gates.bulkhead = None;
        }
        Ok(None)
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        let refusal = failure::refusal_for(e, ctx);
        let status = refusal.as_ref().map_or(0, Refusal::status);
        let outcome = refusal.as_ref().map_or(Outcome::Rejected, Refusal::outcome);
        ctx.answer.outcome.get_or_insert(outcome);
        if refusal == Some(Refusal::RequestTimeout) {
            self.shared
                .metrics
                .edge
                .refusal(crate::metrics::EdgeRefusal::BodyTimeout);
        }
        if failure::is_client_abort(e) {
            self.shared.metrics.proxy.client_aborts.inc();
        }
        failure::log(session, e, ctx, status);
        // The connection is closed after this reply (`can_reuse_downstream: false`),
        // and the reply says so.
        if let Some(refusal) = refusal.filter(|_| session.response_written().is_none()) {
            self.note_request_id(session, ctx, refusal.status());
            let id = ctx.answer.request_id.as_ref();
            if let Err(err) = respond::send(session, &refusal, true, &ctx.runtime, id).await {
                tracing::debug!(error = %err, "cannot send error response");
            }
        }
        session.set_keepalive(None);
        FailToProxy {
            error_code: status,
            can_reuse_downstream: false,
        }
    }

    /// Pingora's own failure lines end with this summary: method and path only,
    /// never the query string or a header value (CONTRACT §7).
    fn request_summary(&self, session: &Session, _ctx: &Ctx) -> String {
        let req = session.req_header();
        format!("{} {}", req.method, req.uri.path())
    }

    /// Every failure is logged once, by `failure::log`, without the
    /// request's secrets; Pingora's own lines would print the error context.
    fn suppress_error_log(&self, _session: &Session, _ctx: &Ctx, _error: &Error) -> bool {
        true
    }

    fn suppress_proxy_warn_log(
        &self,
        _session: &Session,
        _ctx: &Ctx,
        _error: &Error,
        _context: pingora::proxy::ProxyWarnLogContext,
    ) -> bool {
        true
    }

    /// The request ended, whichever way: [`settle::request`].
    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Ctx) {
        settle::request(&self.shared, session, e, ctx);
    }
}
