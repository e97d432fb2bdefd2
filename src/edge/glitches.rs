//! `server.h2_max_glitches` (CONTRACT §17, issue 40 item 8): an HTTP/2 connection may
//! cause so many glitches per minute (streams the client resets after they were
//! accepted, before their response is complete, and streams refused as malformed); past
//! it the connection gets GOAWAY `ENHANCE_YOUR_CALM` and is closed, and
//! `portcullis_edge_refusals_total{reason="h2_glitches"}` counts it.
//!
//! Rapid reset after accept (HEADERS, a pause, RST_STREAM) turns every stream into a
//! backend request that nobody reads: the `h2` crate's own bound
//! (`max_pending_accept_reset_streams`) sees only streams reset before the application
//! took them. Pingora (vendored pingora-core, "h2 glitches" patch) tells the connection's
//! [`ConnGlitches`] of each glitch and closes the connection when it answers `true`; the
//! budget itself is [`GlitchWindow`], plain arithmetic on the time it is given.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pingora::protocols::http::v2::server::{H2GlitchPolicy, H2Glitches};
use prometheus::IntCounter;

/// The window `h2_max_glitches` counts over.
pub const WINDOW: Duration = Duration::from_secs(60);

/// A count of events per sliding window, estimated from two fixed windows (the current
/// one, and the previous one weighted by how much of it still overlaps the last
/// `window`), as the rate limiter's sliding window does. Over budget when the estimate
/// exceeds `max`.
#[derive(Debug, Clone)]
pub struct GlitchWindow {
    max: u32,
    window: Duration,
    /// Start of the current fixed window.
    start: Instant,
    previous: u32,
    current: u32,
}

impl GlitchWindow {
    /// A window of `window` allowing `max` events, its first fixed window starting at `now`.
    pub fn new(max: u32, window: Duration, now: Instant) -> Self {
        GlitchWindow {
            max,
            window: window.max(Duration::from_millis(1)),
            start: now,
            previous: 0,
            current: 0,
        }
    }

    /// Counts one event at `now`; `true` when the count over the last window is past `max`.
    pub fn record(&mut self, now: Instant) -> bool {
        self.roll(now);
        self.current = self.current.saturating_add(1);
        self.estimate(now) > f64::from(self.max)
    }

    /// The events counted over the last window, as of `now` (after [`Self::roll`]).
    fn estimate(&self, now: Instant) -> f64 {
        let into = now.saturating_duration_since(self.start).as_secs_f64();
        let overlap = 1.0 - (into / self.window.as_secs_f64()).min(1.0);
        f64::from(self.previous) * overlap + f64::from(self.current)
    }

    fn roll(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.start);
        if elapsed < self.window {
            return;
        }
        if elapsed < self.window * 2 {
            self.previous = self.current;
            self.start += self.window;
        } else {
            self.previous = 0;
            // whole windows only, so the current one starts at most `window` ago
            let whole = (elapsed.as_nanos() / self.window.as_nanos()) as u32;
            self.start += self.window * whole;
        }
        self.current = 0;
    }
}

/// One connection's glitches: its window, and whether its close was counted.
struct ConnGlitches {
    window: Mutex<GlitchWindow>,
    closed: AtomicBool,
    closes: IntCounter,
}

impl H2Glitches for ConnGlitches {
    fn glitch(&self) -> bool {
        let over = self
            .window
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(Instant::now());
        if over && !self.closed.swap(true, Ordering::Relaxed) {
            self.closes.inc();
        }
        over
    }
}

/// The policy Pingora asks for each new HTTP/2 connection's glitch count: `max` per
/// [`WINDOW`]; `closes` counts the connections closed for it.
pub fn policy(max: u32, closes: IntCounter) -> H2GlitchPolicy {
    H2GlitchPolicy(Arc::new(move || {
        Box::new(ConnGlitches {
            window: Mutex::new(GlitchWindow::new(max, WINDOW, Instant::now())),
            closed: AtomicBool::new(false),
            closes: closes.clone(),
        }) as Box<dyn H2Glitches>
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn a_burst_is_over_budget_at_the_first_event_past_max() {
        let t0 = Instant::now();
        let mut w = GlitchWindow::new(100, MIN, t0);
        for i in 0..100 {
            assert!(!w.record(at(t0, i)), "event {} of 100", i + 1);
        }
        assert!(w.record(at(t0, 100)), "the 101st");
        assert!(w.record(at(t0, 101)), "and every one after it");
    }

    #[test]
    fn the_budget_is_per_window_not_per_connection_life() {
        let t0 = Instant::now();
        let mut w = GlitchWindow::new(10, MIN, t0);
        // 8 events a minute, evenly spread, for an hour: never over
        for minute in 0..60u64 {
            for i in 0..8u64 {
                let t = at(t0, minute * 60_000 + i * 7_500);
                assert!(!w.record(t), "minute {minute}, event {i}");
            }
        }
    }

    #[test]
    fn the_previous_window_still_counts_while_it_overlaps() {
        let t0 = Instant::now();
        let mut w = GlitchWindow::new(10, MIN, t0);
        // 10 at the very end of the first minute...
        for i in 0..10 {
            assert!(!w.record(at(t0, 59_000 + i)));
        }
        // ...and one just after the boundary: 11 within a few seconds
        assert!(w.record(at(t0, 61_000)));
    }

    #[test]
    fn an_old_burst_is_forgotten() {
        let t0 = Instant::now();
        let mut w = GlitchWindow::new(10, MIN, t0);
        for i in 0..10 {
            assert!(!w.record(at(t0, i)));
        }
        // half a window later, half of the previous one still counts: 5 + 5 allowed
        for i in 0..5 {
            assert!(!w.record(at(t0, 90_000 + i)), "event {i}");
        }
        assert!(
            w.record(at(t0, 90_010)),
            "5 of the old 10 + 6 new is past 10"
        );
        // two windows of quiet: everything is forgotten
        let mut w = GlitchWindow::new(10, MIN, t0);
        for i in 0..10 {
            assert!(!w.record(at(t0, i)));
        }
        for i in 0..10 {
            assert!(!w.record(at(t0, 200_000 + i)), "event {i}");
        }
    }

    #[test]
    fn a_time_before_the_window_start_does_not_panic() {
        let t0 = Instant::now() + Duration::from_secs(5);
        let mut w = GlitchWindow::new(1, MIN, t0);
        assert!(!w.record(Instant::now()));
        assert!(w.record(Instant::now()));
    }

    #[test]
    fn the_policy_counts_one_close_per_connection() {
        let closes = IntCounter::new("c", "c").expect("counter");
        let policy = policy(2, closes.clone());
        let conn = (policy.0)();
        assert!(!conn.glitch());
        assert!(!conn.glitch());
        assert!(conn.glitch());
        assert!(conn.glitch());
        assert_eq!(closes.get(), 1);
        let other = (policy.0)();
        assert!(!other.glitch(), "a new connection starts with nothing");
    }
}
