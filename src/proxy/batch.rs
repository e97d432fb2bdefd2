//! Send coalescing across the requests of one thread.
//!
//! A request makes two sends: its header to the upstream, and the response to the
//! client. Made straight away, each send lands on a peer (the backend, the client) that
//! finished with the previous one and went to sleep, so nearly every send wakes a
//! sleeping task, often with an inter-processor interrupt, in the proxy's own kernel
//! time. HAProxy avoids that by running all of an event-loop turn's requests up to their
//! sends before it makes any of them: the peer is woken once per turn.
//!
//! Here, while other requests are in flight on the same thread, a request yields once to
//! the runtime just before each send ([`before_send`]). Tokio defers a yielded task until
//! the tasks that were ready have run and the I/O driver has been polled, so the sends of
//! the requests one turn made ready go out back to back. With no other request in flight
//! (one client, one request at a time) nothing waits and nothing is added: no extra poll
//! of the driver, no added latency. Requests from HTTP/2 clients do not yield
//! ([`coalesce`]): their connection's task already batches its streams' writes.
//!
//! The count is per thread: each thread runs its own single-threaded runtime
//! (`server.rs`, `work_stealing = false`), so a request stays on the thread that counted
//! it. Were a request's guard dropped on another thread, that only changes whether the
//! next sends yield, never what is sent.
//!
//! Measured (benches/history/2026-11-passes.md, issue 16, fifth pass): at 32 connections
//! on one thread, the tasks the proxy wakes per request fall from 1.9 to 0.6 and its CPU
//! per request by ~20%.

use std::cell::Cell;

thread_local! {
    /// Requests in flight on this thread (a [`InFlight`] alive for each).
    static IN_FLIGHT: Cell<u32> = const { Cell::new(0) };
}

/// Counts one request as in flight on this thread while it is alive.
#[derive(Debug)]
pub struct InFlight(());

impl InFlight {
    pub fn new() -> InFlight {
        IN_FLIGHT.with(|n| n.set(n.get().saturating_add(1)));
        InFlight(())
    }
}

impl Default for InFlight {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.with(|n| n.set(n.get().saturating_sub(1)));
    }
}

/// Requests in flight on this thread.
pub fn in_flight() -> u32 {
    IN_FLIGHT.with(Cell::get)
}

/// Called by a request (holding an [`InFlight`]) just before it sends: yields to the
/// runtime once when another request is in flight on this thread, so that one's send can
/// go out with this one; returns at once otherwise.
pub async fn before_send() {
    if in_flight() > 1 {
        tokio::task::yield_now().await;
    }
}

/// [`before_send`] for an HTTP/1.x client's request. An HTTP/2 client's
/// streams are left alone: its connection's task already writes the frames of all its
/// streams together, and its requests woke a peer 0.4–0.5 times each without yielding
/// (1.9 over HTTP/1.1), so a yield (3–4k instructions for an HTTP/2 stream's task) would
/// cost more than it saves (benches/history/2026-11-passes.md, issue 16, fifth pass).
pub async fn coalesce(session: &pingora::proxy::Session) {
    if !session.is_http2() {
        before_send().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;
    use std::future::Future;
    use std::sync::{Arc, Mutex};

    fn current_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn guards_count_requests_in_flight_on_this_thread() {
        let base = in_flight();
        let a = InFlight::new();
        let b = InFlight::default();
        assert_eq!(in_flight(), base + 2);
        // another thread's requests are not this thread's
        std::thread::spawn(|| {
            let _c = InFlight::new();
            assert_eq!(in_flight(), 1);
        })
        .join()
        .expect("thread");
        assert_eq!(in_flight(), base + 2);
        drop(a);
        assert_eq!(in_flight(), base + 1);
        drop(b);
        assert_eq!(in_flight(), base);
    }

    #[test]
    fn a_lone_request_sends_without_yielding() {
        let _only = InFlight::new();
        assert_eq!(in_flight(), 1);
        assert!(
            before_send().now_or_never().is_some(),
            "no other request: no yield"
        );
    }

    #[test]
    fn with_another_request_in_flight_the_send_waits_one_turn() {
        let _a = InFlight::new();
        let _b = InFlight::new();
        let mut send = Box::pin(before_send());
        let waker = futures_util::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        let rt = current_thread();
        rt.block_on(async {
            assert!(send.as_mut().poll(&mut cx).is_pending(), "yields once");
            assert!(send.as_mut().poll(&mut cx).is_ready(), "then goes on");
        });
    }

    /// Requests made ready in the same turn, on a thread's single-threaded runtime as
    /// the proxy runs them: each runs up to its send before any sends, so the sends go
    /// out back to back. Without the yield the order would be ready, send, ready, send.
    #[test]
    fn requests_ready_in_one_turn_send_together() {
        let rt = current_thread();
        let order = Arc::new(Mutex::new(Vec::new()));
        rt.block_on(async {
            let mut tasks = Vec::new();
            for name in ["a", "b", "c"] {
                let order = order.clone();
                let guard = InFlight::new();
                tasks.push(tokio::spawn(async move {
                    order.lock().expect("lock").push((name, "ready"));
                    before_send().await;
                    order.lock().expect("lock").push((name, "sends"));
                    drop(guard);
                }));
            }
            for t in tasks {
                t.await.expect("task");
            }
        });
        let order = order.lock().expect("lock");
        let steps: Vec<&str> = order.iter().map(|(_, step)| *step).collect();
        assert_eq!(
            steps,
            ["ready", "ready", "ready", "sends", "sends", "sends"]
        );
        let mut sent: Vec<&str> = order[3..].iter().map(|(name, _)| *name).collect();
        sent.sort_unstable();
        assert_eq!(sent, ["a", "b", "c"]);
        assert_eq!(in_flight(), 0);
    }
}
