//! Load shedding (CONTRACT §3): the policy is `portcullis_policy::shed`, re-exported here.

pub use portcullis_policy::shed::*;
