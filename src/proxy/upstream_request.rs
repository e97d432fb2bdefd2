//! `upstream_request_filter`: the request header as it goes upstream: the rate-limit key
//! header as the client sent it, X-Forwarded-*, the route's header rules, HTTP/1.0 and
//! HTTP/2 fix-ups, X-Request-Id (the client's, or a new one) and the trace context.

use pingora::http::RequestHeader;
use pingora::proxy::Session;
use pingora::Result;

use super::{request, Ctx};
use crate::edge;
use crate::ratelimit;
use crate::state::Shared;

/// Prepare `req`, the request header about to be sent upstream (the caller has already
/// coalesced the send with the turn's others).
pub(super) fn prepare(
    shared: &Shared,
    session: &mut Session,
    req: &mut RequestHeader,
    ctx: &mut Ctx,
) -> Result<()> {
    // The gate's key header stays as the client sent it, whatever its
    // `Connection` field nominated.
    if let ratelimit::KeySource::Header(name) = &ctx.runtime.config.rate_limit.source {
        edge::headers::restore(&session.req_header().headers, req, &[name]);
    }
    request::set_forwarded(session, req, &shared.proxied)?;
    request::keep_http10_without_host(session, req);
    if session.as_downstream().is_http2() {
        request::join_cookie_crumbs(req)?;
    }
    let id = match req
        .headers
        .get(edge::headers::names::X_REQUEST_ID.name())
        .filter(|v| edge::headers::valid_request_id(v.as_bytes()) && v.to_str().is_ok())
    {
        // A shared reference to the parsed header's bytes, not a copy.
        Some(id) => edge::headers::unique(id.clone()),
        None => {
            let id = shared.next_request_id_value();
            req.insert_header(&edge::headers::names::X_REQUEST_ID, id.clone())?;
            id
        }
    };
    ctx.answer.request_id = Some(id);
    ctx.obs.propagate(
        req,
        shared.observe.new_trace_sample(&ctx.runtime.config.tracing),
    )?;
    // The route's rules come last: they may replace or remove what the proxy added
    // (X-Forwarded-*, X-Request-Id, traceparent).
    if let Some(route) = ctx
        .routing
        .route
        .and_then(|i| ctx.runtime.config.routes.get(i))
    {
        if !route.headers.request.is_empty() {
            route.headers.request.apply(req);
        }
    }
    Ok(())
}
