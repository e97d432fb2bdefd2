//! The cull webhook: a fire-and-forget `POST` of
//! `{"upstream", "backend", "reason", "errors"}` to `culling.webhook_url`.

use std::time::Duration;

use super::http::status_of;

/// Spawn the POST; failures are logged, never retried, never block culling.
pub fn notify(url: &str, upstream: &str, backend: &str, reason: &str, errors: u64) {
    if url.is_empty() {
        return;
    }
    let body = serde_json::json!({
        "upstream": upstream,
        "backend": backend,
        "reason": reason,
        "errors": errors,
    })
    .to_string();
    let url = url.to_owned();
    tokio::spawn(async move {
        match post(&url, body).await {
            Ok(status) => tracing::info!(event = "cull_webhook", status, "webhook delivered"),
            Err(e) => tracing::warn!(event = "cull_webhook", error = %e, "webhook failed"),
        }
    });
}

async fn post(url: &str, body: String) -> Result<u16, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or("webhook_url must be http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = tokio::net::lookup_host(authority)
        .await
        .map_err(|e| format!("cannot resolve {authority}: {e}"))?
        .next()
        .ok_or_else(|| format!("{authority} resolves to nothing"))?;
    status_of(
        addr,
        "POST",
        path,
        authority,
        "portcullis-cull-webhook",
        Some(("application/json", body)),
        Duration::from_secs(2),
    )
    .await
    .map_err(|e| e.to_string())
}
