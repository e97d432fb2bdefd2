//! Process lifecycle: readiness, draining and the shutdown sequence.
//!
//! SIGTERM: `/readyz` turns 503 at once, traffic is still proxied for
//! `drain_seconds`, then listeners close (Pingora's shutdown broadcast) and the
//! process exits as soon as nothing is in flight, or after
//! `shutdown_timeout_seconds` at the latest. Stock Pingora instead stops
//! accepting at once and then sleeps a fixed grace period.

use crate::shed::Shedder;
use async_trait::async_trait;
use pingora::server::{ExecutionPhase, ShutdownSignal, ShutdownSignalWatch};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::broadcast;

const STARTING: u8 = 0;
const READY: u8 = 1;
const DRAINING: u8 = 2;

#[derive(Debug)]
pub struct Lifecycle {
    state: AtomicU8,
    /// Set when the readiness flip came from the watchdog, not a signal.
    notify: tokio::sync::Notify,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self {
            state: AtomicU8::new(STARTING),
            notify: tokio::sync::Notify::new(),
        }
    }
}

impl Lifecycle {
    pub fn is_ready(&self) -> bool {
        self.state.load(Ordering::Acquire) == READY
    }

    pub fn state_name(&self) -> &'static str {
        match self.state.load(Ordering::Acquire) {
            STARTING => "starting",
            READY => "ready",
            _ => "draining",
        }
    }

    /// Starting → ready, once the proxy listeners accept connections.
    /// Never undoes draining.
    pub fn mark_ready(&self) -> bool {
        self.state
            .compare_exchange(STARTING, READY, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    pub fn is_draining(&self) -> bool {
        self.state.load(Ordering::Acquire) == DRAINING
    }

    /// Fail readiness; returns true the first time.
    pub fn start_draining(&self) -> bool {
        let first = self.state.swap(DRAINING, Ordering::AcqRel) != DRAINING;
        if first {
            self.notify.notify_waiters();
            self.notify.notify_one();
        }
        first
    }

    /// Resolves once draining has started (by signal, or by the watchdog).
    pub async fn draining(&self) {
        while !self.is_draining() {
            self.notify.notified().await;
        }
    }
}

/// The shutdown watch handed to Pingora: it delays Pingora's broadcast until the
/// drain period is over and arranges a prompt exit once nothing is in flight.
pub struct DrainingShutdown {
    pub lifecycle: Arc<Lifecycle>,
    pub shedder: Arc<Shedder>,
    pub drain: Duration,
    pub shutdown_timeout: Duration,
    /// From `Server::watch_execution_phase()`, taken before `run`.
    pub phases: std::sync::Mutex<Option<broadcast::Receiver<ExecutionPhase>>>,
    /// `server.upgrade_sock`: on SIGQUIT the listeners are only handed over (and
    /// this process only shuts down) once a new process (`-u`) listens there.
    pub upgrade_sock: PathBuf,
}

/// How long SIGQUIT waits for a new process to listen on `upgrade_sock` (the
/// new process may be started right after the signal, as in Pingora's systemd
/// recipe); Pingora's own sender retries about as long.
const UPGRADE_WAIT: Duration = Duration::from_secs(5);

/// Polls until `path` exists or `UPGRADE_WAIT` passes. Only existence is checked:
/// connecting would consume the new process's one hand-over connection.
async fn new_process_listens(path: &Path) -> bool {
    let deadline = Instant::now() + UPGRADE_WAIT;
    loop {
        if path.exists() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[async_trait]
impl ShutdownSignalWatch for DrainingShutdown {
    async fn recv(&self) -> ShutdownSignal {
        let (mut term, mut quit, mut int) = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::quit()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(t), Ok(q), Ok(i)) => (t, q, i),
            _ => {
                tracing::error!("cannot install signal handlers; exiting");
                return ShutdownSignal::FastShutdown;
            }
        };
        let kind = loop {
            let kind = tokio::select! {
                _ = term.recv() => ShutdownSignal::GracefulTerminate,
                _ = quit.recv() => ShutdownSignal::GracefulUpgrade,
                _ = int.recv() => ShutdownSignal::FastShutdown,
                _ = self.lifecycle.draining() => ShutdownSignal::GracefulTerminate,
            };
            if !matches!(kind, ShutdownSignal::GracefulUpgrade) {
                break kind;
            }
            // Without a new process Pingora would still shut this one down after
            // failing to hand the listeners over: a full outage. Stay up instead.
            let listening = tokio::select! {
                l = new_process_listens(&self.upgrade_sock) => l,
                _ = term.recv() => break ShutdownSignal::GracefulTerminate,
                _ = int.recv() => break ShutdownSignal::FastShutdown,
            };
            if listening {
                break kind;
            }
            tracing::error!(
                event = "upgrade",
                upgrade_sock = %self.upgrade_sock.display(),
                wait_seconds = UPGRADE_WAIT.as_secs(),
                "SIGQUIT, but no new process listens on upgrade_sock (start `portcullis -u` first); staying up"
            );
        };
        match kind {
            ShutdownSignal::FastShutdown => {
                tracing::info!(event = "shutdown", mode = "fast", "SIGINT: exiting now");
                return kind;
            }
            ShutdownSignal::GracefulUpgrade => {
                // The new process is taking the listeners; readiness fails so that
                // load balancers prefer it, and Pingora hands over the fds.
                self.lifecycle.start_draining();
                tracing::info!(
                    event = "shutdown",
                    mode = "upgrade",
                    "SIGQUIT: handing listeners over"
                );
            }
            _ => {
                self.lifecycle.start_draining();
                tracing::info!(
                    event = "shutdown",
                    mode = "graceful",
                    drain_seconds = self.drain.as_secs(),
                    "readiness failed; still proxying during drain"
                );
                tokio::select! {
                    _ = tokio::time::sleep(self.drain) => {}
                    _ = int.recv() => return ShutdownSignal::FastShutdown,
                }
            }
        }
        let phases = self.phases.lock().ok().and_then(|mut p| p.take());
        spawn_exit_when_idle(Arc::clone(&self.shedder), self.shutdown_timeout, phases);
        kind
    }
}

/// How long nothing may be in flight before the process exits. Covers a request
/// whose connection was accepted just before the listeners closed and whose
/// headers are parsed but not yet admitted (counted) by the load shedder.
const QUIET: Duration = Duration::from_millis(50);

/// After Pingora broadcasts shutdown it sleeps a fixed grace period; this
/// thread ends the process as soon as no request is in flight instead. It
/// starts counting once Pingora enters its grace period, that is after the
/// listeners closed (and, on upgrade, after the listeners were handed over and
/// Pingora's close timeout passed, so it never exits under the hand-over).
fn spawn_exit_when_idle(
    shedder: Arc<Shedder>,
    timeout: Duration,
    phases: Option<broadcast::Receiver<ExecutionPhase>>,
) {
    let spawned = std::thread::Builder::new()
        .name("exit-when-idle".into())
        .spawn(move || {
            if let Some(mut rx) = phases {
                loop {
                    match rx.blocking_recv() {
                        Ok(ExecutionPhase::ShutdownGracePeriod)
                        | Ok(ExecutionPhase::ShutdownRuntimes)
                        | Err(broadcast::error::RecvError::Closed) => break,
                        _ => {}
                    }
                }
            }
            tracing::info!(
                event = "shutdown",
                inflight = shedder.inflight(),
                timeout_seconds = timeout.as_secs(),
                "listeners closed; waiting for in-flight requests"
            );
            if wait_idle(&shedder, timeout) {
                tracing::info!(event = "shutdown", "nothing in flight; exiting");
            } else {
                tracing::warn!(
                    event = "shutdown",
                    inflight = shedder.inflight(),
                    "shutdown timeout; exiting with requests in flight"
                );
            }
            std::process::exit(0);
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot spawn exit thread; relying on the grace period");
    }
}

/// Blocks until nothing has been in flight for [`QUIET`] (true) or `timeout`
/// passed (false).
fn wait_idle(shedder: &Shedder, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut idle_since: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if shedder.inflight() == 0 {
            let since = *idle_since.get_or_insert(now);
            if now.duration_since(since) >= QUIET {
                return true;
            }
        } else {
            idle_since = None;
        }
        if now >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn draining_resolves_after_flip() {
        let l = Arc::new(Lifecycle::default());
        assert!(!l.is_ready());
        assert_eq!(l.state_name(), "starting");
        assert!(l.mark_ready());
        assert!(l.is_ready());
        let l2 = Arc::clone(&l);
        let waiter = tokio::spawn(async move { l2.draining().await });
        tokio::task::yield_now().await;
        assert!(l.start_draining());
        assert!(!l.start_draining());
        waiter.await.expect("join");
        assert_eq!(l.state_name(), "draining");
        assert!(!l.mark_ready(), "draining is final");
    }
}
