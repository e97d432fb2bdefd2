//! `response_filter`: the response header as it goes to the client: hop-by-hop fields
//! removed, framing for the client's protocol, the route's header rules, X-Request-Id, the
//! gRPC status, an upgrade's tunnel opened, the `RateLimit` fields, and `Connection: close`
//! while draining.

use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use pingora::Result;

use super::{request, Ctx};
use crate::edge;
use crate::respond;
use crate::state::Shared;

/// Prepare `resp`, the response header about to be sent to the client (the caller has
/// already coalesced the send with the turn's others).
pub(super) fn prepare(
    shared: &Shared,
    session: &mut Session,
    resp: &mut ResponseHeader,
    ctx: &mut Ctx,
) -> Result<()> {
    edge::headers::strip_response_hop_by_hop(resp);
    request::frame_for_client(session, resp)?;
    if let Some(id) = &ctx.answer.request_id {
        resp.insert_header(&edge::headers::names::X_REQUEST_ID, id.clone())?;
    }
    if let Some(code) = crate::edge::grpc::status_of(&resp.headers) {
        // a trailers-only gRPC response
        ctx.answer.grpc_failed = crate::edge::grpc::is_backend_error(code);
    }
    if ctx.gates.tunnel.is_some() {
        if resp.status.as_u16() == 101 {
            // The tunnel is open: no longer an in-flight request.
            if let Some(t) = ctx.gates.tunnel.as_mut() {
                t.mark_open();
            }
            ctx.gates.inflight = None;
            ctx._in_flight = None;
        } else {
            ctx.gates.tunnel = None;
        }
    }
    if let Some(fields) = ctx.gates.rate {
        if let Some(parts) = ctx.runtime.rate.fields(fields.policy) {
            respond::apply_rate_fields(&fields, parts, resp)?;
        }
    }
    // The route's rules come after the proxy's own fields (X-Request-Id, RateLimit).
    if let Some(route) = ctx
        .routing
        .route
        .and_then(|i| ctx.runtime.config.routes.get(i))
    {
        if !route.headers.response.is_empty() {
            route.headers.response.apply(resp);
        }
    }
    if shared.lifecycle.is_draining() {
        // Draining: ask keep-alive clients to reconnect (to another instance).
        session.set_keepalive(None);
        resp.insert_header("connection", "close")?;
    }
    Ok(())
}
