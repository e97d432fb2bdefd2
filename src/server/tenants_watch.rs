//! The tenants file is re-read when it changes (as on a reload): its length, mtime and
//! inode are polled every second, and a change reloads the configuration (an invalid
//! file keeps the tenants the proxy has, as any invalid reload does).

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::Duration;

use crate::state::Shared;

/// What tells a file changed: (inode, length, mtime in ns). A Kubernetes ConfigMap swap
/// (a symlink moved) changes the inode.
type Stamp = (u64, u64, i64);

fn stamp(path: &std::path::Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.ino(), m.len(), m.mtime() * 1_000_000_000 + m.mtime_nsec()))
}

/// Polls the current runtime's tenants file until `shutdown` turns true.
pub async fn watch(shared: Arc<Shared>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen: Option<(std::path::PathBuf, Option<Stamp>)> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
        let rt = shared.runtime.load_full();
        let Some(path) = rt.config.tenants.file.clone() else {
            seen = None;
            continue;
        };
        let path = if path.is_relative() {
            std::env::current_dir()
                .map(|d| d.join(&path))
                .unwrap_or(path)
        } else {
            path
        };
        let now = stamp(&path);
        match &seen {
            Some((p, s)) if *p == path && *s != now => {
                tracing::info!(event = "tenants_file_changed", file = %path.display(), "the tenants file changed; reloading");
                // Errors are logged and counted by the reload itself.
                let _ = crate::reload::reload_off_thread(&shared).await;
            }
            _ => {}
        }
        seen = Some((path, now));
    }
}
