//! Active health checks as HAProxy runs them: which answers pass (`expect_status`), how
//! many consecutive results flip a backend (`rise`, `fall`), when the next probe is due
//! (`interval`, and `fast_interval` while a backend is between states or down), and
//! what a person reads about the last check. Plain state that takes `now`.

use std::fmt;

/// Status codes and ranges a probe's answer must have: `"200-399"`, `"200,204,300-399"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectStatus(Vec<(u16, u16)>);

impl ExpectStatus {
    /// Parses `spec`; `Err` says what is wrong with it.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut ranges = Vec::new();
        for part in spec.split(',') {
            let part = part.trim();
            let code = |s: &str| -> Result<u16, String> {
                let c: u16 = s
                    .trim()
                    .parse()
                    .map_err(|_| format!("{s:?} is not a status code"))?;
                if (100..=599).contains(&c) {
                    Ok(c)
                } else {
                    Err(format!("{c} is not between 100 and 599"))
                }
            };
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (code(a)?, code(b)?),
                None => {
                    let c = code(part)?;
                    (c, c)
                }
            };
            if lo > hi {
                return Err(format!("{part:?}: the range runs backwards"));
            }
            ranges.push((lo, hi));
        }
        Ok(Self(ranges))
    }

    /// Whether `code` is one of the expected.
    pub fn matches(&self, code: u16) -> bool {
        self.0.iter().any(|(lo, hi)| (*lo..=*hi).contains(&code))
    }
}

/// What one probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// The connection (or the TLS handshake) failed.
    Connect,
    /// No complete answer within `timeout_ms`.
    Timeout,
    /// An answer with a status `expect_status` does not take.
    Status(u16),
    /// The body does not contain `expect_body`.
    Body,
    /// The answer broke off or was not HTTP.
    Protocol,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        matches!(self, Outcome::Ok)
    }

    /// The metric label (`ok`, `connect`, `timeout`, `status`, `body`, `protocol`).
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Connect => "connect",
            Outcome::Timeout => "timeout",
            Outcome::Status(_) => "status",
            Outcome::Body => "body",
            Outcome::Protocol => "protocol",
        }
    }
}

impl fmt::Display for Outcome {
    /// `ok`, `connect`, `timeout`, `status 500`, `body`, `protocol`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Status(code) => write!(f, "status {code}"),
            other => f.write_str(other.label()),
        }
    }
}

/// `rise`, `fall` and the two intervals, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    pub rise: u32,
    pub fall: u32,
    pub interval_ms: u64,
    pub fast_interval_ms: u64,
}

/// The last probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastCheck {
    pub outcome: Outcome,
    pub at_ms: u64,
    pub duration_ms: u64,
}

/// One backend's health as its probes tell it. It starts healthy (as HAProxy's servers
/// and Pingora's backends do): `fall` failures in a row take it down, then `rise`
/// passes in a row bring it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Track {
    pub healthy: bool,
    /// Consecutive results against the current state (toward a flip).
    pub streak: u32,
    /// When the backend entered its state (ms since the epoch).
    pub since_ms: u64,
    pub last: Option<LastCheck>,
}

impl Track {
    pub fn new(now_ms: u64) -> Self {
        Self {
            healthy: true,
            streak: 0,
            since_ms: now_ms,
            last: None,
        }
    }

    /// Records a probe that ended at `now_ms` after `duration_ms`; `true` when the
    /// backend changed state.
    pub fn observe(
        &mut self,
        outcome: Outcome,
        now_ms: u64,
        duration_ms: u64,
        t: &Thresholds,
    ) -> bool {
        let passed = outcome.passed();
        self.last = Some(LastCheck {
            outcome,
            at_ms: now_ms,
            duration_ms,
        });
        if passed == self.healthy {
            self.streak = 0;
            return false;
        }
        self.streak += 1;
        let needed = if self.healthy { t.fall } else { t.rise };
        if self.streak >= needed.max(1) {
            self.healthy = passed;
            self.streak = 0;
            self.since_ms = now_ms;
            return true;
        }
        false
    }

    /// Between states (a streak under way) or down: probed at the fast interval.
    pub fn unsettled(&self) -> bool {
        !self.healthy || self.streak > 0
    }

    /// Whether a probe is due at `now_ms`.
    pub fn due(&self, now_ms: u64, t: &Thresholds) -> bool {
        let every = if self.unsettled() {
            t.fast_interval_ms
        } else {
            t.interval_ms
        };
        self.last
            .as_ref()
            .is_none_or(|l| now_ms.saturating_sub(l.at_ms) >= every)
    }

    /// Where it stands toward its next flip: `"1/3"` (one failure of `fall` = 3 while up),
    /// or `"0/3"` when settled.
    pub fn progress(&self, t: &Thresholds) -> String {
        let needed = if self.healthy { t.fall } else { t.rise };
        format!("{}/{}", self.streak, needed.max(1))
    }
}

impl Outcome {
    /// The outcome its [`fmt::Display`] text names (`"status 500"` → `Status(500)`).
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "ok" => Outcome::Ok,
            "connect" => Outcome::Connect,
            "timeout" => Outcome::Timeout,
            "body" => Outcome::Body,
            "protocol" => Outcome::Protocol,
            other => Outcome::Status(other.strip_prefix("status ")?.parse().ok()?),
        })
    }
}

impl Track {
    /// Takes the fleet's verdict on a backend this instance does not probe: its state
    /// becomes `healthy` at once (the probers already counted `rise`/`fall`), `last` is
    /// the newest check they published; `true` when the backend changed state.
    pub fn follow(&mut self, healthy: bool, now_ms: u64, last: Option<LastCheck>) -> bool {
        if last.is_some() {
            self.last = last;
        }
        self.streak = 0;
        if self.healthy == healthy {
            return false;
        }
        self.healthy = healthy;
        self.since_ms = now_ms;
        true
    }
}

/// Shared probing (`shared = true`): which instances probe a backend, what they
/// publish, and the verdict every instance follows.
pub mod shared {
    use super::{LastCheck, Outcome};
    use crate::StoreError;
    use async_trait::async_trait;

    /// A prober's verdict on one backend: its state after `rise`/`fall`, and its last
    /// check.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Verdict {
        pub instance: String,
        pub healthy: bool,
        pub last: Option<LastCheck>,
        /// When the store received it (the store's clock, ms since the epoch).
        pub stamp_ms: u64,
    }

    impl Verdict {
        /// The value published (the store prepends its stamp): `1|at|took|ok`.
        pub fn payload(healthy: bool, last: Option<&LastCheck>) -> String {
            match last {
                Some(l) => format!(
                    "{}|{}|{}|{}",
                    u8::from(healthy),
                    l.at_ms,
                    l.duration_ms,
                    l.outcome
                ),
                None => format!("{}|0|0|", u8::from(healthy)),
            }
        }

        /// A stored value (`stamp|payload`) of `instance`; `None` when unreadable.
        pub fn decode(instance: &str, value: &str) -> Option<Self> {
            let mut parts = value.splitn(5, '|');
            let stamp_ms = parts.next()?.parse().ok()?;
            let healthy = match parts.next()? {
                "1" => true,
                "0" => false,
                _ => return None,
            };
            let at_ms: u64 = parts.next()?.parse().ok()?;
            let duration_ms = parts.next()?.parse().ok()?;
            let last = Outcome::parse(parts.next()?).map(|outcome| LastCheck {
                outcome,
                at_ms,
                duration_ms,
            });
            Some(Self {
                instance: instance.to_owned(),
                healthy,
                last,
                stamp_ms,
            })
        }
    }

    /// The field of a verdict in its upstream's hash: `backend|instance`.
    pub fn field(backend: &str, instance: &str) -> String {
        format!("{backend}|{instance}")
    }

    /// `(backend, instance)` of a field.
    pub fn split_field(field: &str) -> Option<(&str, &str)> {
        field.split_once('|')
    }

    /// The rendezvous score of `instance` for `backend` of `upstream`.
    fn score(instance: &str, upstream: &str, backend: &str) -> u64 {
        let key = format!("{instance}\0{upstream}\0{backend}");
        let h = crate::ratelimit::hash::stable_hash_in(b"portcullis-probers", key.as_bytes());
        // FNV's last bytes barely reach the high bits: a splitmix64 finalizer spreads them.
        let mut x = (h as u64) ^ ((h >> 64) as u64);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    /// The `k` instances of `live` that probe `backend` of `upstream`: the highest
    /// rendezvous scores, so an instance joining or leaving moves only the backends it
    /// gains or held, and every instance computes the same set from the same list.
    pub fn probers<'a>(
        live: &'a [String],
        upstream: &str,
        backend: &str,
        k: usize,
    ) -> Vec<&'a str> {
        let mut scored: Vec<(u64, &str)> = live
            .iter()
            .map(|i| (score(i, upstream, backend), i.as_str()))
            .collect();
        scored.sort_unstable_by(|a, b| b.cmp(a));
        scored.dedup_by(|a, b| a.1 == b.1);
        scored.into_iter().take(k).map(|(_, i)| i).collect()
    }

    /// What an instance makes of a backend.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Fleet {
        /// No prober published within the staleness window: probe it here.
        Local,
        /// The probers' majority: down only when more than half of the fresh verdicts
        /// say down (a split keeps it in service). `from`: the probers whose verdicts
        /// counted; `newest`: the latest check among them.
        Follow {
            healthy: bool,
            from: Vec<String>,
            newest: Option<LastCheck>,
        },
    }

    /// The fleet's verdict on a backend from `verdicts` (any instance's; only those of
    /// `probers` published within `stale_ms` of `now_ms` count).
    pub fn decide(probers: &[&str], verdicts: &[Verdict], now_ms: u64, stale_ms: u64) -> Fleet {
        let fresh: Vec<&Verdict> = verdicts
            .iter()
            .filter(|v| probers.contains(&v.instance.as_str()))
            .filter(|v| now_ms.saturating_sub(v.stamp_ms) < stale_ms)
            .collect();
        if fresh.is_empty() {
            return Fleet::Local;
        }
        let down = fresh.iter().filter(|v| !v.healthy).count();
        let newest = fresh
            .iter()
            .filter_map(|v| v.last.clone())
            .max_by_key(|l| l.at_ms);
        let mut from: Vec<String> = fresh.iter().map(|v| v.instance.clone()).collect();
        from.sort();
        from.dedup();
        Fleet::Follow {
            healthy: down * 2 <= fresh.len(),
            from,
            newest,
        }
    }

    /// One verdict to publish.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Publish {
        pub upstream: String,
        pub backend: String,
        /// [`Verdict::payload`].
        pub payload: String,
    }

    /// One exchange with the store.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct SyncRequest {
        pub instance: String,
        /// This instance's lease is renewed for this long.
        pub lease_ms: u64,
        /// A published verdict (and its upstream's hash) expires after this long.
        pub verdict_ttl_ms: u64,
        pub publish: Vec<Publish>,
        /// The upstreams whose verdicts are read.
        pub read: Vec<String>,
    }

    /// What the store answered.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct View {
        /// The store's clock.
        pub now_ms: u64,
        /// The instances whose lease runs (this one included), sorted.
        pub live: Vec<String>,
        /// For each upstream of [`SyncRequest::read`], in order: `(backend, verdict)`.
        pub verdicts: Vec<Vec<(String, Verdict)>>,
    }

    /// The store of shared probing (Redis, or in process).
    #[async_trait]
    pub trait ProbeStore: Send + Sync + std::fmt::Debug {
        /// Renews the lease, publishes, and reads the live instances and the verdicts
        /// of [`SyncRequest::read`], in one round trip.
        async fn sync(&self, req: &SyncRequest) -> Result<View, StoreError>;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Thresholds = Thresholds {
        rise: 2,
        fall: 3,
        interval_ms: 5000,
        fast_interval_ms: 1000,
    };

    #[test]
    fn status_specs() {
        let e = ExpectStatus::parse("200,204,300-399").unwrap();
        assert!(e.matches(200) && e.matches(204) && e.matches(301) && e.matches(399));
        assert!(!e.matches(201) && !e.matches(400) && !e.matches(199));
        assert!(ExpectStatus::parse("200-399").unwrap().matches(302));
        assert!(ExpectStatus::parse(" 200 , 404 ").unwrap().matches(404));
        for bad in ["", "2xx", "399-200", "99", "600", "200,", "200-", "-200"] {
            assert!(ExpectStatus::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn one_lost_probe_in_three_never_flips_with_fall_3() {
        let mut tr = Track::new(0);
        let mut now = 0;
        for round in 0..30 {
            now += 1000;
            let outcome = if round % 3 == 0 {
                Outcome::Timeout
            } else {
                Outcome::Ok
            };
            assert!(!tr.observe(outcome, now, 5, &T), "flipped at round {round}");
            assert!(tr.healthy);
        }
    }

    #[test]
    fn down_after_exactly_fall_up_after_exactly_rise() {
        let mut tr = Track::new(0);
        assert!(!tr.observe(Outcome::Status(500), 1000, 3, &T));
        assert_eq!(tr.progress(&T), "1/3");
        assert!(tr.unsettled(), "between states: the fast interval");
        assert!(!tr.observe(Outcome::Connect, 2000, 3, &T));
        assert!(tr.healthy);
        assert!(tr.observe(Outcome::Body, 3000, 3, &T), "the third failure");
        assert!(!tr.healthy);
        assert_eq!((tr.since_ms, tr.progress(&T).as_str()), (3000, "0/2"));
        assert!(!tr.observe(Outcome::Ok, 4000, 3, &T));
        assert_eq!(tr.progress(&T), "1/2");
        // a failure resets the streak toward rise
        assert!(!tr.observe(Outcome::Timeout, 5000, 3, &T));
        assert_eq!(tr.progress(&T), "0/2");
        assert!(!tr.observe(Outcome::Ok, 6000, 3, &T));
        assert!(tr.observe(Outcome::Ok, 7000, 3, &T));
        assert!(tr.healthy && !tr.unsettled());
        assert_eq!(
            tr.last,
            Some(LastCheck {
                outcome: Outcome::Ok,
                at_ms: 7000,
                duration_ms: 3
            })
        );
    }

    #[test]
    fn the_interval_is_fast_while_unsettled() {
        let mut tr = Track::new(0);
        assert!(tr.due(0, &T), "never probed");
        tr.observe(Outcome::Ok, 1000, 1, &T);
        assert!(!tr.due(1000 + 4999, &T));
        assert!(tr.due(1000 + 5000, &T));
        tr.observe(Outcome::Status(503), 6000, 1, &T);
        assert!(!tr.due(6999, &T));
        assert!(tr.due(7000, &T), "between states: fast_interval");
    }

    #[test]
    fn outcomes_read_as_haproxy_shows_them() {
        assert_eq!(Outcome::Status(500).to_string(), "status 500");
        assert_eq!(Outcome::Status(500).label(), "status");
        assert_eq!(Outcome::Connect.to_string(), "connect");
        assert_eq!(Outcome::Ok.to_string(), "ok");
    }

    mod shared_probing {
        use super::super::shared::*;
        use super::super::*;

        fn ids(n: usize) -> Vec<String> {
            (0..n).map(|i| format!("host:{}", 1000 + i)).collect()
        }

        fn v(i: &str, healthy: bool, stamp_ms: u64) -> Verdict {
            Verdict {
                instance: i.into(),
                healthy,
                last: None,
                stamp_ms,
            }
        }

        #[test]
        fn probers_are_k_of_the_live_the_same_on_every_instance() {
            let live = ids(8);
            let p = probers(&live, "api", "10.0.0.1:80", 3);
            assert_eq!(p.len(), 3);
            let mut reversed = live.clone();
            reversed.reverse();
            assert_eq!(probers(&reversed, "api", "10.0.0.1:80", 3), p, "order-free");
            assert_eq!(probers(&live[..2], "api", "10.0.0.1:80", 3).len(), 2);
        }

        #[test]
        fn load_spreads_and_a_leaving_instance_moves_only_its_backends() {
            let live = ids(8);
            let backends: Vec<String> = (0..400)
                .map(|i| format!("10.0.{}.{}:80", i / 200, i % 200))
                .collect();
            let mut per = std::collections::HashMap::new();
            for b in &backends {
                for p in probers(&live, "api", b, 2) {
                    *per.entry(p.to_string()).or_insert(0u32) += 1;
                }
            }
            // 800 assignments over 8 instances: about 100 each
            assert!(per.values().all(|&n| (50..=150).contains(&n)), "{per:?}");
            let gone = &live[3];
            let rest: Vec<String> = live.iter().filter(|i| *i != gone).cloned().collect();
            for b in &backends {
                let before = probers(&live, "api", b, 2);
                let after = probers(&rest, "api", b, 2);
                let kept: Vec<&str> = before
                    .iter()
                    .copied()
                    .filter(|i| *i != gone.as_str())
                    .collect();
                assert!(
                    kept.iter().all(|i| after.contains(i)),
                    "{b}: {before:?} -> {after:?}"
                );
            }
        }

        #[test]
        fn down_only_by_a_majority_of_fresh_verdicts() {
            let p = ["a", "b", "c"];
            let now = 100_000;
            let stale = 3_000;
            let follow = |f: Fleet| match f {
                Fleet::Follow { healthy, from, .. } => Some((healthy, from.len())),
                Fleet::Local => None,
            };
            // 2 of 3 down
            let vs = [v("a", false, now), v("b", false, now), v("c", true, now)];
            assert_eq!(follow(decide(&p, &vs, now, stale)), Some((false, 3)));
            // 1 of 3 down: a partition toward one prober takes nothing out
            let vs = [v("a", false, now), v("b", true, now), v("c", true, now)];
            assert_eq!(follow(decide(&p, &vs, now, stale)), Some((true, 3)));
            // 1 of 2 fresh: a split keeps it in service
            let vs = [v("a", false, now), v("b", true, now - 500)];
            assert_eq!(follow(decide(&p[..2], &vs, now, stale)), Some((true, 2)));
            // a stale verdict does not count; neither does a non-prober's
            let vs = [
                v("a", false, now),
                v("b", true, now - stale),
                v("z", true, now),
            ];
            assert_eq!(follow(decide(&p, &vs, now, stale)), Some((false, 1)));
            // nobody published for three intervals: probe locally
            let vs = [v("a", false, now - stale), v("z", true, now)];
            assert_eq!(decide(&p, &vs, now, stale), Fleet::Local);
            assert_eq!(decide(&p, &[], now, stale), Fleet::Local);
        }

        #[test]
        fn verdicts_round_trip_through_their_text() {
            let last = LastCheck {
                outcome: Outcome::Status(503),
                at_ms: 1234,
                duration_ms: 7,
            };
            let text = format!("99|{}", Verdict::payload(false, Some(&last)));
            let got = Verdict::decode("h:1", &text).unwrap();
            assert_eq!(
                got,
                Verdict {
                    instance: "h:1".into(),
                    healthy: false,
                    last: Some(last),
                    stamp_ms: 99
                }
            );
            let text = format!("5|{}", Verdict::payload(true, None));
            assert_eq!(Verdict::decode("h:1", &text).unwrap().last, None);
            assert!(Verdict::decode("h:1", "x|1|0|0|ok").is_none());
            assert_eq!(
                split_field(&field("10.0.0.1:80", "h:1")),
                Some(("10.0.0.1:80", "h:1"))
            );
            for o in [
                Outcome::Ok,
                Outcome::Connect,
                Outcome::Timeout,
                Outcome::Body,
                Outcome::Protocol,
                Outcome::Status(404),
            ] {
                assert_eq!(Outcome::parse(&o.to_string()), Some(o));
            }
        }

        #[test]
        fn a_followed_verdict_applies_at_once() {
            let mut tr = Track::new(0);
            assert!(!tr.follow(true, 10, None));
            assert!(
                tr.follow(false, 20, None),
                "no fall count: the probers counted"
            );
            assert_eq!((tr.healthy, tr.since_ms, tr.streak), (false, 20, 0));
            assert!(!tr.follow(false, 30, None));
            assert_eq!(tr.since_ms, 20);
        }
    }
}
