//! Tenants kept in the store (CONTRACT §14, `[tenants] redis_sync`): the hash
//! `<key_prefix>:tenants`, one field per tenant name, its value
//! `{"tier": "pro", "keys": ["sha256:…"]}`. Read whole by the app's background sync,
//! never on the request path.

use crate::{RedisClient, StoreError};

/// The hash's key.
pub fn key(client: &RedisClient) -> String {
    format!("{}:tenants", client.prefix())
}

/// Every `(name, value)` of the hash (one `HGETALL`, bounded by the client's timeout).
pub async fn read(client: &RedisClient) -> Result<Vec<(String, String)>, StoreError> {
    let key = key(client);
    client
        .run(|mut c| async move {
            redis::cmd("HGETALL")
                .arg(&key)
                .query_async::<Vec<(String, String)>>(&mut c)
                .await
        })
        .await
}
