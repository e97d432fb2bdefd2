//! Errors Pingora hands back (`fail_to_proxy`): which refusal answers them, and
//! the one log line each failure gets. Client aborts are normal traffic:
//! counted and logged at debug. A line names the error kind, the path (no
//! query) and the backend; never a header value or the error's free-text
//! context, which may quote raw request bytes.

use pingora::proxy::Session;
use pingora::{Error, ErrorSource, ErrorType};

use super::Ctx;
use crate::respond::Refusal;

/// A client that went away (hang-up, reset) before its response was complete. Over
/// HTTP/2 that includes a client that reset its stream (RST_STREAM, e.g. CANCEL): Pingora
/// reports it as a downstream `H2Error`, and there is no stream left to answer on.
pub fn is_client_abort(e: &Error) -> bool {
    matches!(e.esource(), ErrorSource::Downstream)
        && matches!(
            e.etype(),
            ErrorType::ReadError
                | ErrorType::WriteError
                | ErrorType::ConnectionClosed
                | ErrorType::H2Error
        )
}

/// The refusal that answers `e`, or `None` when there is nobody to answer (the
/// client went away). A refusal a gate already chose (`ctx.answer.refusal`) wins.
pub fn refusal_for(e: &Error, ctx: &Ctx) -> Option<Refusal> {
    match &ctx.answer.refusal {
        Some(r) => Some(r.clone()),
        None => error_refusal(e),
    }
}

/// The refusal that answers `e` when no gate chose one.
fn error_refusal(e: &Error) -> Option<Refusal> {
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
    let upstream = ctx.routing.pool.as_ref().map_or("", |p| p.name.as_str());
    let cause = plain_cause(e).unwrap_or_default();
    if is_client_abort(e) {
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
            client = ?ctx.routing.client,
            error = e.etype().as_str(),
            path,
            cause,
        );
    } else {
        tracing::error!(
            event = "proxy_error",
            status,
            client = ?ctx.routing.client,
            error = e.etype().as_str(),
            source = e.esource().as_str(),
            path,
            upstream,
            backend = ctx
                .upstream
                .backend
                .as_ref()
                .map(|b| b.addr.to_string())
                .unwrap_or_default(),
            cause,
            "request failed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(etype: ErrorType, source: ErrorSource) -> Box<Error> {
        Error::create(etype, source, None, None)
    }

    #[test]
    fn a_client_that_left_is_an_abort_and_gets_no_answer() {
        for etype in [
            ErrorType::ReadError,
            ErrorType::WriteError,
            ErrorType::ConnectionClosed,
            ErrorType::H2Error, // the client reset its HTTP/2 stream
        ] {
            let e = err(etype.clone(), ErrorSource::Downstream);
            assert!(is_client_abort(&e), "{etype:?}");
            assert!(error_refusal(&e).is_none(), "{etype:?}");
            // the same kinds from the backend are the backend's failures
            let e = err(etype.clone(), ErrorSource::Upstream);
            assert!(!is_client_abort(&e), "{etype:?} upstream");
            assert!(
                matches!(error_refusal(&e), Some(Refusal::UpstreamError)),
                "{etype:?} upstream"
            );
        }
        // a malformed request is not an abort: it is answered
        let e = err(ErrorType::InvalidHTTPHeader, ErrorSource::Downstream);
        assert!(!is_client_abort(&e));
        assert!(matches!(error_refusal(&e), Some(Refusal::BadRequest(_))));
    }
}
