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
}
