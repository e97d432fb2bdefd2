//! Why a failing backend stays in rotation: what the status page says of a
//! backend over the error threshold that the check loop did not cull
//! (`failing: last backend`, `no token`, `over fraction`, `systemic`, …).
//! Decided each tick from what the tick saw; plain data, no I/O.

use super::claim::ClaimOutcome;
use crate::StoreError;

/// The reason a backend whose errors reached the threshold is still in rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Failing {
    /// No other backend of its upstream is in rotation: culling never takes the last one.
    LastBackend = 1,
    /// The fleet's token bucket was empty.
    NoToken = 2,
    /// Culling it would pass `max_culled_fraction` of its upstream.
    OverFraction = 3,
    /// Its peers fail alike (the systemic-failure guard): nothing is culled.
    Systemic = 4,
    /// The budget store could not be asked (no new culls while it is unreachable).
    StoreError = 5,
    /// Dry run: it would have been culled.
    DryRun = 6,
}

impl Failing {
    /// The `/status` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Failing::LastBackend => "last_backend",
            Failing::NoToken => "no_token",
            Failing::OverFraction => "over_fraction",
            Failing::Systemic => "systemic",
            Failing::StoreError => "store_error",
            Failing::DryRun => "dry_run",
        }
    }

    /// The inverse of `as u8` (0 and unknown values: not failing).
    pub fn from_u8(v: u8) -> Option<Failing> {
        Some(match v {
            1 => Failing::LastBackend,
            2 => Failing::NoToken,
            3 => Failing::OverFraction,
            4 => Failing::Systemic,
            5 => Failing::StoreError,
            6 => Failing::DryRun,
            _ => return None,
        })
    }
}

/// What one tick saw of one backend.
#[derive(Debug, Clone, Copy)]
pub struct FailingInput<'a> {
    /// Its errors in the window reached the threshold.
    pub over_threshold: bool,
    /// It is out of rotation (culled, or following another instance's cull).
    pub ejected: bool,
    /// The evaluation listed it as a cull candidate (it stands out from its peers).
    pub candidate: bool,
    /// Other backends of its upstream that are in rotation.
    pub others_in_rotation: usize,
    /// The budget's answer when the tick asked for a claim.
    pub claim: Option<&'a Result<ClaimOutcome, StoreError>>,
}

/// Why the backend stays in rotation while failing; `None` when it is not
/// failing, or is out of rotation, or is about to be culled.
pub fn failing_reason(i: FailingInput<'_>) -> Option<Failing> {
    if !i.over_threshold || i.ejected {
        return None;
    }
    if i.others_in_rotation == 0 {
        return Some(Failing::LastBackend);
    }
    if !i.candidate {
        return Some(Failing::Systemic);
    }
    match i.claim {
        Some(Ok(ClaimOutcome::NoToken { .. })) => Some(Failing::NoToken),
        Some(Ok(ClaimOutcome::OverBudget { .. })) => Some(Failing::OverFraction),
        Some(Ok(ClaimOutcome::Granted { dry_run: true, .. })) => Some(Failing::DryRun),
        Some(Err(_)) => Some(Failing::StoreError),
        Some(Ok(ClaimOutcome::Granted { .. } | ClaimOutcome::Renewed { .. })) | None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(claim: Option<&Result<ClaimOutcome, StoreError>>) -> FailingInput<'_> {
        FailingInput {
            over_threshold: true,
            ejected: false,
            candidate: true,
            others_in_rotation: 2,
            claim,
        }
    }

    #[test]
    fn healthy_or_culled_backends_are_not_failing() {
        let refused = Ok(ClaimOutcome::NoToken { retry_after_ms: 1 });
        let i = input(Some(&refused));
        assert_eq!(
            failing_reason(FailingInput {
                over_threshold: false,
                ..i
            }),
            None
        );
        assert_eq!(failing_reason(FailingInput { ejected: true, ..i }), None);
        let granted = Ok(ClaimOutcome::Granted {
            tokens_left: 1.0,
            expires_ms: 1,
            dry_run: false,
        });
        assert_eq!(failing_reason(input(Some(&granted))), None);
    }

    #[test]
    fn each_refusal_has_its_reason() {
        let no_token = Ok(ClaimOutcome::NoToken { retry_after_ms: 1 });
        let over = Ok(ClaimOutcome::OverBudget {
            active: 2,
            max_out: 2,
        });
        let dry = Ok(ClaimOutcome::Granted {
            tokens_left: 1.0,
            expires_ms: 1,
            dry_run: true,
        });
        let down = Err(StoreError::Timeout);
        assert_eq!(
            failing_reason(input(Some(&no_token))),
            Some(Failing::NoToken)
        );
        assert_eq!(
            failing_reason(input(Some(&over))),
            Some(Failing::OverFraction)
        );
        assert_eq!(failing_reason(input(Some(&dry))), Some(Failing::DryRun));
        assert_eq!(
            failing_reason(input(Some(&down))),
            Some(Failing::StoreError)
        );
    }

    #[test]
    fn the_last_backend_says_so_before_anything_else() {
        // A sole backend answering only errors: the evaluation calls it systemic
        // (every backend with traffic fails), but what keeps it in is that it is the last.
        let i = FailingInput {
            candidate: false,
            others_in_rotation: 0,
            ..input(None)
        };
        assert_eq!(failing_reason(i), Some(Failing::LastBackend));
        let over = Ok(ClaimOutcome::OverBudget {
            active: 1,
            max_out: 1,
        });
        let i = FailingInput {
            others_in_rotation: 0,
            ..input(Some(&over))
        };
        assert_eq!(failing_reason(i), Some(Failing::LastBackend));
    }

    #[test]
    fn failing_alike_is_systemic() {
        let i = FailingInput {
            candidate: false,
            ..input(None)
        };
        assert_eq!(failing_reason(i), Some(Failing::Systemic));
    }

    #[test]
    fn the_code_round_trips() {
        for f in [
            Failing::LastBackend,
            Failing::NoToken,
            Failing::OverFraction,
            Failing::Systemic,
            Failing::StoreError,
            Failing::DryRun,
        ] {
            assert_eq!(Failing::from_u8(f as u8), Some(f));
        }
        assert_eq!(Failing::from_u8(0), None);
        assert_eq!(Failing::from_u8(200), None);
    }
}
