//! Waiting at the cap (`[shedding] queue_timeout_ms`) and for an upstream's room
//! (`[[upstreams]] queue_timeout_ms`): the request waits, raced against its time and its
//! client. A client that goes away leaves the line and nothing is sent upstream.
//!
//! What the client's leaving looks like: on HTTP/2 the stream's reset (or close); on
//! HTTP/1.1 the connection's end, read once the request has no body left to read (a
//! pipelined next request is kept for later). A request whose body is still to come is
//! not watched: it waits until its slot or its time.

use std::time::{Duration, Instant};

use pingora::proxy::Session;

use crate::metrics::ShedReason;
use crate::respond::Refusal;
use crate::state::Shared;
use crate::upstream::Pool;
use portcullis_policy::shed::queue::Rank;
use portcullis_policy::shed::{Enqueued, QueueRefusal, Shedder};

/// How a wait ended without a slot.
pub(super) enum Left {
    /// Answered with this refusal (503 + `Retry-After`).
    Refused(Refusal),
    /// Its client went away: nothing more to send.
    ClientGone,
}

/// Resolves when the request's client has gone away (never, when that cannot be seen).
async fn client_gone(session: &mut Session) {
    let ds = session.as_downstream_mut();
    if let Some(idle) = ds.watch_h2_stream_close() {
        let _ = idle.await;
        return;
    }
    if ds.is_body_done() {
        // An error is the client's end (FIN or reset); data is a pipelined request, kept.
        let _ = ds.read_body_or_idle(true).await;
        return;
    }
    std::future::pending::<()>().await
}

/// `Retry-After` of a request the queue refused: spread as the cap's sheds are.
fn retry_after(shedder: &Shedder, base: u64) -> u64 {
    let now_secs = portcullis_store::clock::unix_secs();
    shedder.share.refuse(base, now_secs, fastrand::u64(..))
}

/// Wait in the shedder's queue for a slot of `rank`'s class: the slot, or why not.
pub(super) async fn slot(
    shared: &Shared,
    session: &mut Session,
    rank: Rank,
    timeout: Duration,
    max_queue: u64,
    retry_after_base: u64,
) -> Result<portcullis_policy::shed::InflightGuard, Left> {
    let shedder = &shared.shedder;
    let metrics = &shared.metrics.shed;
    let started = Instant::now();
    let refused = |reason: ShedReason| {
        metrics.shed(rank.class, reason);
        Left::Refused(Refusal::Shed {
            retry_after: retry_after(shedder, retry_after_base),
        })
    };
    let wait = match shedder.enqueue(rank, max_queue, started) {
        Enqueued::Admitted(guard) => {
            metrics.queue_wait.observe(0.0);
            return Ok(guard);
        }
        Enqueued::Refused(_) => return Err(refused(ShedReason::QueueFull)),
        Enqueued::Waiting(w) => w,
    };
    let outcome = tokio::select! {
        r = wait => Some(r),
        _ = tokio::time::sleep(timeout) => None,
        _ = client_gone(session) => {
            metrics.left_queue.inc();
            return Err(Left::ClientGone);
        }
    };
    match outcome {
        Some(Ok((guard, waited))) => {
            metrics.queue_wait.observe(waited.as_secs_f64());
            Ok(guard)
        }
        Some(Err(QueueRefusal::Shed)) => Err(refused(ShedReason::QueueTimeout)),
        Some(Err(QueueRefusal::Full)) => Err(refused(ShedReason::QueueFull)),
        None => Err(refused(ShedReason::QueueTimeout)),
    }
}

/// What waiting for an upstream's room found.
pub(super) enum Room<T> {
    Got(T),
    Left(Left),
}

/// Wait until `take` finds room in `pool` (its bulkhead, or a backend under `max_conn`),
/// up to the upstream's `queue_timeout_ms`; at most `max_queue` wait at once.
pub(super) async fn upstream<T>(
    shared: &Shared,
    session: &mut Session,
    pool: &Pool,
    retry_after_base: u64,
    mut take: impl FnMut() -> Option<T>,
) -> Room<T> {
    let room = pool.room();
    let metrics = &shared.metrics.shed;
    let refuse = |reason: &'static str| {
        metrics
            .upstream_queue_shed
            .with_label_values(&[pool.name.as_str(), reason])
            .inc();
        Room::Left(Left::Refused(Refusal::Shed {
            retry_after: pool
                .shed_retry_after(retry_after_base, portcullis_store::clock::unix_secs()),
        }))
    };
    let Some(_place) = room.join(pool.max_queue()) else {
        return refuse("queue_full");
    };
    let deadline = tokio::time::Instant::now() + pool.balance.queue_timeout;
    let gone = client_gone(session);
    tokio::pin!(gone);
    loop {
        let freed = room.freed();
        tokio::pin!(freed);
        freed.as_mut().enable();
        if let Some(t) = take() {
            return Room::Got(t);
        }
        tokio::select! {
            _ = &mut freed => {}
            _ = tokio::time::sleep_until(deadline) => return refuse("queue_timeout"),
            _ = &mut gone => {
                metrics.left_queue.inc();
                return Room::Left(Left::ClientGone);
            }
        }
    }
}
