//! The Pingora `ProxyHttp` implementation. Each phase only delegates to a
//! gate, in the order of Pingora's phase chart:
//!
//! 1. `early_request_filter`: reject oversized header blocks (431).
//! 2. `request_filter`: route, then load shedding (503), then the rate limiter
//!    (429 / 401 / 400). Nothing here awaits I/O or reads the body.
//! 3. `upstream_peer`: next healthy, not-culled backend; none → 503.
//! 4. `fail_to_connect`: count the error, retry on another backend.
//! 5. `upstream_request_filter`: X-Forwarded-For/-Proto, X-Request-Id.
//! 6. `response_filter`: RateLimit fields, X-Request-Id, Connection: close while draining.
//! 7. `logging`: metrics and per-backend error accounting for culling.

use crate::config::Priority;
use crate::metrics::Outcome;
use crate::ratelimit::{self, Decision, KeyOutcome};
use crate::shed::InflightGuard;
use crate::state::{Runtime, Shared};
use crate::upstream::{BackendState, Pool, Tried};
use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use pingora::ErrorType;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Proxy {
    pub shared: Arc<Shared>,
}

/// Per-request state.
pub struct Ctx {
    start: Instant,
    runtime: Option<Arc<Runtime>>,
    pool: Option<Arc<Pool>>,
    priority: Priority,
    _guard: Option<InflightGuard>,
    backend: Option<Arc<BackendState>>,
    tried: Tried,
    outcome: Option<Outcome>,
    no_backend: bool,
    request_id: Option<String>,
    /// `(limit, remaining, reset_secs)` for the RateLimit field on admitted responses.
    rate: Option<(u64, u64, u64)>,
    /// Trace context and upstream timing for the access log and metrics.
    obs: crate::observe::RequestObs,
}

/// What the rate-limit gate decided before any response is written.
enum Verdict {
    Checked(Decision),
    Allow,
    Reject,
    TooLong,
    Duplicate,
}

/// Headers of a response the proxy makes itself.
struct Reply {
    status: u16,
    retry_after: Option<u64>,
    body: &'static str,
}

impl Proxy {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    async fn reply(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        outcome: Outcome,
        reply: Reply,
        extra: &[(&'static str, String)],
    ) -> Result<bool> {
        ctx.outcome = Some(outcome);
        let mut resp = ResponseHeader::build(reply.status, Some(4 + extra.len()))?;
        resp.insert_header("content-type", "text/plain; charset=utf-8")?;
        resp.insert_header("content-length", reply.body.len())?;
        if let Some(secs) = reply.retry_after {
            resp.insert_header("retry-after", secs.max(1))?;
        }
        for (name, value) in extra {
            resp.insert_header(*name, value.as_str())?;
        }
        // Never read a body we are refusing: close instead of draining it.
        // While draining, ask keep-alive clients to reconnect elsewhere.
        if !session.is_body_empty() || self.shared.lifecycle.is_draining() {
            session.set_keepalive(None);
            resp.insert_header("connection", "close")?;
        }
        session.write_response_header(Box::new(resp), false).await?;
        session
            .write_response_body(Some(Bytes::from_static(reply.body.as_bytes())), true)
            .await?;
        Ok(true)
    }

    fn header_block_len(session: &Session) -> usize {
        let req = session.req_header();
        let mut n = req.uri.path_and_query().map_or(1, |p| p.as_str().len()) + 16;
        for (name, value) in req.headers.iter() {
            n += name.as_str().len() + value.len() + 4;
        }
        n
    }

    /// The rate-limit gate: key extraction then the local sliding window.
    async fn rate_limit(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let Some(rt) = ctx.runtime.clone() else {
            return Ok(false);
        };
        let Some(rl) = rt.rate_limit.as_ref() else {
            return Ok(false);
        };
        let now_ms = crate::state::unix_ms();
        // Decide while the key is still borrowed from the request: no copy of it.
        let verdict = {
            let req = session.req_header();
            match ratelimit::extract_key(&rl.source, &req.headers, &req.uri, rl.max_key_bytes) {
                KeyOutcome::Key(k) => {
                    Verdict::Checked(self.shared.limiter.check(k.as_ref(), now_ms))
                }
                KeyOutcome::TooLong => Verdict::TooLong,
                KeyOutcome::Duplicate => Verdict::Duplicate,
                KeyOutcome::Missing => match rl.missing_key {
                    crate::ratelimit::MissingKey::Allow => Verdict::Allow,
                    crate::ratelimit::MissingKey::Reject => Verdict::Reject,
                    crate::ratelimit::MissingKey::ClientIp => {
                        let ip = session
                            .client_addr()
                            .and_then(|a| a.as_inet())
                            .map(|a| a.ip());
                        let key = match ip {
                            Some(ip) => format!("ip:{ip}"),
                            None => "ip:unknown".to_string(),
                        };
                        Verdict::Checked(self.shared.limiter.check(&key, now_ms))
                    }
                },
            }
        };
        let decision = match verdict {
            Verdict::Checked(d) => d,
            Verdict::Allow => return Ok(false),
            Verdict::TooLong => {
                let reply = Reply {
                    status: 400,
                    retry_after: None,
                    body: "portcullis: API key too long\n",
                };
                return self
                    .reply(session, ctx, Outcome::Rejected, reply, &[])
                    .await;
            }
            Verdict::Duplicate => {
                // The limiter would count one value while the backend may act on another.
                let reply = Reply {
                    status: 400,
                    retry_after: None,
                    body: "portcullis: more than one API key\n",
                };
                return self
                    .reply(session, ctx, Outcome::Rejected, reply, &[])
                    .await;
            }
            Verdict::Reject => {
                let reply = Reply {
                    status: 401,
                    retry_after: None,
                    body: "portcullis: API key required\n",
                };
                return self
                    .reply(session, ctx, Outcome::Rejected, reply, &[])
                    .await;
            }
        };
        match decision {
            Decision::Allowed {
                limit,
                remaining,
                reset_secs,
            } => {
                if rl.headers {
                    ctx.rate = Some((limit, remaining, reset_secs));
                }
                Ok(false)
            }
            Decision::Limited {
                limit,
                retry_after_secs,
                reset_secs,
            } => {
                let extra = [
                    (
                        "ratelimit-policy",
                        ratelimit::policy_header(&rl.policy_name, limit, rl.window_secs),
                    ),
                    (
                        "ratelimit",
                        ratelimit::ratelimit_header(
                            &rl.policy_name,
                            0,
                            reset_secs.max(retry_after_secs),
                        ),
                    ),
                ];
                self.reply(
                    session,
                    ctx,
                    Outcome::RateLimited,
                    Reply {
                        status: 429,
                        retry_after: Some(retry_after_secs),
                        body: "portcullis: rate limited\n",
                    },
                    &extra,
                )
                .await
            }
        }
    }
}

/// A client that went away (hang-up, reset) before its response was complete.
fn is_client_abort(e: &Error) -> bool {
    matches!(e.esource(), pingora::ErrorSource::Downstream)
        && matches!(
            e.etype(),
            ErrorType::ReadError | ErrorType::WriteError | ErrorType::ConnectionClosed
        )
}

/// The underlying OS or library error, when it is not a Pingora error (whose
/// context may quote raw request or response bytes).
fn plain_cause(e: &Error) -> Option<String> {
    let root = e.root_cause();
    if root.downcast_ref::<Error>().is_some() {
        None
    } else {
        Some(root.to_string())
    }
}

impl Proxy {
    /// One line per failed request. Client aborts are normal traffic: counted
    /// and logged at debug. The line names the error kind, the path (no query)
    /// and the backend; never a header value or the error's free-text context.
    fn log_failure(&self, session: &Session, e: &Error, ctx: &Ctx, status: u16) {
        let path = session.req_header().uri.path();
        let upstream = ctx.pool.as_ref().map_or("", |p| p.name.as_str());
        let cause = plain_cause(e).unwrap_or_default();
        if is_client_abort(e) {
            crate::metrics::client_aborts().inc();
            tracing::debug!(
                event = "client_abort",
                error = e.etype().as_str(),
                path,
                upstream,
                cause,
            );
        } else if (400..500).contains(&status)
            || matches!(e.esource(), pingora::ErrorSource::Downstream)
        {
            tracing::debug!(
                event = "request_refused",
                status,
                error = e.etype().as_str(),
                path,
                cause,
            );
        } else {
            tracing::error!(
                event = "proxy_error",
                status,
                error = e.etype().as_str(),
                source = e.esource().as_str(),
                path,
                upstream,
                backend = ctx
                    .backend
                    .as_ref()
                    .map(|b| b.addr.to_string())
                    .unwrap_or_default(),
                cause,
                "request failed"
            );
        }
    }
}

/// Whether the request target holds a byte no URI may hold, as received or as
/// Pingora rewrote it: Pingora percent-encodes a target that `httparse`
/// refuses (a space, a control byte, …) and parses again. Such a request is
/// refused, not forwarded rewritten. The raw bytes are looked up only for
/// targets that contain `%`.
fn invalid_target(session: &Session) -> bool {
    let req = session.req_header();
    let target = req.raw_path();
    if crate::framing::target_has_invalid_byte(target) {
        return true;
    }
    if !target.contains(&b'%') {
        return false;
    }
    let Some(h1) = session.as_downstream().as_http1() else {
        return false;
    };
    crate::raw_window::recent_bytes(h1.stream()).is_some_and(|recent| {
        crate::raw_window::target_was_rewritten(recent, req.method.as_str().as_bytes(), target)
    })
}

fn host_of(session: &Session) -> &str {
    let req = session.req_header();
    let host = req
        .headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri.host())
        .unwrap_or("");
    // strip the port (IPv6 literals keep their brackets)
    match host.rfind(':') {
        Some(i) if !host[i..].contains(']') => &host[..i],
        _ => host,
    }
}

#[async_trait]
impl ProxyHttp for Proxy {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx {
            start: Instant::now(),
            runtime: None,
            pool: None,
            priority: Priority::Normal,
            _guard: None,
            backend: None,
            tried: Tried::default(),
            outcome: None,
            no_backend: false,
            request_id: None,
            rate: None,
            obs: Default::default(),
        }
    }

    async fn early_request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<()> {
        self.shared.note_proxy_runtime();
        let rt = self.shared.runtime.load_full();
        // Pingora has already decided whether this connection may be reused: off
        // for HTTP/1.0 without `Connection: keep-alive`, for `Connection: close`
        // and for ambiguous framing (RFC 9112 §6.1, §9.3). Only the timeout is
        // ours to set; never turn keep-alive back on.
        if let (Some(ka), Some(_)) = (rt.keepalive_seconds, session.get_keepalive()) {
            session.set_keepalive(Some(ka));
        }
        // Pipelined requests are answered one after another, in order (RFC 9112
        // §9.3.2); without this Pingora closes after the first.
        session.set_pipelining_enabled(true);
        if let Err(why) = crate::framing::check(&session.req_header().headers, || {
            session
                .as_downstream()
                .as_http1()
                .map(|h1| h1.get_headers_raw_bytes())
        }) {
            session.set_keepalive(None);
            ctx.outcome = Some(Outcome::Rejected);
            return Error::e_explain(ErrorType::HTTPStatus(400), why.as_str());
        }
        if invalid_target(session) {
            session.set_keepalive(None);
            ctx.outcome = Some(Outcome::Rejected);
            return Error::e_explain(ErrorType::HTTPStatus(400), "invalid byte in request target");
        }
        if Self::header_block_len(session) > rt.max_request_header_bytes {
            session.set_keepalive(None);
            ctx.outcome = Some(Outcome::Rejected);
            return Error::e_explain(ErrorType::HTTPStatus(431), "request header block too large");
        }
        ctx.runtime = Some(rt);
        Ok(())
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let Some(rt) = ctx.runtime.clone() else {
            return Ok(false);
        };
        let route = rt.route(host_of(session), session.req_header().uri.path());
        ctx.priority = route.priority;
        ctx.pool = rt.pools.get(route.upstream).cloned();

        // Gate 1: load shedding, before any other work.
        match self.shared.shedder.try_acquire(route.priority) {
            Some(g) => ctx._guard = Some(g),
            None => {
                let secs = rt.retry_after_seconds;
                return self
                    .reply(
                        session,
                        ctx,
                        Outcome::Shed,
                        Reply {
                            status: 503,
                            retry_after: Some(secs),
                            body: "portcullis: overloaded (load shed)\n",
                        },
                        &[],
                    )
                    .await;
            }
        }

        // Gate 2: per-key rate limiting, from local state only.
        self.rate_limit(session, ctx).await
    }

    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        let Some(pool) = ctx.pool.clone() else {
            ctx.no_backend = true;
            return Error::e_explain(ErrorType::HTTPStatus(503), "no upstream for route");
        };
        let Some(backend) = pool.select(&ctx.tried) else {
            ctx.no_backend = true;
            return Error::e_explain(ErrorType::HTTPStatus(503), "no backend available");
        };
        ctx.tried.push(backend.addr);
        ctx.obs.backend_chosen();
        let mut peer = HttpPeer::new(backend.addr, false, String::new());
        peer.options.connection_timeout = Some(pool.connect_timeout);
        peer.options.read_timeout = Some(pool.read_timeout);
        peer.options.write_timeout = Some(pool.read_timeout);
        peer.options.idle_timeout = Some(Duration::from_secs(60));
        ctx.backend = Some(backend);
        Ok(Box::new(peer))
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
            cause = plain_cause(&e).unwrap_or_default(),
        );
        if let Some(b) = ctx.backend.take() {
            b.record(crate::state::unix_secs(), true);
            if let Some(pool) = &ctx.pool {
                self.shared
                    .metrics
                    .record_upstream(&pool.name, &b.addr_str, None, None);
            }
        }
        let untried = ctx
            .pool
            .as_ref()
            .is_some_and(|p| p.backends.iter().any(|b| !ctx.tried.contains(&b.addr)));
        if untried {
            e.set_retry(true);
        } else {
            ctx.no_backend = true;
            e.set_retry(false);
        }
        e
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        req: &mut pingora::http::RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if let Some(ip) = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip())
        {
            let xff = match req
                .headers
                .get("x-forwarded-for")
                .and_then(|v| v.to_str().ok())
            {
                Some(prev) if !prev.is_empty() => format!("{prev}, {ip}"),
                _ => ip.to_string(),
            };
            req.insert_header("x-forwarded-for", xff)?;
        }
        req.insert_header("x-forwarded-proto", "http")?;
        let id = match req
            .headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
        {
            Some(id) if !id.is_empty() => id.to_string(),
            _ => {
                let id = self.shared.next_request_id();
                req.insert_header("x-request-id", id.as_str())?;
                id
            }
        };
        ctx.request_id = Some(id);
        ctx.obs.propagate(req)?;
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        ctx.obs.upstream_answered(resp.status.as_u16());
        Ok(())
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if let Some(id) = &ctx.request_id {
            resp.insert_header("x-request-id", id.as_str())?;
        }
        if let (Some((limit, remaining, reset)), Some(rl)) = (
            ctx.rate,
            ctx.runtime.as_ref().and_then(|r| r.rate_limit.as_ref()),
        ) {
            resp.insert_header(
                "ratelimit-policy",
                ratelimit::policy_header(&rl.policy_name, limit, rl.window_secs),
            )?;
            resp.insert_header(
                "ratelimit",
                ratelimit::ratelimit_header(&rl.policy_name, remaining, reset),
            )?;
        }
        if self.shared.lifecycle.is_draining() {
            // Draining: ask keep-alive clients to reconnect (to another instance).
            session.set_keepalive(None);
            resp.insert_header("connection", "close")?;
        }
        Ok(())
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        let (status, outcome, retry_after, body) = match e.etype() {
            ErrorType::HTTPStatus(431) => (
                431,
                Outcome::Rejected,
                None,
                "portcullis: request header too large\n",
            ),
            ErrorType::HTTPStatus(400) => {
                (400, Outcome::Rejected, None, "portcullis: bad request\n")
            }
            _ if ctx.no_backend => (
                503,
                Outcome::NoBackend,
                ctx.runtime
                    .as_ref()
                    .map(|r| r.retry_after_seconds)
                    .or(Some(1)),
                "portcullis: no backend available\n",
            ),
            ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout => (
                504,
                Outcome::UpstreamError,
                None,
                "portcullis: upstream timed out\n",
            ),
            _ => match e.esource() {
                pingora::ErrorSource::Downstream => {
                    // the client went away or sent garbage
                    let code = match e.etype() {
                        ErrorType::ReadError
                        | ErrorType::WriteError
                        | ErrorType::ConnectionClosed => 0,
                        _ => 400,
                    };
                    (code, Outcome::Rejected, None, "portcullis: bad request\n")
                }
                pingora::ErrorSource::Upstream => (
                    502,
                    Outcome::UpstreamError,
                    None,
                    "portcullis: upstream error\n",
                ),
                _ => (
                    500,
                    Outcome::UpstreamError,
                    None,
                    "portcullis: internal error\n",
                ),
            },
        };
        ctx.outcome.get_or_insert(outcome);
        self.log_failure(session, e, ctx, status);
        // The connection is closed after this reply (`can_reuse_downstream: false`):
        // say so (`Connection: close`) so keep-alive clients do not reuse it.
        session.set_keepalive(None);
        if status > 0 && session.response_written().is_none() {
            let reply = Reply {
                status,
                retry_after,
                body,
            };
            if let Err(err) = self.reply(session, ctx, outcome, reply, &[]).await {
                tracing::debug!(error = %err, "cannot send error response");
            }
        }
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

    /// Every failure is logged once, by [`Proxy::log_failure`], without the
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

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Ctx) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let outcome = ctx.outcome.unwrap_or(if e.is_some() {
            Outcome::UpstreamError
        } else {
            Outcome::Proxied
        });
        let backend = ctx.backend.take();
        if let Some(b) = &backend {
            // The backend's fault only: a 5xx, or an error on the upstream side
            // (timeouts, resets). A client hanging up is not the backend's error.
            let upstream_failed =
                e.is_some_and(|e| matches!(e.esource(), pingora::ErrorSource::Upstream));
            let is_error = upstream_failed || status >= 500;
            b.record(crate::state::unix_secs(), is_error);
        }
        crate::observe::finish(
            &self.shared,
            session,
            &mut ctx.obs,
            crate::observe::Finished {
                outcome,
                status,
                runtime: ctx.runtime.as_deref(),
                pool: ctx.pool.as_deref(),
                backend: backend.as_deref(),
                request_id: ctx.request_id.as_deref(),
                elapsed: ctx.start.elapsed(),
            },
        );
        tracing::debug!(
            event = "request",
            status,
            outcome = outcome.as_str(),
            upstream = ctx.pool.as_ref().map(|p| p.name.as_str()).unwrap_or(""),
            elapsed_us = ctx.start.elapsed().as_micros() as u64,
        );
    }
}
