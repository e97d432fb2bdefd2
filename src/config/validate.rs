//! Validation of the file schema into runtime types, one section per file:
//! `server.rs`, `edge.rs`, `store.rs`, `upstreams.rs`, `protection.rs`,
//! `ratelimit.rs`, `tls.rs`, `telemetry.rs` (also `[log]`). This file holds the order of the
//! checks; the helpers they share are in `check.rs`.

use super::check::VResult;
use super::protection::{validate_culling, validate_shedding, validate_watchdog};
use super::ratelimit::validate_rate_limit;
use super::schema::*;
use super::server::validate_server;
use super::settings::*;
use super::store::validate_redis;
use super::telemetry::{validate_access_log, validate_log, validate_tracing};
use super::tls::validate_tls;
use super::upstreams::{validate_routes, validate_upstreams};

/// Validate the file schema into typed settings.
pub fn validate(raw: FileConfig) -> VResult<Config> {
    let server = validate_server(&raw.server)?;
    let store = raw.redis.as_ref().map(validate_redis).transpose()?;
    let upstreams = validate_upstreams(&raw.upstreams)?;
    let mut rate_limit = validate_rate_limit(&raw.rate_limit)?;
    let routes = validate_routes(&raw.routes, &upstreams, &rate_limit)?;
    let shedding = validate_shedding(&raw.shedding)?;
    rate_limit.jwt = super::jwt::validate_jwt(raw.jwt.as_ref(), &rate_limit)?;
    let culling = validate_culling(&raw.culling)?;
    let budget = super::protection::validate_budget(&raw.budget)?;
    let watchdog = validate_watchdog(&raw.watchdog)?;
    let tls = raw.tls.as_ref().map(validate_tls).transpose()?;
    if let Some(t) = &tls {
        super::tls::distinct_from_server(t, &server)?;
    }
    let access_log = validate_access_log(&raw.access_log)?;
    let tracing = validate_tracing(&raw.tracing)?;
    let log = validate_log(&raw.log)?;
    let errors = super::errors::validate_errors(&raw.errors)?;
    let tenants = super::tenants::validate_tenants(&raw.tenants, &raw.tiers)?;
    if tenants.redis_sync && store.is_none() {
        return Err((
            "tenants.redis_sync".into(),
            "reads tenants from the store: it needs a [redis] section".into(),
        ));
    }
    if tenants.enabled() && !rate_limit.enabled {
        return Err((
            "tenants.file".into(),
            "tenants are identified by [rate_limit]'s key: set rate_limit.enabled = true".into(),
        ));
    }
    Ok(Config {
        tenants,
        tls,
        server,
        store,
        upstreams,
        routes,
        shedding,
        rate_limit,
        culling,
        budget,
        watchdog,
        access_log,
        tracing,
        log,
        errors,
    })
}
