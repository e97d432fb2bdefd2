//! Hot reload (SIGHUP or `POST /reload`): re-read and validate the file, then
//! swap the runtime atomically. An invalid file keeps the old config. Under systemd
//! the reload is announced ([`notify`]).

use crate::config::ConfigError;
use crate::lifecycle::notify;
use crate::state::Shared;
use std::sync::Arc;

/// Reload from the file the process was started with. Under systemd it is announced
/// (`RELOADING=1`, then `READY=1` whatever the outcome) while the proxy is ready: not
/// during start-up (`READY=1` is still to come) nor while draining (`STOPPING=1` was
/// sent).
pub fn reload(shared: &Arc<Shared>) -> Result<(), ConfigError> {
    if shared.lifecycle.is_ready() {
        notify::reloading();
    }
    let result = load_and_apply(shared);
    if shared.lifecycle.is_ready() {
        notify::ready();
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

/// [`reload`] on tokio's blocking pool, one reload at a time: reading the config, the
/// certificates and keys never blocks the calling thread (the admin listener's, or the
/// one watching SIGHUP), whatever the files are (CONTRACT §17).
pub async fn reload_off_thread(shared: &Arc<Shared>) -> Result<(), ConfigError> {
    let s = Arc::clone(shared);
    let task = tokio::task::spawn_blocking(move || {
        let _one = s.reloading.lock().unwrap_or_else(|p| p.into_inner());
        reload(&s)
    });
    match task.await {
        Ok(result) => result,
        Err(e) => Err(ConfigError {
            file: shared.config_path.display().to_string(),
            line_col: None,
            key_path: String::new(),
            reason: format!("the reload task failed: {e}"),
        }),
    }
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
