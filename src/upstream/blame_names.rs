//! The tenant names of the keys blamed for an upstream's errors (`[culling] blame_tenants`,
//! CONTRACT §15): the `tenant` label of `portcullis_blamed_total`. Who a request is, and
//! the blame itself, are `cull::blame`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The tenant names of the identities that erred, for the `tenant` label of
/// `portcullis_blamed_total` (a bounded set: the configured tenants' names).
#[derive(Debug, Default)]
pub struct BlameNames(Mutex<HashMap<u64, Arc<str>>>);

impl BlameNames {
    /// Remember the name of `id`'s tenant, if it has one (called on errors only).
    pub fn note(&self, id: u64, tenant: Option<&Arc<str>>) {
        if let Some(name) = tenant {
            let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
            if m.len() < MAX_NAMES || m.contains_key(&id) {
                m.insert(id, Arc::clone(name));
            }
        }
    }

    /// The `tenant` label of a blamed identity: its tenant's name, or `"unknown"` for a key
    /// no tenant holds (never the key itself).
    pub fn label(&self, id: u64) -> Arc<str> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&id).cloned().unwrap_or_else(|| Arc::from("unknown"))
    }
}

/// Names remembered per upstream.
const MAX_NAMES: usize = 100_000;
