//! The adaptive concurrency limit: a gradient limit in the manner of Envoy's
//! adaptive concurrency filter and Netflix's `Gradient2Limit`, learned from
//! the latency of proxied requests. Plain state fed with `now` and samples.
//!
//! Every sample window (at least [`WINDOW`] and [`MIN_SAMPLES`] samples) the
//! window's median latency (`short`; a median, so one scheduling hiccup does
//! not halve the limit) is compared with the baseline, the lowest window
//! median of the last one to two [`BASELINE_EPOCH`]s (Envoy's minRTT, measured
//! passively):
//!
//! ```text
//! gradient  = clamp(baseline × (1 + TOLERANCE) / short, 0.5, 2.0)
//! new_limit = clamp(limit × gradient + √limit, min, max)
//! ```
//!
//! Latency above the baseline shrinks the limit (halving at most per window),
//! latency at the baseline lets it grow (doubling at most), so excess requests
//! are shed with 503 before they queue at a slowing backend; when latency
//! recovers the limit grows back within a few windows. A windowed minimum,
//! unlike Gradient2's moving average, does not creep up under sustained
//! congestion; it forgets after one to two epochs, so a backend that became
//! slower for good is accepted as the new normal. While the proxy is
//! app-limited (in flight under half the limit) the limit is not raised: no
//! evidence says the backend could take more.
//!
//! The probe (Envoy's minRTT recalculation): the limit keeps a small queue at the
//! backend (the `√limit` headroom over a latency within `TOLERANCE` of the
//! baseline), so under sustained overload, where the limit binds in every window and
//! the backend never drains, every window's median holds that queue, the windowed
//! minimum forgets the unqueued latency after two epochs, and the limit and the
//! latency ratchet up (measured at 3x overload: a cap learned at 13 drifted to 24,
//! its median latency from 19 to 32 ms over a minute). So when the limit first binds,
//! and then every [`PROBE_INTERVAL`] (one epoch) in which it bound, it drops to `min`
//! until the requests in flight are down to `min` (at most [`PROBE_DRAIN`]), measures
//! one window there, counts that window's median in the epoch's minimum, and goes back
//! to the limit it had. A probe only ever lowers the baseline (a backend slower even at
//! `min` becomes the new normal after one to two epochs, as before). The price: for
//! about one window every epoch, requests over `min` are shed.

use std::time::{Duration, Instant};

/// Shortest sample window.
pub const WINDOW: Duration = Duration::from_millis(100);
/// Samples a window needs before it is judged.
pub const MIN_SAMPLES: usize = 9;
/// Latency headroom over the baseline before the limit shrinks.
pub const TOLERANCE: f64 = 0.25;
/// How long a window's latency can serve as the baseline (one to two epochs).
pub const BASELINE_EPOCH: Duration = Duration::from_secs(10);
/// A probe at most this often, and only after an interval in which the limit bound: one
/// baseline epoch, so that every epoch's minimum can hold an unqueued measurement.
pub const PROBE_INTERVAL: Duration = BASELINE_EPOCH;
/// Longest a probe waits for the requests in flight to drain to `min`, and then for
/// its window's samples, before it gives up and restores the limit.
pub const PROBE_DRAIN: Duration = Duration::from_secs(5);

/// Where the probe stands ([`GradientLimit`]'s module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Probe {
    Off,
    /// The limit is `min` since `since`; `restore` is the limit before the probe.
    Draining {
        restore: f64,
        since: Instant,
    },
    /// In flight reached `min`: the samples since `since` are the probe's window.
    Measuring {
        restore: f64,
        since: Instant,
    },
}

#[derive(Debug, Clone)]
pub struct GradientLimit {
    min: u64,
    max: u64,
    limit: f64,
    window_start: Option<Instant>,
    /// The window's latencies (seconds), reused.
    samples: Vec<f64>,
    peak_inflight: u64,
    /// Lowest window mean of the current and the previous epoch.
    min_cur: f64,
    min_prev: f64,
    epoch_start: Option<Instant>,
    probe: Probe,
    /// The last probe's end (`None`: none yet).
    last_probe: Option<Instant>,
    /// A window since the last probe had as many in flight as the limit.
    bound: bool,
}

impl GradientLimit {
    /// Starts at `max` (the configured cap) and learns down from there.
    pub fn new(min: u64, max: u64) -> Self {
        let min = min.max(1);
        let max = max.max(min);
        Self {
            min,
            max,
            limit: max as f64,
            window_start: None,
            samples: Vec::with_capacity(64),
            peak_inflight: 0,
            min_cur: f64::INFINITY,
            min_prev: f64::INFINITY,
            epoch_start: None,
            probe: Probe::Off,
            last_probe: None,
            bound: false,
        }
    }

    /// Whether a probe holds the limit at `min` now.
    pub fn probing(&self) -> bool {
        self.probe != Probe::Off
    }

    pub fn limit(&self) -> u64 {
        self.limit as u64
    }

    /// New bounds after a reload; the learned limit is kept within them.
    pub fn set_bounds(&mut self, min: u64, max: u64) {
        self.min = min.max(1);
        self.max = max.max(self.min);
        self.limit = self.limit.clamp(self.min as f64, self.max as f64);
    }

    /// One completed request's latency, with the requests in flight now.
    /// Returns the new limit when a window closed.
    pub fn on_sample(&mut self, now: Instant, rtt: Duration, inflight: u64) -> Option<u64> {
        match self.probe {
            Probe::Off => {
                // The first probe comes as soon as the limit binds: it starts at `max`,
                // so the first windows' latency may already hold a queue.
                let due = self
                    .last_probe
                    .is_none_or(|last| now.saturating_duration_since(last) >= PROBE_INTERVAL);
                if self.bound && due {
                    self.probe = Probe::Draining {
                        restore: self.limit,
                        since: now,
                    };
                    self.samples.clear();
                    self.peak_inflight = 0;
                    self.limit = self.min as f64;
                    return Some(self.limit());
                }
            }
            Probe::Draining { restore, since } => {
                if now.saturating_duration_since(since) >= PROBE_DRAIN {
                    return Some(self.end_probe(now, restore, None));
                }
                if inflight <= self.min {
                    // Drained: the requests admitted from now on meet at most `min`.
                    self.probe = Probe::Measuring {
                        restore,
                        since: now,
                    };
                }
                return None;
            }
            Probe::Measuring { restore, since } => {
                self.samples.push(rtt.as_secs_f64());
                let long = now.saturating_duration_since(since);
                if long >= PROBE_DRAIN {
                    return Some(self.end_probe(now, restore, None));
                }
                if long < WINDOW || self.samples.len() < MIN_SAMPLES {
                    return None;
                }
                self.samples.sort_by(f64::total_cmp);
                let median = self.samples[self.samples.len() / 2];
                return Some(self.end_probe(now, restore, Some(median)));
            }
        }
        let start = *self.window_start.get_or_insert(now);
        self.samples.push(rtt.as_secs_f64());
        self.peak_inflight = self.peak_inflight.max(inflight);
        if now.saturating_duration_since(start) < WINDOW || self.samples.len() < MIN_SAMPLES {
            return None;
        }
        self.samples.sort_by(f64::total_cmp);
        let short = self.samples[self.samples.len() / 2];
        let peak = self.peak_inflight;
        self.window_start = Some(now);
        self.samples.clear();
        self.peak_inflight = 0;
        Some(self.update(now, short, peak))
    }

    /// Ends a probe: the limit back to `restore` (within the bounds), and a measured
    /// `median` counted in the epoch's minimum like any window's. It can only lower the
    /// baseline: a backend slower even at `min` is accepted after one to two epochs, as
    /// without probes, not at once.
    fn end_probe(&mut self, now: Instant, restore: f64, median: Option<f64>) -> u64 {
        if let Some(m) = median {
            self.epoch_start.get_or_insert(now);
            self.min_cur = self.min_cur.min(m.max(1e-6));
        }
        self.probe = Probe::Off;
        self.last_probe = Some(now);
        self.bound = false;
        self.samples.clear();
        self.peak_inflight = 0;
        self.window_start = Some(now);
        self.limit = restore.clamp(self.min as f64, self.max as f64);
        self.limit()
    }

    fn update(&mut self, now: Instant, short: f64, peak_inflight: u64) -> u64 {
        if peak_inflight as f64 >= self.limit.floor() {
            self.bound = true;
        }
        let short = short.max(1e-6);
        let epoch = *self.epoch_start.get_or_insert(now);
        if now.saturating_duration_since(epoch) >= BASELINE_EPOCH {
            self.min_prev = self.min_cur;
            self.min_cur = f64::INFINITY;
            self.epoch_start = Some(now);
        }
        self.min_cur = self.min_cur.min(short);
        let baseline = self.min_cur.min(self.min_prev);
        let gradient = (baseline * (1.0 + TOLERANCE) / short).clamp(0.5, 2.0);
        let mut next = self.limit * gradient + self.limit.sqrt();
        let app_limited = (peak_inflight as f64) < self.limit / 2.0;
        if next > self.limit && app_limited {
            next = self.limit;
        }
        self.limit = next.clamp(self.min as f64, self.max as f64);
        self.limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A closed-loop simulation on simulated time (1 ms steps): `clients`
    /// keep a request outstanding each; the proxy admits while in flight is
    /// under the limit (else the request is shed and retried 10 ms later);
    /// the backend answers after `latency(t)`.
    struct Sim {
        t0: Instant,
        lim: GradientLimit,
        /// completion times (ms) of admitted requests
        inflight: Vec<(u64, u64)>,
        shed: u64,
        admitted: u64,
        waiting: Vec<u64>,
    }

    impl Sim {
        fn new(min: u64, max: u64, clients: usize) -> Self {
            Self {
                t0: Instant::now(),
                lim: GradientLimit::new(min, max),
                inflight: Vec::new(),
                shed: 0,
                admitted: 0,
                waiting: vec![0; clients],
            }
        }

        /// Runs `[from, to)` ms; returns the peak in flight seen.
        fn run(&mut self, from: u64, to: u64, latency_ms: u64) -> u64 {
            let mut peak = 0;
            for t in from..to {
                let now = self.t0 + Duration::from_millis(t);
                // In flight as the proxy sees it at completion: the finishing
                // request still holds its slot.
                let n = self.inflight.len() as u64;
                let (done, rest): (Vec<_>, Vec<_>) =
                    self.inflight.iter().partition(|(end, _)| *end <= t);
                self.inflight = rest;
                for (end, start) in done {
                    self.lim
                        .on_sample(now, Duration::from_millis(end - start), n);
                    self.waiting.push(t);
                }
                let mut still = Vec::new();
                for ready in std::mem::take(&mut self.waiting) {
                    if ready > t {
                        still.push(ready);
                    } else if (self.inflight.len() as u64) < self.lim.limit() {
                        self.inflight.push((t + latency_ms, t));
                        self.admitted += 1;
                    } else {
                        self.shed += 1;
                        still.push(t + 10);
                    }
                }
                self.waiting = still;
                peak = peak.max(self.inflight.len() as u64);
            }
            peak
        }
    }

    #[test]
    fn shrinks_when_latency_rises_and_grows_back() {
        let mut sim = Sim::new(8, 200, 400);
        sim.run(0, 3_000, 10);
        assert_eq!(sim.lim.limit(), 200, "steady fast backend: limit at max");
        let shed_before = sim.shed;
        // Latency 10 ms -> 400 ms.
        sim.run(3_000, 6_000, 400);
        let low = sim.lim.limit();
        assert!(low <= 20, "limit should shrink toward min, is {low}");
        assert!(low >= 8, "never below min: {low}");
        assert!(sim.shed > shed_before, "excess is shed, not queued");
        // Recovery.
        sim.run(6_000, 9_000, 10);
        assert_eq!(sim.lim.limit(), 200, "limit grows back to max");
    }

    #[test]
    fn bounded_by_min_and_max() {
        let t0 = Instant::now();
        let mut l = GradientLimit::new(4, 50);
        for i in 0..1_100u64 {
            let rtt = if i < 1000 { 5 } else { 5_000 };
            l.on_sample(
                t0 + Duration::from_millis(i * 30),
                Duration::from_millis(rtt),
                60,
            );
            assert!((4..=50).contains(&l.limit()), "{}", l.limit());
        }
        assert_eq!(l.limit(), 4);
    }

    #[test]
    fn app_limited_does_not_grow() {
        let t0 = Instant::now();
        let mut l = GradientLimit::new(1, 100);
        l.limit = 10.0;
        for i in 0..200u64 {
            l.on_sample(
                t0 + Duration::from_millis(i * 30),
                Duration::from_millis(5),
                2,
            );
        }
        assert_eq!(l.limit(), 10);
    }

    #[test]
    fn a_lasting_slowdown_becomes_the_new_normal_after_the_baseline_epochs() {
        let t0 = Instant::now();
        let mut l = GradientLimit::new(4, 100);
        let mut t = 0u64;
        // The limit binds: as many in flight as it allows.
        let mut feed = |l: &mut GradientLimit, ms: u64, rtt: u64| {
            for _ in 0..ms / 20 {
                t += 20;
                let inflight = l.limit();
                l.on_sample(
                    t0 + Duration::from_millis(t),
                    Duration::from_millis(rtt),
                    inflight,
                );
            }
        };
        feed(&mut l, 5_000, 10);
        assert_eq!(l.limit(), 100);
        feed(&mut l, 5_000, 50);
        assert_eq!(l.limit(), 4, "5x the baseline: shed down to min");
        // Two epochs later the slower latency is the baseline.
        feed(&mut l, 2 * BASELINE_EPOCH.as_millis() as u64 + 5_000, 50);
        assert_eq!(l.limit(), 100);
    }

    /// Open-loop arrivals at 3x the capacity of a backend of `servers` servers that take
    /// `service` ms each, first come first served (a queue at the backend), on simulated
    /// time in 1 ms steps, for `secs`: returns the limit at each second and the latencies
    /// of the last 30 s.
    fn overload(servers: usize, service: u64, secs: u64) -> (Vec<u64>, Vec<u64>) {
        let t0 = Instant::now();
        let mut lim = GradientLimit::new(8, 64);
        let mut free = vec![0u64; servers]; // when each server is next free
        let mut inflight: Vec<(u64, u64)> = Vec::new(); // (done, admitted)
        let per_ms = 3.0 * servers as f64 / service as f64;
        let (mut due, mut limits, mut late) = (0.0, Vec::new(), Vec::new());
        for t in 0..secs * 1000 {
            let now = t0 + Duration::from_millis(t);
            let n = inflight.len() as u64;
            let (done, rest): (Vec<_>, Vec<_>) = inflight.iter().partition(|(d, _)| *d <= t);
            inflight = rest;
            for (d, a) in done {
                lim.on_sample(now, Duration::from_millis(d - a), n);
                if t >= (secs - 30) * 1000 {
                    late.push(d - a);
                }
            }
            due += per_ms;
            while due >= 1.0 {
                due -= 1.0;
                if (inflight.len() as u64) < lim.limit() {
                    let s = (0..servers).min_by_key(|&i| free[i]).unwrap_or(0);
                    let start = free[s].max(t);
                    free[s] = start + service;
                    inflight.push((start + service, t));
                }
            }
            if t % 1000 == 0 {
                limits.push(lim.limit());
            }
        }
        late.sort_unstable();
        (limits, late)
    }

    #[test]
    fn sustained_overload_does_not_ratchet_the_limit_up() {
        // 8 servers of 10 ms (800/s), 2,400/s offered for two minutes. Without the probe
        // the windowed minimum forgets the unqueued 10 ms after two epochs and the limit
        // climbs with the queue it keeps (to 64 here, the median to 80 ms); the probe
        // re-measures at `min` every 30 s.
        let (limits, late) = overload(8, 10, 120);
        let median = late[late.len() / 2];
        let top = limits.iter().skip(2).copied().max().unwrap_or(0);
        eprintln!("limits {limits:?}, median {median} ms");
        assert!(top <= 24, "the limit climbed to {top}: {limits:?}");
        assert!(median <= 25, "median latency {median} ms in the last 30 s");
    }

    #[test]
    fn reload_bounds_clamp() {
        let mut l = GradientLimit::new(8, 100);
        l.set_bounds(8, 40);
        assert_eq!(l.limit(), 40);
    }
}
