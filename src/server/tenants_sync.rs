//! `[tenants] redis_sync`: the tenants kept in the store (hash `<key_prefix>:tenants`)
//! are read every [`EVERY`] in the background and join the file's tenants (the file wins
//! a name or key both claim). Never on the request path: a change rebuilds the runtime
//! as a reload does. With the store unreachable the tenants last read stay.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::every::{Outage, Ticks};
use crate::state::Shared;
use portcullis_store::{RedisClient, Store};

/// How often the store's tenants are read.
pub const EVERY: Duration = Duration::from_secs(2);

pub struct TenantSync {
    shared: Arc<Shared>,
    client: Option<Arc<RedisClient>>,
}

impl TenantSync {
    pub fn new(shared: Arc<Shared>, store: &Store) -> Self {
        let client = match store {
            Store::Redis(c) => Some(Arc::clone(c)),
            Store::Local => None,
        };
        Self { shared, client }
    }
}

#[async_trait]
impl BackgroundService for TenantSync {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(client) = &self.client else {
            return;
        };
        let mut ticks = Ticks::every(EVERY);
        let outage = Outage::new("tenants_sync");
        while ticks.next(&mut shutdown).await {
            if !self.shared.runtime.load().config.tenants.redis_sync {
                continue;
            }
            match portcullis_store::tenants::read(client).await {
                Ok(mut entries) => {
                    outage.answered("the store's tenants are read again");
                    entries.sort();
                    if self.shared.set_store_tenants(entries) {
                        self.shared.reapply();
                    }
                }
                Err(e) => {
                    outage.failed(
                        &e,
                        "cannot read the store's tenants; keeping those last read",
                    );
                }
            }
        }
    }
}
