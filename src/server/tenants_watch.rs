//! The tenants file is re-read when it changes (as on a reload): its length, mtime and
//! inode are polled every second, and a change reloads the configuration once the file
//! has stayed the same (those and a hash of its content) for one more poll: a file being
//! written in place (not renamed into place) is not read half written. An invalid file
//! keeps the tenants the proxy has, as any invalid reload does (and so does a file with
//! no tenant, unless `tenants.allow_empty`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::FileKind;
use crate::state::Shared;

/// What tells a file changed: (inode, length, mtime in ns). A Kubernetes ConfigMap swap
/// (a symlink moved) changes the inode.
type Meta = (u64, u64, i64);

/// A file as one poll found it: its [`Meta`] and, when it differs from the file last
/// applied, a hash of its content (`None`: unreadable, or over its cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    meta: Meta,
    content: Option<u64>,
}

fn meta(path: &Path) -> Option<Meta> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.ino(), m.len(), m.mtime() * 1_000_000_000 + m.mtime_nsec()))
}

/// A hash of the file's content, read as the reload would (at most `cap` bytes).
fn content_hash(path: &Path, cap: u64) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let bytes = crate::config::read_regular_file(path, FileKind::Tenants(cap)).ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    Some(h.finish())
}

/// The watcher's view of the file: what was applied, and a change waiting for one more
/// poll. Plain state, driven by [`Watch::poll`] (no clock, no file).
#[derive(Debug, Default)]
struct Watch {
    path: Option<PathBuf>,
    /// The file as found at start or as last reloaded (whether the reload took it or not).
    applied: Option<Option<Stamp>>,
    /// A change the previous poll found: applied when this poll finds the same.
    pending: Option<Option<Stamp>>,
}

/// What one poll decided.
#[derive(Debug, PartialEq, Eq)]
enum Poll {
    /// Nothing changed since the file was applied.
    Same,
    /// A change, to apply if the next poll finds the file as it is now.
    Settling,
    /// The change held for one poll: reload.
    Reload,
}

impl Watch {
    /// Whether `path`'s metadata is that of the file last applied (no need to hash it).
    fn unchanged(&self, path: &Path, m: Option<Meta>) -> bool {
        self.path.as_deref() == Some(path)
            && self.applied.map(|s| s.map(|s| s.meta)) == Some(m)
            && self.pending.is_none()
    }

    fn poll(&mut self, path: &Path, now: Option<Stamp>) -> Poll {
        if self.path.as_deref() != Some(path) {
            // A new file (start, or a reload named another): the configuration just read it.
            self.path = Some(path.to_path_buf());
            self.applied = Some(now);
            self.pending = None;
            return Poll::Same;
        }
        if self.applied == Some(now) {
            self.pending = None;
            return Poll::Same;
        }
        if self.pending == Some(now) {
            self.applied = Some(now);
            self.pending = None;
            return Poll::Reload;
        }
        self.pending = Some(now);
        Poll::Settling
    }

    fn forget(&mut self) {
        *self = Watch::default();
    }
}

/// Polls the current runtime's tenants file until `shutdown` turns true.
pub async fn watch(shared: Arc<Shared>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut ticks = super::every::Ticks::every(Duration::from_secs(1));
    let mut state = Watch::default();
    while ticks.next(&mut shutdown).await {
        if *shutdown.borrow() {
            return;
        }
        let rt = shared.runtime.load_full();
        let Some(path) = rt.config.tenants.file.clone() else {
            state.forget();
            continue;
        };
        let cap = rt.config.tenants.max_file_bytes;
        drop(rt);
        let path = if path.is_relative() {
            std::env::current_dir()
                .map(|d| d.join(&path))
                .unwrap_or(path)
        } else {
            path
        };
        let m = meta(&path);
        if state.unchanged(&path, m) {
            continue;
        }
        // Read off the runtime's threads: the file may be large, or on a slow disk.
        let now = {
            let p = path.clone();
            tokio::task::spawn_blocking(move || {
                meta(&p).map(|meta| Stamp {
                    meta,
                    content: content_hash(&p, cap),
                })
            })
            .await
            .unwrap_or(None)
        };
        match state.poll(&path, now) {
            Poll::Same => {}
            Poll::Settling => {
                tracing::debug!(event = "tenants_file_changed", file = %path.display(), "the tenants file changed; applied once it stays the same for a second");
            }
            Poll::Reload => {
                tracing::info!(event = "tenants_file_changed", file = %path.display(), "the tenants file changed; reloading");
                // Errors are logged and counted by the reload itself.
                let _ = crate::reload::reload_off_thread(&shared).await;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn s(len: u64, mtime: i64, content: u64) -> Option<Stamp> {
        Some(Stamp {
            meta: (7, len, mtime),
            content: Some(content),
        })
    }

    #[test]
    fn a_change_is_applied_once_it_held_for_one_poll() {
        let p = Path::new("/etc/tenants.toml");
        let mut w = Watch::default();
        assert_eq!(w.poll(p, s(100, 1, 1)), Poll::Same, "the file at start");
        assert_eq!(w.poll(p, s(100, 1, 1)), Poll::Same);
        // Truncated by a writer in place: not applied while it may still be written.
        assert_eq!(w.poll(p, s(0, 2, 0)), Poll::Settling);
        // Written on: still settling; then it stays: applied.
        assert_eq!(w.poll(p, s(60, 3, 2)), Poll::Settling);
        assert_eq!(w.poll(p, s(120, 4, 3)), Poll::Settling);
        assert_eq!(w.poll(p, s(120, 4, 3)), Poll::Reload);
        assert_eq!(w.poll(p, s(120, 4, 3)), Poll::Same, "applied once");
        assert!(w.unchanged(p, Some((7, 120, 4))));
        assert!(!w.unchanged(p, Some((7, 120, 5))));
        // The same metadata with another content (a write within the clock's tick).
        assert_eq!(w.poll(p, s(120, 4, 9)), Poll::Settling);
        assert_eq!(w.poll(p, s(120, 4, 9)), Poll::Reload);
        // Gone: the reload that says so comes once the absence held too.
        assert_eq!(w.poll(p, None), Poll::Settling);
        assert_eq!(w.poll(p, None), Poll::Reload);
        assert_eq!(w.poll(p, None), Poll::Same);
        // Back as it was before: a change like any other.
        assert_eq!(w.poll(p, s(120, 4, 9)), Poll::Settling);
        assert_eq!(w.poll(p, s(120, 4, 9)), Poll::Reload);
    }

    #[test]
    fn a_change_undone_within_a_poll_is_no_change() {
        let p = Path::new("t.toml");
        let mut w = Watch::default();
        w.poll(p, s(100, 1, 1));
        assert_eq!(w.poll(p, s(0, 2, 0)), Poll::Settling);
        assert_eq!(w.poll(p, s(100, 1, 1)), Poll::Same);
        assert!(w.unchanged(p, Some((7, 100, 1))));
        // Another file named by a reload: taken as read by that reload.
        assert_eq!(w.poll(Path::new("u.toml"), s(5, 1, 1)), Poll::Same);
    }

    #[test]
    fn the_content_hash_reads_at_most_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(&path, vec![b'#'; 2048]).unwrap();
        assert!(content_hash(&path, 4096).is_some());
        assert_eq!(content_hash(&path, 1024), None);
    }
}
