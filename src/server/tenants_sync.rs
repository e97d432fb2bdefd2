//! `[tenants] redis_sync`: the tenants kept in the store (hash `<key_prefix>:tenants`)
//! are read every [`EVERY`] in the background and join the file's tenants (the file wins
//! a name or key both claim). Never on the request path: a change rebuilds the runtime
//! as a reload does. With the store unreachable the tenants last read stay.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

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
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            if !self.shared.runtime.load().config.tenants.redis_sync {
                continue;
            }
            match portcullis_store::tenants::read(client).await {
                Ok(mut entries) => {
                    if failing {
                        tracing::info!(
                            event = "tenants_sync",
                            "the store's tenants are read again"
                        );
                        failing = false;
                    }
                    entries.sort();
                    if self.shared.set_store_tenants(entries) {
                        self.shared.reapply();
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(event = "tenants_sync", error = %e, "cannot read the store's tenants; keeping those last read");
                        failing = true;
                    }
                }
            }
        }
    }
}
