//! The lock-free windowed counter shared by the retry budget and the error window: policy,
//! re-exported from `portcullis_policy::window`.

pub use portcullis_policy::window::*;
