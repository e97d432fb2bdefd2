//! Culling policy (CONTRACT §7): which backend is failing, when an ejection may spend the
//! fleet-wide disruption budget, and each backend's state machine. The driver that runs it
//! against real backends and the budget stores are in the app and store crates.

mod blame;
mod budget_store;
mod claim;
pub mod claims;
mod evaluate;
mod failing;
mod fleet;
mod note;
pub mod ops;
mod outlier;
mod params;
mod state;
mod window;

pub use blame::{
    attributed, attributed_slow, find_blamed, BackendCounts, BlameLedger, BlameList, Blamed,
    FleetBlame, KeySpread, SlowCounts, SlowLedger, SpreadNote, MANY_KEYS,
    MIN_BACKENDS as BLAME_MIN_BACKENDS,
};
pub use budget_store::{BudgetStore, ClaimCommit, ClaimToCommit};
pub use claim::{ActiveClaim, BudgetSnapshot, ClaimOutcome};
pub use evaluate::{evaluate, evaluate_sharded, BackendSample, Evaluation, STANDOUT_FACTOR};
pub use failing::{failing_reason, Failing, FailingInput};
pub use fleet::{Buckets, FleetDelta};
pub use note::CullNote;
pub use outlier::{
    evaluate_outliers, latency_slice_secs, read_units, slow_line_us, LatencyBuckets,
    LatencySummary, LatencyWindow, Outlier, OutlierParams, OutlierRule, OutlierVerdict, PeerSample,
};
pub use params::{max_out, CullParams, CullingSettings};
pub use state::{Action, CullState, TickInput};
pub use window::ErrorWindow;
