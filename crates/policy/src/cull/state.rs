//! Per-backend cull state machine, driven by the check loop on explicit time.
//!
//! ```text
//!            candidate → Claim ──Granted/Renewed──▶ Culled (we hold the lease; Renew each tick)
//!   Up ◀──────────────────────────────────────────┐     │ now ≥ probe_at
//!    │ fleet claim seen (another instance culled)  │     ▼
//!    ▼                                             │  Probing ──healthy──▶ ReleaseAndReadmit → Up
//!  Following ──claim gone──▶ Readmit → Up          │     └──unhealthy──▶ Renew, Culled (new cooldown)
//!                                                  └── lease lost (renew says no / local lease
//!                                                      deadline passed) → Readmit
//! ```
//!
//! The check loop, each tick: read [`super::BudgetStore::snapshot`] once (→ `fleet_claimed`
//! per backend, `None` when the store is unreachable), run [`super::evaluate`] per
//! upstream (→ `candidate`), then for each backend call [`CullState::on_tick`] and
//! perform the returned [`Action`], feeding store/probe results back through
//! `on_claim` / `on_renew` / `on_probe` (each may return a follow-up action).
//! With `dry_run` nothing is ever ejected: claims are evaluated and reported only.
//! A follower that cannot reach the store keeps following only until the claim it
//! last saw has certainly lapsed (nobody can renew it meanwhile).

use super::claim::ClaimOutcome;
use super::params::CullParams;
use crate::StoreError;

/// What the check loop knows about one backend this tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickInput {
    /// Local clock, milliseconds (any monotonic-enough origin, used consistently).
    pub now_ms: u64,
    /// `evaluate` listed this backend among the candidates.
    pub candidate: bool,
    /// The store shows an active claim on this backend (`None`: store unreachable).
    pub fleet_claimed: Option<bool>,
}

/// What the check loop should do for the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    None,
    /// Call `Budget::claim`, then `on_claim` with the result.
    Claim,
    /// Take the backend out of rotation locally (no store call).
    Eject,
    /// Call `Budget::renew(lease_ttl_ms)`, then `on_renew` with the result.
    Renew,
    /// Probe the backend's health, then `on_probe` with the result.
    Probe,
    /// Put the backend back in rotation (and reset its `ErrorWindow`).
    Readmit,
    /// Call `Budget::release` (its failure is harmless: the lease expires), then
    /// put the backend back in rotation and reset its `ErrorWindow`.
    ReleaseAndReadmit,
}

/// State of one backend as seen by this instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CullState {
    #[default]
    Up,
    /// Out of rotation under a claim this instance holds and renews.
    Culled {
        since_ms: u64,
        probe_at_ms: u64,
        /// Local estimate of the lease expiry (last successful grant/renew + TTL).
        lease_until_ms: u64,
    },
    /// Probe in flight (still out of rotation, still holding the claim).
    Probing { since_ms: u64, lease_until_ms: u64 },
    /// Out of rotation because another instance holds a claim on it.
    /// `seen_ms`: the last tick at which the store showed that claim. While the store
    /// is unreachable the claim cannot be renewed by its holder either, so it is
    /// followed only until it has certainly lapsed (`seen_ms + lease + interval`).
    Following { since_ms: u64, seen_ms: u64 },
}

impl CullState {
    /// Whether the backend must receive no new requests.
    pub fn is_ejected(&self) -> bool {
        !matches!(self, CullState::Up)
    }

    /// `"up"` or `"culled"` (for `/status`).
    pub fn status_label(&self) -> &'static str {
        if self.is_ejected() {
            "culled"
        } else {
            "up"
        }
    }

    /// Advance on a check tick.
    pub fn on_tick(&mut self, input: TickInput, params: &CullParams) -> Action {
        let now = input.now_ms;
        if params.dry_run {
            return self.dry_run_tick(&input);
        }
        match *self {
            CullState::Up => {
                if input.fleet_claimed == Some(true) {
                    *self = CullState::Following {
                        since_ms: now,
                        seen_ms: now,
                    };
                    Action::Eject
                } else if input.candidate {
                    Action::Claim
                } else {
                    Action::None
                }
            }
            CullState::Following { since_ms, seen_ms } => {
                self.following_tick(since_ms, seen_ms, &input, params)
            }
            CullState::Culled {
                since_ms,
                probe_at_ms,
                lease_until_ms,
            } => {
                if input.fleet_claimed == Some(false) || now >= lease_until_ms {
                    // Released elsewhere, or the lease has certainly lapsed.
                    *self = CullState::Up;
                    Action::Readmit
                } else if now >= probe_at_ms {
                    *self = CullState::Probing {
                        since_ms,
                        lease_until_ms,
                    };
                    Action::Probe
                } else {
                    Action::Renew
                }
            }
            CullState::Probing { lease_until_ms, .. } => {
                if input.fleet_claimed == Some(false) || now >= lease_until_ms {
                    *self = CullState::Up;
                    Action::Readmit
                } else {
                    // The previous probe's result never came back: probe again.
                    Action::Probe
                }
            }
        }
    }

    /// A tick in dry run: never ejects, and nothing stays ejected from before a reload;
    /// a candidate still asks for a claim (a dry-run claim spends no token).
    fn dry_run_tick(&mut self, input: &TickInput) -> Action {
        let was_ejected = self.is_ejected();
        *self = CullState::Up;
        if was_ejected {
            Action::Readmit
        } else if input.candidate && input.fleet_claimed != Some(true) {
            Action::Claim
        } else {
            Action::None
        }
    }

    /// A tick while following another instance's cull of this backend.
    fn following_tick(
        &mut self,
        since_ms: u64,
        seen_ms: u64,
        input: &TickInput,
        params: &CullParams,
    ) -> Action {
        let now = input.now_ms;
        match input.fleet_claimed {
            Some(false) => {
                *self = CullState::Up;
                Action::Readmit
            }
            Some(true) => {
                *self = CullState::Following {
                    since_ms,
                    seen_ms: now,
                };
                Action::None
            }
            None => {
                // The holder renewed at most one interval after we last saw the
                // claim, and cannot have renewed since the store became unreachable.
                let lapsed_at = seen_ms
                    .saturating_add(params.lease_ttl_ms())
                    .saturating_add(params.check_interval_secs.max(1).saturating_mul(1000));
                if now >= lapsed_at {
                    *self = CullState::Up;
                    Action::Readmit
                } else {
                    Action::None
                }
            }
        }
    }

    /// Feed the result of `Budget::claim`. Returns `Eject` when the backend goes out.
    pub fn on_claim(
        &mut self,
        now_ms: u64,
        result: &Result<ClaimOutcome, StoreError>,
        params: &CullParams,
    ) -> Action {
        if params.dry_run {
            return Action::None;
        }
        match result {
            Ok(ClaimOutcome::Granted { dry_run: false, .. }) | Ok(ClaimOutcome::Renewed { .. }) => {
                let was_ejected = self.is_ejected();
                *self = CullState::Culled {
                    since_ms: now_ms,
                    probe_at_ms: now_ms.saturating_add(params.cooldown_ms()),
                    lease_until_ms: now_ms.saturating_add(params.lease_ttl_ms()),
                };
                if was_ejected {
                    Action::None
                } else {
                    Action::Eject
                }
            }
            _ => Action::None,
        }
    }

    /// Feed the result of `Budget::renew`.
    pub fn on_renew(
        &mut self,
        now_ms: u64,
        result: &Result<bool, StoreError>,
        params: &CullParams,
    ) -> Action {
        match (result, &mut *self) {
            (
                Ok(true),
                CullState::Culled { lease_until_ms, .. }
                | CullState::Probing { lease_until_ms, .. },
            ) => {
                *lease_until_ms = now_ms.saturating_add(params.lease_ttl_ms());
                Action::None
            }
            (Ok(false), CullState::Culled { .. } | CullState::Probing { .. }) => {
                *self = CullState::Up;
                Action::Readmit
            }
            // Store error: keep the ejection until the local lease deadline passes.
            _ => Action::None,
        }
    }

    /// Feed a probe result. Healthy → release and readmit; unhealthy → renew and
    /// wait another cooldown.
    pub fn on_probe(&mut self, now_ms: u64, healthy: bool, params: &CullParams) -> Action {
        let CullState::Probing {
            since_ms,
            lease_until_ms,
        } = *self
        else {
            return Action::None;
        };
        if healthy {
            *self = CullState::Up;
            Action::ReleaseAndReadmit
        } else {
            *self = CullState::Culled {
                since_ms,
                probe_at_ms: now_ms.saturating_add(params.cooldown_ms()),
                lease_until_ms,
            };
            Action::Renew
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn p() -> CullParams {
        CullParams {
            check_interval_secs: 10,
            cooldown_secs: 60,
            ..CullParams::default()
        }
    }

    fn tick(now_ms: u64, candidate: bool, fleet: Option<bool>) -> TickInput {
        TickInput {
            now_ms,
            candidate,
            fleet_claimed: fleet,
        }
    }

    fn granted() -> Result<ClaimOutcome, StoreError> {
        Ok(ClaimOutcome::Granted {
            tokens_left: 1.0,
            expires_ms: 0,
            dry_run: false,
        })
    }

    #[test]
    fn full_cycle_claim_renew_probe_readmit() {
        let p = p();
        let mut s = CullState::Up;
        assert_eq!(s.on_tick(tick(0, false, Some(false)), &p), Action::None);
        assert_eq!(
            s.on_tick(tick(10_000, true, Some(false)), &p),
            Action::Claim
        );
        assert_eq!(s.on_claim(10_000, &granted(), &p), Action::Eject);
        assert!(s.is_ejected());
        assert_eq!(s.status_label(), "culled");
        // Renew every tick during the cooldown.
        for t in [20_000, 30_000, 60_000] {
            assert_eq!(s.on_tick(tick(t, true, Some(true)), &p), Action::Renew);
            assert_eq!(s.on_renew(t, &Ok(true), &p), Action::None);
        }
        // Cooldown over (10 s + 60 s): probe.
        assert_eq!(
            s.on_tick(tick(70_000, false, Some(true)), &p),
            Action::Probe
        );
        assert_eq!(s.on_probe(70_000, false, &p), Action::Renew);
        assert_eq!(s.on_renew(70_000, &Ok(true), &p), Action::None);
        assert_eq!(
            s.on_tick(tick(80_000, false, Some(true)), &p),
            Action::Renew
        );
        assert_eq!(
            s.on_tick(tick(130_000, false, Some(true)), &p),
            Action::Probe
        );
        assert_eq!(s.on_probe(130_000, true, &p), Action::ReleaseAndReadmit);
        assert_eq!(s, CullState::Up);
    }

    #[test]
    fn refused_claims_leave_it_up() {
        let p = p();
        let mut s = CullState::Up;
        for r in [
            Ok(ClaimOutcome::NoToken { retry_after_ms: 5 }),
            Ok(ClaimOutcome::OverBudget {
                active: 2,
                max_out: 2,
            }),
            Err(StoreError::Timeout),
        ] {
            assert_eq!(s.on_tick(tick(0, true, None), &p), Action::Claim);
            assert_eq!(s.on_claim(0, &r, &p), Action::None);
            assert_eq!(s, CullState::Up);
        }
    }

    #[test]
    fn follows_claims_of_other_instances() {
        let p = p();
        let mut s = CullState::Up;
        assert_eq!(s.on_tick(tick(0, true, Some(true)), &p), Action::Eject);
        assert!(s.is_ejected());
        // Store unreachable: keep following.
        assert_eq!(s.on_tick(tick(10_000, false, None), &p), Action::None);
        assert_eq!(s.on_tick(tick(20_000, false, Some(true)), &p), Action::None);
        assert_eq!(
            s.on_tick(tick(30_000, false, Some(false)), &p),
            Action::Readmit
        );
        assert_eq!(s, CullState::Up);
    }

    #[test]
    fn following_ends_when_the_lease_has_lapsed_with_the_store_unreachable() {
        let p = p(); // interval 10 s, lease 80 s
        let mut s = CullState::Up;
        assert_eq!(s.on_tick(tick(0, true, Some(true)), &p), Action::Eject);
        assert_eq!(s.on_tick(tick(10_000, false, Some(true)), &p), Action::None);
        // Store gone after the sighting at 10 s: the holder renewed at most at ~20 s,
        // so the claim has lapsed by 10 + 80 + 10 = 100 s.
        assert_eq!(s.on_tick(tick(20_000, false, None), &p), Action::None);
        assert_eq!(s.on_tick(tick(99_999, false, None), &p), Action::None);
        assert!(s.is_ejected());
        assert_eq!(s.on_tick(tick(100_000, false, None), &p), Action::Readmit);
        assert_eq!(s, CullState::Up);
    }

    #[test]
    fn lost_lease_readmits() {
        let p = p();
        let mut s = CullState::Up;
        s.on_tick(tick(0, true, Some(false)), &p);
        s.on_claim(0, &granted(), &p);
        assert_eq!(s.on_tick(tick(10_000, true, Some(true)), &p), Action::Renew);
        assert_eq!(s.on_renew(10_000, &Ok(false), &p), Action::Readmit);
        assert_eq!(s, CullState::Up);

        // Claim released by someone else (seen in the snapshot).
        s.on_tick(tick(0, true, Some(false)), &p);
        s.on_claim(0, &granted(), &p);
        assert_eq!(
            s.on_tick(tick(10_000, false, Some(false)), &p),
            Action::Readmit
        );
    }

    #[test]
    fn store_outage_keeps_cull_until_local_lease_deadline() {
        let p = p(); // lease 80 s
        let mut s = CullState::Up;
        s.on_tick(tick(0, true, Some(false)), &p);
        s.on_claim(0, &granted(), &p);
        let err = Err(StoreError::Command("down".into()));
        assert_eq!(s.on_tick(tick(10_000, true, None), &p), Action::Renew);
        assert_eq!(s.on_renew(10_000, &err, &p), Action::None);
        assert!(s.is_ejected());
        assert_eq!(s.on_tick(tick(60_000, true, None), &p), Action::Probe);
        assert_eq!(s.on_probe(60_000, false, &p), Action::Renew);
        assert_eq!(s.on_renew(60_000, &err, &p), Action::None);
        assert_eq!(s.on_tick(tick(79_999, true, None), &p), Action::Renew);
        assert_eq!(s.on_tick(tick(80_000, true, None), &p), Action::Readmit);
    }

    #[test]
    fn dry_run_never_ejects() {
        let mut p = p();
        p.dry_run = true;
        let mut s = CullState::Up;
        assert_eq!(s.on_tick(tick(0, true, Some(false)), &p), Action::Claim);
        let r = Ok(ClaimOutcome::Granted {
            tokens_left: 0.0,
            expires_ms: 0,
            dry_run: true,
        });
        assert_eq!(s.on_claim(0, &r, &p), Action::None);
        assert_eq!(s.on_tick(tick(0, false, Some(true)), &p), Action::None);
        assert!(!s.is_ejected());
        // Switching to dry run by reload readmits anything ejected.
        let mut s = CullState::Following {
            since_ms: 0,
            seen_ms: 0,
        };
        assert_eq!(s.on_tick(tick(1, false, Some(true)), &p), Action::Readmit);
    }

    #[test]
    fn probe_result_lost_probes_again() {
        let p = p();
        let mut s = CullState::Up;
        s.on_tick(tick(0, true, Some(false)), &p);
        s.on_claim(0, &granted(), &p);
        assert_eq!(
            s.on_tick(tick(60_000, false, Some(true)), &p),
            Action::Probe
        );
        assert_eq!(
            s.on_tick(tick(70_000, false, Some(true)), &p),
            Action::Probe
        );
        assert_eq!(s.on_probe(70_000, true, &p), Action::ReleaseAndReadmit);
    }
}
