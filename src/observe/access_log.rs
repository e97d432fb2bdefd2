//! The JSON access log: one line per request, written off the request path.
//!
//! The request path serialises a record and hands it to
//! `tracing-appender`'s non-blocking writer: a bounded channel feeding one
//! writer thread. When the thread falls behind (a slow disk, a full pipe) the
//! channel is full and the line is dropped and counted
//! (`portcullis_access_log_dropped_total`) instead of making the request wait.
//! That crate already does exactly this (lossy mode, a drop counter, a flush
//! per drained batch), so it is used rather than a hand-rolled queue.
//!
//! The file is reopened on SIGUSR1 (logrotate's `postrotate`): the signal
//! sets a flag and sends an empty write through the queue, so the writer
//! thread reopens before its next line.
//!
//! A record never carries a query string (only the URI path is logged), an
//! API key, or an `Authorization` or `Cookie` value: no header value other
//! than `Host` is read.

use crate::config::AccessLogSettings;
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};

/// One request, as written to the log. Field names are the contract's.
#[derive(Debug, Serialize)]
pub struct AccessRecord<'a> {
    /// RFC 3339 with milliseconds, UTC.
    pub ts: String,
    pub request_id: &'a str,
    pub trace_id: &'a str,
    pub client_ip: &'a str,
    pub method: &'a str,
    pub host: &'a str,
    /// The URI path only: never the query string.
    pub path: &'a str,
    /// `HTTP/1.1`, `HTTP/2`, ...
    pub protocol: &'a str,
    /// 0 when no response was sent (the client went away first).
    pub status: u16,
    /// As in `portcullis_requests_total{outcome}`.
    pub outcome: &'a str,
    pub route: &'a str,
    pub upstream: &'a str,
    pub backend: &'a str,
    pub bytes_sent: u64,
    pub duration_ms: f64,
    /// Time from choosing the backend to its response header; `null` when
    /// no backend answered.
    pub upstream_ms: Option<f64>,
}

/// Whether a response with `status` is logged at `sample` given a uniform
/// `draw` in `[0, 1)`: every 4xx/5xx (and a request without a response);
/// 1xx-3xx with probability `sample`.
pub fn should_log(status: u16, sample: f64, draw: f64) -> bool {
    if !(100..400).contains(&status) {
        return true;
    }
    sample >= 1.0 || draw < sample
}

/// Where the writer thread writes: stdout, or a file it reopens on request.
enum Target {
    Stdout(BufWriter<io::Stdout>),
    File {
        path: PathBuf,
        out: BufWriter<File>,
        reopen: Arc<AtomicBool>,
    },
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl Target {
    /// Switch to a freshly opened file when a reopen was asked for.
    fn maybe_reopen(&mut self) {
        let Target::File { path, out, reopen } = self else {
            return;
        };
        if !reopen.swap(false, Ordering::AcqRel) {
            return;
        }
        // Flush what belongs to the old file, then switch.
        let _ = out.flush();
        match open_append(path) {
            Ok(f) => *out = BufWriter::new(f),
            Err(e) => tracing::error!(
                event = "access_log",
                path = %path.display(),
                error = %e,
                "cannot reopen the access log; still writing to the old file"
            ),
        }
    }
}

impl Write for Target {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.maybe_reopen();
        match self {
            Target::Stdout(out) => out.write(buf),
            Target::File { out, .. } => out.write(buf),
        }
    }

    /// The writer thread flushes after every batch it drains, including the
    /// empty line [`AccessLog::reopen`] sends: the reopen happens here too.
    fn flush(&mut self) -> io::Result<()> {
        self.maybe_reopen();
        match self {
            Target::Stdout(out) => out.flush(),
            Target::File { out, .. } => out.flush(),
        }
    }
}

/// The access-log sink: cheap to call from the request path.
pub struct AccessLog {
    writer: Option<NonBlocking>,
    dropped: Option<ErrorCounter>,
    reopen: Arc<AtomicBool>,
    /// Keeps the writer thread; dropping it flushes what is queued.
    guard: Mutex<Option<WorkerGuard>>,
}

impl AccessLog {
    /// Opens the target and starts the writer thread. The path and queue size
    /// are fixed for the process's life; `enabled` and `sample` are read per
    /// request from the current config, so a reload can change them.
    pub fn new(settings: &AccessLogSettings) -> Self {
        let reopen = Arc::new(AtomicBool::new(false));
        let target = match &settings.path {
            None => Some(Target::Stdout(BufWriter::new(io::stdout()))),
            Some(path) => match open_append(path) {
                Ok(f) => Some(Target::File {
                    path: path.clone(),
                    out: BufWriter::new(f),
                    reopen: Arc::clone(&reopen),
                }),
                Err(e) => {
                    tracing::error!(
                        event = "access_log",
                        path = %path.display(),
                        error = %e,
                        "cannot open the access log; access logging is off"
                    );
                    None
                }
            },
        };
        let Some(target) = target else {
            return Self::off(reopen);
        };
        let (writer, guard) = NonBlockingBuilder::default()
            .lossy(true)
            .buffered_lines_limit(settings.queue_lines.max(1))
            .thread_name("access-log")
            .finish(target);
        Self {
            dropped: Some(writer.error_counter()),
            writer: Some(writer),
            reopen,
            guard: Mutex::new(Some(guard)),
        }
    }

    fn off(reopen: Arc<AtomicBool>) -> Self {
        Self {
            writer: None,
            dropped: None,
            reopen,
            guard: Mutex::new(None),
        }
    }

    /// Queue one record (never blocks; drops and counts when the queue is full).
    pub fn write(&self, record: &AccessRecord<'_>) {
        let Some(writer) = &self.writer else {
            return;
        };
        let mut line = Vec::with_capacity(512);
        if serde_json::to_writer(&mut line, record).is_err() {
            return;
        }
        line.push(b'\n');
        let _ = writer.clone().write_all(&line);
    }

    /// Lines dropped because the writer fell behind, since start.
    pub fn dropped_lines(&self) -> u64 {
        self.dropped
            .as_ref()
            .map_or(0, |c| c.dropped_lines() as u64)
    }

    /// Reopen the file before the next line (SIGUSR1). The empty write wakes
    /// the writer thread so the reopen happens now, not at the next request.
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Release);
        if let Some(w) = &self.writer {
            let _ = w.clone().write_all(b"");
        }
    }

    /// Flush what is queued and stop the writer thread (at exit).
    pub fn close(&self) {
        let guard = match self.guard.lock() {
            Ok(mut g) => g.take(),
            Err(p) => p.into_inner().take(),
        };
        drop(guard);
    }
}

/// Reopens the access log on every SIGUSR1 until `shutdown` fires.
pub async fn reopen_on_sigusr1(
    log: impl Fn() + Send,
    mut shutdown: pingora::server::ShutdownWatch,
) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut usr1 = match signal(SignalKind::user_defined1()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(event = "access_log", error = %e, "cannot watch SIGUSR1");
            return;
        }
    };
    loop {
        tokio::select! {
            got = usr1.recv() => {
                if got.is_none() {
                    return;
                }
                tracing::info!(event = "access_log", "SIGUSR1: reopening the access log");
                log();
            }
            _ = shutdown.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_applies_to_1xx_to_3xx_only() {
        for status in [400, 401, 429, 431, 500, 502, 503, 0] {
            assert!(should_log(status, 0.0, 0.99), "{status} always logged");
        }
        for status in [101, 200, 204, 301, 304] {
            assert!(!should_log(status, 0.0, 0.0), "{status} at sample 0");
            assert!(should_log(status, 1.0, 0.999_999));
            assert!(should_log(status, 0.01, 0.005));
            assert!(!should_log(status, 0.01, 0.02));
        }
    }

    #[test]
    fn writes_json_lines_and_reopens_after_rename() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("access.log");
        let log = AccessLog::new(&AccessLogSettings {
            enabled: true,
            path: Some(path.clone()),
            sample: 1.0,
            queue_lines: 128,
        });
        let rec = |p| AccessRecord {
            ts: crate::observe::time::rfc3339_ms(0),
            request_id: "r1",
            trace_id: "t1",
            client_ip: "127.0.0.1",
            method: "GET",
            host: "h\"x",
            path: p,
            protocol: "HTTP/1.1",
            status: 200,
            outcome: "proxied",
            route: "/",
            upstream: "app",
            backend: "127.0.0.1:1",
            bytes_sent: 3,
            duration_ms: 1.5,
            upstream_ms: None,
        };
        log.write(&rec("/one"));
        let rotated = dir.path().join("access.log.1");
        let ok = wait(|| std::fs::read_to_string(&path).is_ok_and(|t| t.contains("/one")));
        assert!(ok, "first line written");
        std::fs::rename(&path, &rotated).expect("rename");
        log.reopen();
        log.write(&rec("/two"));
        let ok = wait(|| std::fs::read_to_string(&path).is_ok_and(|t| t.contains("/two")));
        assert!(ok, "line after reopen goes to the new file");
        let old = std::fs::read_to_string(&rotated).expect("rotated");
        assert!(!old.contains("/two"));
        let line: serde_json::Value =
            serde_json::from_str(old.lines().next().expect("a line")).expect("json");
        assert_eq!(line["host"], "h\"x");
        assert_eq!(line["upstream_ms"], serde_json::Value::Null);
        log.close();
        assert_eq!(log.dropped_lines(), 0);
    }

    fn wait(mut f: impl FnMut() -> bool) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if f() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        false
    }
}
