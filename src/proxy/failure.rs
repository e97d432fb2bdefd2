//! Errors Pingora hands back (`fail_to_proxy`): which refusal answers them, and
//! the one log line each failure gets. Client aborts are normal traffic:
//! counted and logged at debug. A line names the error kind, the path (no
//! query) and the backend; never a header value or the error's free-text
//! context, which may quote raw request bytes.

use pingora::proxy::Session;
use pingora::{Error, ErrorSource, ErrorType};

use super::Ctx;
use crate::respond::Refusal;

/// A client that went away (hang-up, reset) before its response was complete.
pub fn is_client_abort(e: &Error) -> bool {
    matches!(e.esource(), ErrorSource::Downstream)
        && matches!(
            e.etype(),
            ErrorType::ReadError | ErrorType::WriteError | ErrorType::ConnectionClosed
        )
}

/// The refusal that answers `e`, or `None` when there is nobody to answer (the
/// client went away). A refusal a gate already chose (`ctx.refusal`) wins.
pub fn refusal_for(e: &Error, ctx: &Ctx) -> Option<Refusal> {
    if let Some(r) = &ctx.refusal {
        return Some(r.clone());
    }
    Some(match e.etype() {
        ErrorType::HTTPStatus(431) => Refusal::HeaderTooLarge,
        ErrorType::HTTPStatus(400) => Refusal::BadRequest("portcullis: bad request\n"),
        // the client's body stalled (`client_body_timeout_ms`)
        ErrorType::ReadTimedout if matches!(e.esource(), ErrorSource::Downstream) => {
            Refusal::RequestTimeout
        }
        ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout => {
            Refusal::UpstreamTimeout
        }
        _ => match e.esource() {
            ErrorSource::Downstream if is_client_abort(e) => return None,
            ErrorSource::Downstream => Refusal::BadRequest("portcullis: bad request\n"),
            ErrorSource::Upstream => Refusal::UpstreamError,
            _ => Refusal::Internal,
        },
    })
}

/// The underlying OS or library error, when it is not a Pingora error (whose
/// context may quote raw request or response bytes).
pub fn plain_cause(e: &Error) -> Option<String> {
    let root = e.root_cause();
    if root.downcast_ref::<Error>().is_some() {
        None
    } else {
        Some(root.to_string())
    }
}

/// One line per failed request.
pub fn log(session: &Session, e: &Error, ctx: &Ctx, status: u16) {
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
    } else if (400..500).contains(&status) || matches!(e.esource(), ErrorSource::Downstream) {
        tracing::debug!(
            event = "request_refused",
            status,
            client = ?ctx.client,
            error = e.etype().as_str(),
            path,
            cause,
        );
    } else {
        tracing::error!(
            event = "proxy_error",
            status,
            client = ?ctx.client,
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
