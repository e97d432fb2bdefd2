//! What a claim on the disruption budget can return, and what a snapshot of the
//! budget holds. Plain data: the Redis and in-process budgets both produce it.

/// Result of a claim.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOutcome {
    /// A token was taken and the claim recorded (or, with `dry_run`, would have been).
    Granted {
        tokens_left: f64,
        expires_ms: u64,
        dry_run: bool,
    },
    /// The backend already held an active claim; its lease was extended for free.
    Renewed { expires_ms: u64 },
    /// The fleet bucket is empty; a token will be available in `retry_after_ms`.
    NoToken { retry_after_ms: u64 },
    /// The upstream already has `active` of at most `max_out` backends out.
    OverBudget { active: u32, max_out: u32 },
}

impl ClaimOutcome {
    /// The `result` label of `portcullis_cull_decisions_total` for this outcome
    /// (`culled`, `dry_run`, `no_token`, `over_budget`), or `None` for a renewal,
    /// which is not a new decision.
    pub fn decision_label(&self) -> Option<&'static str> {
        match self {
            ClaimOutcome::Granted { dry_run: false, .. } => Some("culled"),
            ClaimOutcome::Granted { dry_run: true, .. } => Some("dry_run"),
            ClaimOutcome::Renewed { .. } => None,
            ClaimOutcome::NoToken { .. } => Some("no_token"),
            ClaimOutcome::OverBudget { .. } => Some("over_budget"),
        }
    }

    /// True when the backend may (or, in dry run, would) be ejected.
    pub fn is_held(&self) -> bool {
        matches!(
            self,
            ClaimOutcome::Granted { .. } | ClaimOutcome::Renewed { .. }
        )
    }
}

/// One active (unexpired) claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveClaim {
    pub backend: String,
    /// Expiry on the store's clock (Unix milliseconds).
    pub expires_ms: u64,
    /// Time left, independent of clocks.
    pub remaining_ms: u64,
}

/// Everything the check loop needs each tick, read in one round trip.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetSnapshot {
    /// Tokens in the fleet bucket now (fractional while refilling).
    pub tokens_available: f64,
    /// Active claims per upstream, in the order the upstreams were asked for.
    pub claims: Vec<Vec<ActiveClaim>>,
}
