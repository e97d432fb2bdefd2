//! The request's way in, before it goes upstream: its route and what the route answers
//! itself (CONTRACT §21), the gates, and the answer to a refusal.

use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::Session;
use pingora::ErrorType;
use portcullis_policy::verdict::Outcome;

use super::request::host_of;
use super::{batch, Ctx, Proxy};
use crate::config::{RouteAction, UnmatchedSection};
use crate::edge;
use crate::gate;
use crate::respond::{self, Refusal};

impl Proxy {
    /// Answer a refusal from a phase that writes its own response.
    pub(super) async fn refuse(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        refusal: Refusal,
    ) -> Result<bool> {
        ctx.answer.outcome = Some(refusal.outcome());
        // Never read a body we are refusing: close instead of draining it.
        // While draining, ask keep-alive clients to reconnect elsewhere.
        let close = !session.is_body_empty() || self.shared.lifecycle.is_draining();
        // A refusal is a send like a response: coalesced with the turn's others.
        batch::coalesce(session).await;
        self.note_request_id(session, ctx, refusal.status());
        let id = ctx.answer.request_id.as_ref();
        respond::send(session, &refusal, close, &ctx.runtime, id).await?;
        Ok(true)
    }

    /// A `status` answer whose body shows the request's id (`[errors]`) needs one before
    /// the request went upstream: the client's valid `X-Request-Id`, else a new one, kept
    /// in `ctx` for the access log. Nothing to do for text bodies.
    pub(super) fn note_request_id(&self, session: &Session, ctx: &mut Ctx, status: u16) {
        if ctx.answer.request_id.is_some() || !ctx.runtime.config.errors.shows_request_id(status) {
            return;
        }
        let client = session
            .req_header()
            .headers
            .get(edge::headers::names::X_REQUEST_ID.name())
            .filter(|v| edge::headers::valid_request_id(v.as_bytes()))
            .cloned();
        ctx.answer.request_id = Some(client.unwrap_or_else(|| self.shared.next_request_id_value()));
    }

    pub(super) fn refuse_early<T>(
        session: &mut Session,
        ctx: &mut Ctx,
        refusal: Refusal,
    ) -> Result<T> {
        session.set_keepalive(None);
        let status = refusal.status();
        ctx.answer.outcome = Some(refusal.outcome());
        ctx.answer.refusal = Some(refusal);
        Error::e_explain(ErrorType::HTTPStatus(status), "refused by a gate")
    }

    /// Routing: the route by host and longest path prefix, its upstream, and the client's
    /// address (PROXY protocol and `trusted_proxies` applied).
    pub(super) fn route(&self, session: &Session, ctx: &mut Ctx) {
        let rt = &*ctx.runtime;
        let server = &rt.config.server;
        // The client first: a route may match on it (`client_cidrs`).
        let client = edge::client_ip(
            session,
            &server.trusted_proxies,
            server.proxy_protocol,
            &self.shared.proxied,
        );
        ctx.routing.client = client;
        let req = session.req_header();
        let route = rt.route_index_for(host_of(session), req.uri.path(), &req.method, client);
        ctx.routing.route = route;
        ctx.routing.routed = true;
        // Left when the context drops (`impl Drop for Ctx`).
        rt.route_series(true, route).traffic.enter();
        ctx.routing.pool = rt.pools.get(rt.route_at(route).upstream).cloned();
    }

    /// What the route answers itself, before any gate (CONTRACT §21): a `deny` route's
    /// refusal, a `redirect` route's redirect, or the `server.unmatched` answer to a
    /// request no route matches. `None` (proxy it) costs one branch on the route.
    pub(super) fn route_answer(
        session: &Session,
        ctx: &Ctx,
    ) -> Option<Result<(u16, String), Refusal>> {
        let rt = &*ctx.runtime;
        let Some(route) = ctx.routing.route.and_then(|i| rt.config.routes.get(i)) else {
            return match rt.config.server.unmatched {
                UnmatchedSection::FirstUpstream => None,
                UnmatchedSection::NotFound => Some(Err(Refusal::NoRoute { status: 404 })),
                UnmatchedSection::Misdirected => Some(Err(Refusal::NoRoute { status: 421 })),
            };
        };
        match &route.action {
            RouteAction::Proxy => None,
            RouteAction::Deny(status) => Some(Err(Refusal::Denied { status: *status })),
            RouteAction::Redirect(status, location) => {
                let uri = &session.req_header().uri;
                let req = edge::rules::Request {
                    tls: session.digest().is_some_and(|d| d.ssl_digest.is_some()),
                    host: host_of(session),
                    path: uri.path(),
                    query: uri.query(),
                };
                Some(match location.render(&req) {
                    Some(l) => Ok((*status, l)),
                    None => Err(Refusal::BadRequest(
                        "portcullis: the Host is not a host name a redirect can name\n",
                    )),
                })
            }
        }
    }

    /// Answer a `redirect` route: `status` with `Location`, no body.
    pub(super) async fn redirect(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        status: u16,
        location: String,
    ) -> Result<bool> {
        ctx.answer.outcome = Some(Outcome::Redirected);
        let close = !session.is_body_empty() || self.shared.lifecycle.is_draining();
        if close {
            session.set_keepalive(None);
        }
        let mut resp = ResponseHeader::build(status, Some(3))?;
        resp.insert_header(http::header::LOCATION, location)?;
        resp.insert_header(http::header::CONTENT_LENGTH, 0)?;
        if close {
            resp.insert_header(http::header::CONNECTION, "close")?;
        }
        batch::coalesce(session).await;
        session.write_response_header(Box::new(resp), false).await?;
        session.write_response_body(None, true).await?;
        Ok(true)
    }

    /// Run the gates on the request (from the one a queue's wait left it at).
    pub(super) fn run_gates(
        &self,
        session: &Session,
        ctx: &mut Ctx,
    ) -> std::result::Result<(), gate::Stop> {
        let rt = &*ctx.runtime;
        // The facts live in this call only: nothing of them is held across an await.
        let req = session.req_header();
        let route = rt.route_at(ctx.routing.route);
        let facts = gate::RequestFacts {
            priority: route.priority,
            policies: route.policy_mask,
            headers: &req.headers,
            uri: &req.uri,
            client_ip: ctx.routing.client,
            h1: !session.as_downstream().is_http2(),
            version: req.version,
        };
        gate::admit(
            &self.shared,
            rt,
            ctx.routing.pool.as_deref(),
            &facts,
            portcullis_store::clock::unix_ms(),
            &mut ctx.gates,
        )
    }

    /// An admitted upgrade: a tunnel is idle when no byte goes either way. The edge stream,
    /// which sees both directions, times that, and neither side's reads are timed alone (a
    /// side may be quiet while the other talks).
    pub(super) fn time_tunnel(session: &mut Session, idle: std::time::Duration) {
        let timed_by_edge = crate::edge::conn(session)
            .map(|conn| conn.tunnel(idle))
            .is_some();
        session.set_read_timeout((!timed_by_edge).then_some(idle));
    }
}
