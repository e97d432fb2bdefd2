//! Process lifecycle: readiness, draining and the shutdown sequence.
//!
//! SIGTERM (or a watchdog grant, see [`crate::watchdog`]): `/readyz` turns 503 at
//! once, traffic is still proxied for `drain_seconds`, then listeners close
//! (Pingora's shutdown broadcast) and the process exits as soon as nothing is in
//! flight, or after `shutdown_timeout_seconds` at the latest. Stock Pingora
//! instead stops accepting at once and then sleeps a fixed grace period (300 s
//! by default).
//!
//! SIGQUIT: once a new process (`-u`) listens on `upgrade_sock`, readiness fails
//! and Pingora hands the listening sockets over; both processes accept for
//! Pingora's 5 s close timeout, then this one stops accepting and exits when
//! idle. Without a new process it logs why and stays up (stock Pingora would
//! shut down anyway). SIGINT: exit now.
//!
//! Under systemd ([`notify`]): `STOPPING=1` when draining starts (SIGTERM, a watchdog
//! restart) or on SIGINT; none on a SIGQUIT hand-over, where a new process carries on.
//!
//! [`GracefulApp`] wraps the proxy application: it counts client connections and
//! keeps serving connections accepted just before the listeners closed for
//! [`ACCEPT_GRACE`], which Pingora's cleanup would otherwise drop unanswered.

pub mod notify;

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::Stream;
use pingora::server::{ExecutionPhase, ShutdownSignal, ShutdownSignalWatch, ShutdownWatch};
use portcullis_policy::shed::Shedder;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::broadcast;

const STARTING: u8 = 0;
const READY: u8 = 1;
const DRAINING: u8 = 2;

#[derive(Debug)]
pub struct Lifecycle {
    state: AtomicU8,
    /// Wakes [`Lifecycle::draining`] waiters when draining starts (by signal or
    /// by the watchdog).
    drain_started: tokio::sync::Notify,
    /// What the service manager is told (systemd's notify protocol).
    pub notifier: notify::Notifier,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self {
            state: AtomicU8::new(STARTING),
            drain_started: tokio::sync::Notify::new(),
            notifier: notify::Notifier::default(),
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
            self.drain_started.notify_waiters();
            self.drain_started.notify_one();
        }
        first
    }

    /// Resolves once draining has started (by signal, or by the watchdog).
    pub async fn draining(&self) {
        while !self.is_draining() {
            self.drain_started.notified().await;
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
    /// Client connections of the proxy service ([`GracefulApp`]).
    pub connections: Arc<Connections>,
}

/// How long SIGQUIT waits for a new process to listen on `upgrade_sock` (the
/// new process may be started right after the signal, as in Pingora's systemd
/// recipe); Pingora's own sender retries about as long.
const UPGRADE_WAIT: Duration = Duration::from_secs(5);

/// Polls until `path` exists or `UPGRADE_WAIT` passes. Only existence is checked:
/// connecting would consume the new process's one hand-over connection.
async fn new_process_listens(path: &Path) -> bool {
    let deadline = deadline_after(UPGRADE_WAIT);
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

/// The signals that end the process: SIGTERM, SIGQUIT and SIGINT.
struct Signals {
    term: Signal,
    quit: Signal,
    int: Signal,
}

impl Signals {
    fn install() -> Option<Self> {
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::quit()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(quit), Ok(int)) => Some(Self { term, quit, int }),
            _ => None,
        }
    }
}

impl DrainingShutdown {
    /// Waits for the signal (or the watchdog's drain) that ends this process. SIGQUIT
    /// counts only once a new process listens on `upgrade_sock`.
    async fn next_signal(&self, signals: &mut Signals) -> ShutdownSignal {
        let Signals { term, quit, int } = signals;
        loop {
            let kind = tokio::select! {
                _ = term.recv() => ShutdownSignal::GracefulTerminate,
                _ = quit.recv() => ShutdownSignal::GracefulUpgrade,
                _ = int.recv() => ShutdownSignal::FastShutdown,
                _ = self.lifecycle.draining() => ShutdownSignal::GracefulTerminate,
            };
            if !matches!(kind, ShutdownSignal::GracefulUpgrade) {
                return kind;
            }
            // Without a new process Pingora would still shut this one down after
            // failing to hand the listeners over: a full outage. Stay up instead.
            let listening = tokio::select! {
                l = new_process_listens(&self.upgrade_sock) => l,
                _ = term.recv() => return ShutdownSignal::GracefulTerminate,
                _ = int.recv() => return ShutdownSignal::FastShutdown,
            };
            if listening {
                return kind;
            }
            tracing::error!(
                event = "upgrade",
                upgrade_sock = %self.upgrade_sock.display(),
                wait_seconds = UPGRADE_WAIT.as_secs(),
                "SIGQUIT, but no new process listens on upgrade_sock (start `portcullis -u` first); staying up"
            );
        }
    }

    /// SIGQUIT: the new process is taking the listeners; readiness fails so that
    /// load balancers prefer it, and Pingora hands over the fds.
    fn hand_over(&self) {
        self.lifecycle.start_draining();
        tracing::info!(
            event = "shutdown",
            mode = "upgrade",
            "SIGQUIT: handing listeners over"
        );
    }

    /// SIGTERM: readiness fails and traffic is still proxied for `drain`. False when
    /// SIGINT cut the drain short.
    async fn drain_period(&self, int: &mut Signal) -> bool {
        self.lifecycle.start_draining();
        self.lifecycle.notifier.stopping();
        tracing::info!(
            event = "shutdown",
            mode = "graceful",
            drain_seconds = self.drain.as_secs(),
            "readiness failed; still proxying during drain"
        );
        tokio::select! {
            _ = tokio::time::sleep(self.drain) => true,
            _ = int.recv() => false,
        }
    }

    /// Once Pingora has closed the listeners, exit as soon as nothing is in flight.
    fn exit_when_idle(&self) {
        let phases = self.phases.lock().ok().and_then(|mut p| p.take());
        spawn_exit_when_idle(
            Arc::clone(&self.shedder),
            Arc::clone(&self.connections),
            self.shutdown_timeout,
            phases,
        );
    }
}

#[async_trait]
impl ShutdownSignalWatch for DrainingShutdown {
    async fn recv(&self) -> ShutdownSignal {
        let Some(mut signals) = Signals::install() else {
            tracing::error!("cannot install signal handlers; exiting");
            return ShutdownSignal::FastShutdown;
        };
        let kind = self.next_signal(&mut signals).await;
        match kind {
            ShutdownSignal::FastShutdown => {
                tracing::info!(event = "shutdown", mode = "fast", "SIGINT: exiting now");
                self.lifecycle.notifier.stopping();
                force_exit_after(FAST_EXIT_GRACE);
                return kind;
            }
            ShutdownSignal::GracefulUpgrade => self.hand_over(),
            _ => {
                if !self.drain_period(&mut signals.int).await {
                    force_exit_after(FAST_EXIT_GRACE);
                    return ShutdownSignal::FastShutdown;
                }
            }
        }
        self.exit_when_idle();
        kind
    }
}

/// How long Pingora gets to stop its runtimes after SIGINT before the process
/// ends itself.
const FAST_EXIT_GRACE: Duration = Duration::from_millis(500);

/// SIGINT means exit now. Pingora's fast shutdown stops the runtimes without
/// waiting, but an accept loop whose runtime is being shut down can spin on
/// "Tokio context is being shutdown" errors without ever yielding, and the
/// process then never exits (seen here: 17 GB of log lines in 40 minutes). So a
/// plain thread ends the process after a short grace, whatever Pingora does.
fn force_exit_after(grace: Duration) {
    let spawned = std::thread::Builder::new()
        .name("fast-exit".into())
        .spawn(move || {
            std::thread::sleep(grace);
            tracing::warn!(
                event = "shutdown",
                mode = "fast",
                "runtimes still running after SIGINT; exiting"
            );
            std::process::exit(0);
        });
    if spawned.is_err() {
        std::process::exit(0);
    }
}

/// How long nothing may be in flight before the process exits (debounce).
const QUIET: Duration = Duration::from_millis(50);

/// How long the proxy service keeps serving connections it accepted before the
/// listeners closed but whose first request has not been read yet. Pingora's
/// cleanup drops such connections without an answer; under load (or with a
/// slow client) a connection accepted in the last moment would see a reset.
pub const ACCEPT_GRACE: Duration = Duration::from_millis(250);

/// Client connections of the proxy service, counted by [`GracefulApp`].
#[derive(Debug, Default)]
pub struct Connections {
    open: AtomicU64,
    cleaned_up: AtomicBool,
}

impl Connections {
    /// Connections being served (including idle keep-alive ones).
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Acquire)
    }

    /// True once the listeners closed and Pingora's cleanup ran (idle and
    /// not-yet-read connections are being dropped).
    pub fn is_cleaned_up(&self) -> bool {
        self.cleaned_up.load(Ordering::Acquire)
    }
}

struct OpenConnection<'a>(&'a Connections);

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Wraps the proxy application: counts open client connections, and delays
/// Pingora's cleanup by [`ACCEPT_GRACE`] so that connections accepted just
/// before the listeners closed still get their request read and answered.
pub struct GracefulApp<A> {
    inner: Arc<A>,
    connections: Arc<Connections>,
}

impl<A> GracefulApp<A> {
    pub fn new(inner: A, connections: Arc<Connections>) -> Self {
        Self {
            inner: Arc::new(inner),
            connections,
        }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for GracefulApp<A> {
    async fn process_new(
        self: &Arc<Self>,
        session: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        self.connections.open.fetch_add(1, Ordering::AcqRel);
        let _open = OpenConnection(&self.connections);
        self.inner.process_new(session, shutdown).await
    }

    async fn cleanup(&self) {
        tokio::time::sleep(ACCEPT_GRACE).await;
        self.inner.cleanup().await;
        self.connections.cleaned_up.store(true, Ordering::Release);
    }
}

/// After Pingora broadcasts shutdown it sleeps a fixed grace period; this
/// thread ends the process as soon as nothing is left to serve instead. It
/// starts once Pingora enters its grace period, that is after the listeners
/// closed (and, on upgrade, after the listeners were handed over and Pingora's
/// close timeout passed, so it never exits under the hand-over); then it waits
/// for the proxy's cleanup ([`ACCEPT_GRACE`]) and for every request and client
/// connection to finish, `timeout` at most.
fn spawn_exit_when_idle(
    shedder: Arc<Shedder>,
    connections: Arc<Connections>,
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
            let deadline = deadline_after(timeout);
            tracing::info!(
                event = "shutdown",
                inflight = shedder.inflight(),
                connections = connections.open(),
                timeout_seconds = timeout.as_secs(),
                "listeners closed; waiting for in-flight requests"
            );
            // The accept grace has passed once the proxy's cleanup ran; count it
            // here too, so a starved runtime timer cannot hold an idle process.
            let grace_end = deadline_after(ACCEPT_GRACE);
            let idle = || {
                (connections.is_cleaned_up() || Instant::now() >= grace_end)
                    && shedder.inflight() == 0
                    && connections.open() == 0
            };
            if wait_quiet(deadline, idle) {
                tracing::info!(event = "shutdown", "nothing in flight; exiting");
            } else {
                tracing::warn!(
                    event = "shutdown",
                    inflight = shedder.inflight(),
                    connections = connections.open(),
                    "shutdown timeout; exiting with requests in flight"
                );
            }
            std::process::exit(0);
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot spawn exit thread; relying on the grace period");
    }
}

/// `now + d` without overflow: a duration past what `Instant` can hold means
/// "no deadline", which a year stands for (config validation keeps real values
/// far below; this only makes a panic impossible).
pub fn deadline_after(d: Duration) -> Instant {
    deadline_from(Instant::now(), d)
}

fn deadline_from(now: Instant, d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(365 * 24 * 3600);
    now.checked_add(d)
        .or_else(|| now.checked_add(FAR))
        .unwrap_or(now)
}

/// Polls `cond` every 5 ms until it holds (true) or `deadline` passes (false).
fn wait_until(deadline: Instant, mut cond: impl FnMut() -> bool) -> bool {
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Like [`wait_until`], but `idle` must hold continuously for [`QUIET`].
fn wait_quiet(deadline: Instant, mut idle: impl FnMut() -> bool) -> bool {
    let mut idle_since: Option<Instant> = None;
    wait_until(deadline, || {
        let now = Instant::now();
        if idle() {
            let since = *idle_since.get_or_insert(now);
            now.duration_since(since) >= QUIET
        } else {
            idle_since = None;
            false
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_never_overflows() {
        let now = Instant::now();
        let huge = Duration::from_secs(u64::MAX);
        assert!(deadline_from(now, huge) > now);
        assert_eq!(
            deadline_from(now, Duration::from_secs(30)),
            now + Duration::from_secs(30)
        );
    }

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
