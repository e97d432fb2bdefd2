//! Hot reload (SIGHUP or `POST /reload`): re-read and validate the file, then
//! swap the runtime atomically. An invalid file keeps the old config. Under systemd
//! the reload is announced ([`crate::lifecycle::notify`]).

use crate::config::ConfigError;
use crate::state::Shared;
use std::sync::Arc;

/// Reload from the file the process was started with. Under systemd it is announced
/// (`RELOADING=1`, then `READY=1` whatever the outcome) while the proxy is ready: not
/// during start-up (`READY=1` is still to come) nor while draining (`STOPPING=1` was
/// sent).
pub fn reload(shared: &Arc<Shared>) -> Result<(), ConfigError> {
    if shared.lifecycle.is_ready() {
        shared.lifecycle.notifier.reloading();
    }
    let result = load_and_apply(shared);
    if shared.lifecycle.is_ready() {
        shared.lifecycle.notifier.ready();
    }
    result
}

fn load_and_apply(shared: &Arc<Shared>) -> Result<(), ConfigError> {
    let result = crate::state::resolve::load(&shared.config_path).inspect(|next| {
        let cur = shared.runtime.load();
        let (old, new) = (&cur.config, next);
        let needs_restart = [
            (old.server.listen != new.server.listen, "server.listen"),
            (old.server.admin_listen != new.server.admin_listen, "server.admin_listen"),
            (old.server.threads != new.server.threads, "server.threads"),
            (old.store != new.store, "redis"),
            (old.server.h2c != new.server.h2c, "server.h2c"),
            (
                old.server.max_response_buffer_bytes != new.server.max_response_buffer_bytes,
                "server.max_response_buffer_bytes",
            ),
            (
                old.server.idle_timeout != new.server.idle_timeout,
                "server.idle_timeout_ms (for HTTP/2; HTTP/1.1 takes it now)",
            ),
            (
                old.server.preserve_header_case != new.server.preserve_header_case,
                "server.preserve_header_case",
            ),
            (
                old.tracing.otlp_endpoint != new.tracing.otlp_endpoint,
                "tracing.otlp_endpoint",
            ),
            (old.log != new.log, "log.format"),
            (
                old.tls.as_ref().map(|t| (&t.listen, t.min_version))
                    != new.tls.as_ref().map(|t| (&t.listen, t.min_version)),
                "tls.listen / tls.min_version",
            ),
        ];
        for (changed, key) in needs_restart {
            if changed {
                tracing::warn!(
                    event = "reload",
                    key,
                    "changed, but only takes effect after a binary upgrade (SIGQUIT + -u) or restart"
                );
            }
        }
    });
    match result {
        Ok(next) => {
            shared.apply(next);
            shared
                .metrics
                .lifecycle
                .config_reloads
                .with_label_values(&["ok"])
                .inc();
            tracing::info!(event = "reload", result = "ok", "configuration reloaded");
            Ok(())
        }
        Err(e) => {
            shared
                .metrics
                .lifecycle
                .config_reloads
                .with_label_values(&["error"])
                .inc();
            tracing::error!(
                event = "reload",
                result = "error",
                key_path = %e.key_path,
                reason = %e.reason,
                "invalid configuration; keeping the old one: {e}"
            );
            Err(e)
        }
    }
}

/// [`reload`] off the calling thread, one reload at a time: reading the config, the
/// certificates and keys never blocks the calling thread (the admin listener's, or the
/// one watching SIGHUP), whatever the files are (CONTRACT §17).
///
/// Every reload runs on one thread of its own ([`reloader`]), so that it allocates from
/// the same allocator arena each time: the memory a reload frees (the table it replaced,
/// the parse of the file) is what the next reload reuses. From threads taken in turn off
/// a pool, each reload left a route table's worth of freed pages in another arena, and
/// the process's RSS grew with the first few reloads of a large config.
pub async fn reload_off_thread(shared: &Arc<Shared>) -> Result<(), ConfigError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let s = Arc::clone(shared);
    let job: Job = Box::new(move || {
        let _one = s.reloading.lock().unwrap_or_else(|p| p.into_inner());
        let _ = tx.send(reload(&s));
    });
    let sent = match reloader() {
        Some(thread) => thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(job)
            .map_err(|e| e.0),
        None => Err(job),
    };
    if let Err(job) = sent {
        // No reload thread: the blocking pool's.
        let _ = tokio::task::spawn_blocking(job).await;
    }
    match rx.await {
        Ok(result) => result,
        Err(e) => Err(ConfigError {
            file: shared.config_path.display().to_string(),
            line_col: None,
            key_path: String::new(),
            reason: format!("the reload task failed: {e}"),
        }),
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// How long after a reload the reload thread nudges its arena: past jemalloc's dirty
/// page decay time (10 s).
const ARENA_NUDGE_AFTER: std::time::Duration = std::time::Duration::from_secs(11);

/// Give the allocator's decay a few thousand ticks on this thread's arena. jemalloc (no
/// background thread) returns freed pages to the system only as an arena allocates, and
/// the reload thread's arena is idle between reloads: without this, the pages the last
/// reload freed (the table it replaced, the parse of the file) stay resident. Large
/// allocations (64 KB, above the thread cache) each tick the arena; a few milliseconds.
fn nudge_arena() {
    for _ in 0..2_000 {
        let v: Vec<u8> = Vec::with_capacity(64 * 1024);
        std::hint::black_box(&v);
    }
}

/// The thread reloads run on, started by the first one; `None` if it cannot start.
fn reloader() -> Option<&'static std::sync::Mutex<std::sync::mpsc::Sender<Job>>> {
    static THREAD: std::sync::OnceLock<Option<std::sync::Mutex<std::sync::mpsc::Sender<Job>>>> =
        std::sync::OnceLock::new();
    THREAD
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<Job>();
            std::thread::Builder::new()
                .name("reload".into())
                .spawn(move || {
                    let mut nudge = false;
                    loop {
                        let job = if nudge {
                            match rx.recv_timeout(ARENA_NUDGE_AFTER) {
                                Ok(job) => job,
                                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                                    nudge = false;
                                    nudge_arena();
                                    continue;
                                }
                                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                            }
                        } else {
                            match rx.recv() {
                                Ok(job) => job,
                                Err(_) => return,
                            }
                        };
                        // A panicking reload answers an error (its sender drops) and
                        // leaves the thread to the next one.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                        nudge = true;
                    }
                })
                .inspect_err(|e| tracing::error!(error = %e, "cannot start the reload thread"))
                .ok()
                .map(|_| std::sync::Mutex::new(tx))
        })
        .as_ref()
}

/// Reload on every SIGHUP until the process ends.
pub async fn watch_sighup(shared: Arc<Shared>) {
    let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGHUP; reload only via POST /reload");
            return;
        }
    };
    while hup.recv().await.is_some() {
        let _ = reload_off_thread(&shared).await;
    }
}
