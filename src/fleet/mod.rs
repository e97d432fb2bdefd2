//! Fleet operations (CONTRACT §12): a person or a deploy tool drains, maintains or
//! re-weights a backend at runtime, on every instance sharing the store, from the same
//! disruption budget the automatic culls spend. The records live in the store as leases
//! (`cull::ops` in the policy crate, `BudgetStore::put_op`); [`sync`] brings them to this
//! instance's backends every second, [`api`] is the admin endpoints over them, and
//! [`claims_api`] the claims a deploy tool asks of the same budget.

pub mod api;
pub mod checks;
pub mod claims_api;
mod reply;
pub mod sync;
mod view;

pub use view::backend_view;
