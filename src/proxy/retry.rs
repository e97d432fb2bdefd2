//! When a request may go to another backend (CONTRACT §10 `retries`):
//! - a failed connect: always, while an untried backend remains (nothing was
//!   sent), outside the budget but counted in it;
//! - a 502/503 answer or a reset connection: only for GET, HEAD, OPTIONS,
//!   PUT and DELETE whose body was read whole (not streamed past Pingora's
//!   retry buffer), at most `retries` times per request, and only while the
//!   upstream's retry budget allows ([`crate::balance::retry_budget`]).
//!
//! Every attempt's outcome is recorded against its backend (culling), and a
//! retry keeps the request's shedding and bulkhead slots: it never bypasses
//! either.

use pingora::proxy::Session;
use pingora::ErrorType;

use super::Ctx;
use crate::metrics::Metrics;

/// Methods safe to send twice (RFC 9110 §9.2.2), as CONTRACT §10 lists them.
fn idempotent(m: &http::Method) -> bool {
    matches!(
        *m,
        http::Method::GET
            | http::Method::HEAD
            | http::Method::OPTIONS
            | http::Method::PUT
            | http::Method::DELETE
    )
}

/// The request can be replayed: idempotent, body read whole and kept.
pub fn replayable(session: &mut Session) -> bool {
    idempotent(&session.req_header().method)
        && !session.as_ref().retry_buffer_truncated()
        && session.as_mut().is_body_done()
}

/// An error after connect that a retry may cure (the backend dropped or reset
/// the connection). Timeouts are not retried: the request may just be slow.
pub fn is_reset(e: &pingora::Error) -> bool {
    matches!(
        e.etype(),
        ErrorType::ConnectionClosed | ErrorType::ReadError | ErrorType::WriteError
    ) && matches!(e.esource(), pingora::ErrorSource::Upstream)
}

/// Take a retry for a 502/503/reset if every rule allows it; counts the
/// decision (`sent` / `budget_exhausted`).
pub fn take(session: &mut Session, ctx: &mut Ctx, metrics: &Metrics) -> bool {
    let Some(pool) = ctx.routing.pool.clone() else {
        return false;
    };
    if ctx.upstream.retries_used >= pool.balance.retries
        || session.response_written().is_some()
        || !replayable(session)
        || !pool.has_untried(&ctx.upstream.tried)
    {
        return false;
    }
    let granted = pool
        .shared
        .budget
        .try_retry(portcullis_store::clock::unix_secs());
    metrics.proxy.retry(&pool.name, granted);
    if granted {
        ctx.upstream.retries_used += 1;
        tracing::debug!(event = "retry", upstream = %pool.name, attempt = ctx.upstream.retries_used);
    }
    granted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_methods_only() {
        for m in ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"] {
            assert!(idempotent(&m.parse().unwrap_or(http::Method::POST)), "{m}");
        }
        for m in [
            http::Method::POST,
            http::Method::PATCH,
            http::Method::CONNECT,
        ] {
            assert!(!idempotent(&m));
        }
    }
}
