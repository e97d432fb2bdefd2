//! The self-watchdog: the container culling of the leaky-bucket article applied
//! to the proxy itself.
//!
//! Every `check_interval_seconds` a background service compares three local
//! health signals with `[watchdog]` limits:
//!
//! * **rss** — resident memory (`VmRSS` of `/proc/self/status`) against
//!   `max_rss_mb` (0 = not watched);
//! * **error_rate** — the share of requests over the last interval that the proxy
//!   itself answered 502/504/500 (`outcome="upstream_error"`), out of the requests
//!   that went to the upstream path (`proxied`, `upstream_error`, `no_backend`),
//!   against `max_error_rate`, once at least `min_requests` were seen;
//! * **stall** — the longest lag of a 100 ms timer, measured both on the proxy's
//!   own runtime (a probe task spawned there once the first request showed which
//!   runtime serves traffic) and on the watchdog's runtime, against `max_stall_ms`.
//!
//! Only whole intervals spent ready are judged (not start-up, not draining), and
//! the limits are re-read from the live config each tick, so a reload applies.
//!
//! On a breach the process asks a fleet-wide "self" token bucket for permission
//! to restart itself: a plain token bucket ([`portcullis_store::FleetBucket`]) in Redis
//! under the key prefix `<redis.key_prefix>-self`, so it never shares tokens with
//! upstream culling. Granted: readiness fails and the normal graceful shutdown
//! follows (drain, close listeners, finish in-flight, exit 0) — the orchestrator
//! starts a fresh process. Not granted, or no Redis (no fleet view, so no way to
//! know whether the whole fleet is sick at once), or Redis failing: the process
//! stays up, logs and counts. A fleet-wide problem therefore restarts at most
//! `tokens` instances per `token_period_seconds`.
//!
//! Every breach is counted as `portcullis_watchdog_breaches_total{kind, result}`
//! with result `granted`, `no_token`, `no_store` or `store_error`.

use crate::config::WatchdogSettings;
use crate::state::Shared;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use portcullis_policy::verdict::Outcome;
use portcullis_store::{FleetBucket, Store, Take};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Period of the stall probes.
const PROBE_PERIOD: Duration = Duration::from_millis(100);

/// What was breached (`kind` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Rss,
    ErrorRate,
    Stall,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Rss => "rss",
            Kind::ErrorRate => "error_rate",
            Kind::Stall => "stall",
        }
    }
}

/// One limit exceeded: the measured value and the limit, in the limit's unit
/// (MiB, fraction, milliseconds).
#[derive(Debug, Clone, PartialEq)]
pub struct Breach {
    pub kind: Kind,
    pub value: f64,
    pub limit: f64,
}

/// What one check measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// Resident memory; `None` when it cannot be read (not Linux).
    pub rss_bytes: Option<u64>,
    /// Requests on the upstream path during the interval.
    pub requests: u64,
    /// Of those, answered 502/504/500 by the proxy.
    pub errors: u64,
    /// Longest timer lag seen during the interval.
    pub stall: Duration,
}

/// The limits `sample` exceeds (strictly above the limit).
pub fn breaches(w: &WatchdogSettings, s: &Sample) -> Vec<Breach> {
    let mut out = Vec::new();
    if w.max_rss_mb > 0 {
        if let Some(rss) = s.rss_bytes {
            let mb = rss as f64 / (1024.0 * 1024.0);
            if mb > w.max_rss_mb as f64 {
                out.push(Breach {
                    kind: Kind::Rss,
                    value: mb,
                    limit: w.max_rss_mb as f64,
                });
            }
        }
    }
    if s.requests > 0 && s.requests >= w.min_requests {
        let rate = s.errors as f64 / s.requests as f64;
        if rate > w.max_error_rate {
            out.push(Breach {
                kind: Kind::ErrorRate,
                value: rate,
                limit: w.max_error_rate,
            });
        }
    }
    let stall_ms = s.stall.as_secs_f64() * 1000.0;
    if stall_ms > w.max_stall_ms as f64 {
        out.push(Breach {
            kind: Kind::Stall,
            value: stall_ms,
            limit: w.max_stall_ms as f64,
        });
    }
    out
}

/// `VmRSS` of a `/proc/<pid>/status` text, in bytes.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut parts = line["VmRSS:".len()..].split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    let unit = parts.next().unwrap_or("kB");
    let mult = match unit {
        "kB" | "KB" | "kb" => 1024,
        "mB" | "MB" => 1024 * 1024,
        "B" => 1,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Resident memory of this process, in bytes.
pub fn own_rss_bytes() -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| parse_vm_rss(&s))
}

/// The largest timer lag observed since the last [`StallProbe::take`].
#[derive(Debug, Default)]
pub struct StallProbe {
    max_lag_us: AtomicU64,
}

impl StallProbe {
    pub fn record(&self, lag: Duration) {
        let us = u64::try_from(lag.as_micros()).unwrap_or(u64::MAX);
        self.max_lag_us.fetch_max(us, Ordering::AcqRel);
    }

    /// The maximum since the previous call, and reset.
    pub fn take(&self) -> Duration {
        Duration::from_micros(self.max_lag_us.swap(0, Ordering::AcqRel))
    }

    /// Sleeps `PROBE_PERIOD` in a loop on the current runtime and records how
    /// late each wake-up was. Runs until its runtime shuts down.
    pub async fn run(self: Arc<Self>) {
        loop {
            let due = Instant::now() + PROBE_PERIOD;
            tokio::time::sleep_until(due).await;
            self.record(Instant::now().saturating_duration_since(due));
        }
    }
}

/// Instance id used as the claim holder (and shared probing's lease): `host:pid`.
pub(crate) fn instance_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into());
    format!("{host}:{}", std::process::id())
}

/// The budget's answer, as the `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Granted,
    NoToken,
    NoStore,
    StoreError,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Granted => "granted",
            Verdict::NoToken => "no_token",
            Verdict::NoStore => "no_store",
            Verdict::StoreError => "store_error",
        }
    }
}

/// The background service.
pub struct Watchdog {
    shared: Arc<Shared>,
    /// The fleet "self" bucket; `None` without `[redis]`.
    bucket: Option<Arc<dyn FleetBucket>>,
    instance: String,
    proxy_probe: Arc<StallProbe>,
    own_probe: Arc<StallProbe>,
    proxy_probe_started: AtomicBool,
}

/// Request counters the error rate is computed from.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    requests: u64,
    errors: u64,
}

impl Watchdog {
    /// With a Redis store the restart budget is the fleet bucket `<key_prefix>-self`;
    /// without one there is no fleet budget and the watchdog never restarts.
    pub fn new(shared: Arc<Shared>, store: &Store) -> Self {
        let bucket = match store {
            Store::Redis(_) => Some(store.bucket("self")),
            Store::Local => None,
        };
        Self {
            shared,
            bucket,
            instance: instance_id(),
            proxy_probe: Arc::new(StallProbe::default()),
            own_probe: Arc::new(StallProbe::default()),
            proxy_probe_started: AtomicBool::new(false),
        }
    }

    fn counts(&self) -> Counts {
        let m = &self.shared.metrics;
        Counts {
            requests: m.proxy.requests_total(Outcome::Proxied)
                + m.proxy.requests_total(Outcome::UpstreamError)
                + m.proxy.requests_total(Outcome::NoBackend),
            errors: m.proxy.requests_total(Outcome::UpstreamError),
        }
    }

    /// Start the probe on the proxy's runtime once a request has revealed it.
    fn ensure_proxy_probe(&self) {
        if self.proxy_probe_started.load(Ordering::Acquire) {
            return;
        }
        if let Some(handle) = self.shared.proxy_runtime() {
            self.proxy_probe_started.store(true, Ordering::Release);
            handle.spawn(Arc::clone(&self.proxy_probe).run());
            tracing::debug!(
                event = "watchdog",
                "stall probe started on the proxy runtime"
            );
        }
    }

    /// Ask the fleet bucket for a token to restart this instance.
    async fn claim(&self, w: &WatchdogSettings) -> (Verdict, String) {
        let Some(bucket) = &self.bucket else {
            return (
                Verdict::NoStore,
                "no [redis]: no fleet-wide budget, staying up".into(),
            );
        };
        let period_ms = w.token_period_seconds.max(1).saturating_mul(1000);
        match bucket.take(w.tokens, period_ms).await {
            Ok(Take::Granted { tokens_left }) => (
                Verdict::Granted,
                format!("token granted ({tokens_left:.2} left); restarting gracefully"),
            ),
            Ok(Take::Empty { retry_after_ms }) => (
                Verdict::NoToken,
                format!("no token in the fleet bucket (next in {retry_after_ms} ms); staying up"),
            ),
            Err(e) => (Verdict::StoreError, format!("{e}; staying up")),
        }
    }

    /// One check. Returns true when the process was told to restart.
    async fn check(&self, w: &WatchdogSettings, sample: &Sample) -> bool {
        let found = breaches(w, sample);
        if found.is_empty() {
            return false;
        }
        let (verdict, why) = self.claim(w).await;
        let metrics = &self.shared.metrics;
        for b in &found {
            metrics
                .lifecycle
                .watchdog_breaches
                .with_label_values(&[b.kind.as_str(), verdict.as_str()])
                .inc();
        }
        let kinds: Vec<&str> = found.iter().map(|b| b.kind.as_str()).collect();
        let detail: Vec<String> = found
            .iter()
            .map(|b| format!("{} {:.3} > {}", b.kind.as_str(), b.value, b.limit))
            .collect();
        let kinds = kinds.join(",");
        let detail = detail.join("; ");
        if verdict == Verdict::Granted {
            tracing::error!(
                event = "watchdog",
                kind = %kinds,
                result = verdict.as_str(),
                instance = %self.instance,
                "breach ({detail}): {why}"
            );
            self.shared.lifecycle.start_draining();
            true
        } else {
            tracing::warn!(
                event = "watchdog",
                kind = %kinds,
                result = verdict.as_str(),
                instance = %self.instance,
                "breach ({detail}): {why}"
            );
            false
        }
    }
}

#[async_trait]
impl BackgroundService for Watchdog {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        tokio::spawn(Arc::clone(&self.own_probe).run());
        let mut last = self.counts();
        // Only whole intervals spent ready are judged: not start-up, not draining.
        let mut was_ready = false;
        loop {
            let w = self.shared.runtime.load().config.watchdog.clone();
            let every = Duration::from_secs(w.check_interval_seconds.max(1));
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.changed() => return,
            }
            self.ensure_proxy_probe();
            let now = self.counts();
            let stall = self.proxy_probe.take().max(self.own_probe.take());
            let sample = Sample {
                rss_bytes: own_rss_bytes(),
                requests: now.requests.saturating_sub(last.requests),
                errors: now.errors.saturating_sub(last.errors),
                stall,
            };
            last = now;
            let judged = was_ready;
            was_ready = self.shared.lifecycle.is_ready();
            // reread: a reload may have changed it while we slept
            let w = self.shared.runtime.load().config.watchdog.clone();
            if !w.enabled || !judged || !was_ready {
                continue;
            }
            if self.check(&w, &sample).await {
                break;
            }
        }
        // restarting: nothing more to watch
        let _ = shutdown.changed().await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The file defaults, enabled, with a 100 MiB RSS limit.
    fn section() -> WatchdogSettings {
        let text = "[[upstreams]]\nname = \"a\"\nbackends = [\"127.0.0.1:1\"]\n\
                    [watchdog]\nenabled = true\nmax_rss_mb = 100\n";
        crate::config::parse("t.toml", text).unwrap().watchdog
    }

    #[test]
    fn vm_rss_parsing() {
        let status = "Name:\tportcullis\nVmPeak:\t  200000 kB\nVmRSS:\t   12345 kB\nThreads: 9\n";
        assert_eq!(parse_vm_rss(status), Some(12345 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        assert_eq!(parse_vm_rss("VmRSS: lots kB\n"), None);
        assert!(own_rss_bytes().is_some_and(|b| b > 0) || !cfg!(target_os = "linux"));
    }

    #[test]
    fn nothing_breached() {
        let s = Sample {
            rss_bytes: Some(50 * 1024 * 1024),
            requests: 100,
            errors: 10,
            stall: Duration::from_millis(20),
        };
        assert!(breaches(&section(), &s).is_empty());
    }

    #[test]
    fn each_kind_breaches() {
        let s = Sample {
            rss_bytes: Some(101 * 1024 * 1024),
            requests: 40,
            errors: 21,
            stall: Duration::from_millis(1500),
        };
        let kinds: Vec<Kind> = breaches(&section(), &s).iter().map(|b| b.kind).collect();
        assert_eq!(kinds, vec![Kind::Rss, Kind::ErrorRate, Kind::Stall]);
    }

    #[test]
    fn error_rate_needs_enough_requests() {
        let s = Sample {
            requests: 19,
            errors: 19,
            ..Sample::default()
        };
        assert!(breaches(&section(), &s).is_empty());
        let s = Sample {
            requests: 20,
            errors: 11,
            ..Sample::default()
        };
        assert_eq!(breaches(&section(), &s)[0].kind, Kind::ErrorRate);
        // 1.0 is never exceeded: error rate not watched
        let w = WatchdogSettings {
            max_error_rate: 1.0,
            ..section()
        };
        let s = Sample {
            requests: 50,
            errors: 50,
            ..Sample::default()
        };
        assert!(breaches(&w, &s).is_empty());
    }

    #[test]
    fn rss_zero_is_not_watched() {
        let w = WatchdogSettings {
            max_rss_mb: 0,
            ..section()
        };
        let s = Sample {
            rss_bytes: Some(u64::MAX),
            ..Sample::default()
        };
        assert!(breaches(&w, &s).is_empty());
    }

    #[tokio::test]
    async fn stall_probe_sees_a_blocked_runtime() {
        let probe = Arc::new(StallProbe::default());
        let task = tokio::spawn(Arc::clone(&probe).run());
        // let the probe arm its timer, then block this (current-thread) runtime
        tokio::time::sleep(Duration::from_millis(20)).await;
        std::thread::sleep(Duration::from_millis(400));
        tokio::time::sleep(Duration::from_millis(150)).await;
        let lag = probe.take();
        assert!(lag >= Duration::from_millis(250), "lag {lag:?}");
        assert!(probe.take() < Duration::from_millis(250), "take resets");
        task.abort();
    }

    #[tokio::test]
    async fn local_budget_is_no_store() {
        // without [redis] a breach never restarts the process
        let w = section();
        let cfg = crate::config::parse(
            "t.toml",
            "[[upstreams]]\nname = \"a\"\nbackends = [\"127.0.0.1:1\"]\n",
        )
        .unwrap();
        let shared = Shared::new(cfg, "t.toml".into());
        shared.lifecycle.mark_ready();
        let dog = Watchdog::new(Arc::clone(&shared), &Store::Local);
        let s = Sample {
            rss_bytes: Some(u64::MAX / 2),
            ..Sample::default()
        };
        assert!(!dog.check(&w, &s).await);
        assert!(shared.lifecycle.is_ready());
        assert_eq!(
            shared
                .metrics
                .lifecycle
                .watchdog_breaches
                .with_label_values(&["rss", "no_store"])
                .get(),
            1
        );
    }
}
