//! Claims on the disruption budget through the admin listener (CONTRACT §12): `POST /claims`
//! (grant, dry run, emergency), `GET /claims`, `DELETE /claims/{id}` and
//! `GET /claims/feasible?upstream=NAME`, the audit a deploy tool runs before it starts.
//! Dry runs and the audit are answered from the fleet view the sync keeps (no store round
//! trip); a real claim reads the budget afresh and commits on its version
//! (`store::budget::claim`).

use std::sync::Arc;

use http::{Response, StatusCode};
use portcullis_policy::cull::claims::{check_claim, groups_of, ClaimAsk, ClaimRefusal, FleetState};
use portcullis_policy::cull::ops::{OpKind, OpRecord, OpRequest, MAX_REASON};
use portcullis_policy::cull::BudgetStore;
use serde::Deserialize;
use serde_json::{json, Value};

use super::checks::{ask, named_groups, names, refresh};
use super::reply::{answer, error, find, record, Done};
use super::sync::FleetView;
use crate::state::{Runtime, Shared};

/// The longest claim (`seconds`): a day; a longer change is a maintenance, not a deploy.
const MAX_CLAIM_SECONDS: u64 = 24 * 3600;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimBody {
    upstream: String,
    backend: String,
    seconds: u64,
    reason: String,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    emergency: bool,
}

fn parse(body: &[u8]) -> Result<ClaimBody, String> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    let b: ClaimBody = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." || path.starts_with('?') {
            "body".to_string()
        } else {
            path
        };
        format!("{field}: {}", e.into_inner())
    })?;
    if !(1..=MAX_CLAIM_SECONDS).contains(&b.seconds) {
        return Err(format!(
            "seconds: must be between 1 and {MAX_CLAIM_SECONDS}"
        ));
    }
    if b.reason.trim().is_empty() {
        return Err("reason: must say why (for the journal)".into());
    }
    if b.reason.len() > MAX_REASON {
        return Err(format!("reason: longer than {MAX_REASON} bytes"));
    }
    Ok(b)
}

/// The fuzzing entry point (`fuzz/`): a `POST /claims` body as [`parse`] reads it, its
/// `seconds` and `reason`. Not part of the API.
#[doc(hidden)]
pub fn fuzz_parse(body: &[u8]) -> Result<(u64, String), String> {
    parse(body).map(|b| (b.seconds, b.reason))
}

fn refusal_json(r: &ClaimRefusal, dry_run: bool) -> Value {
    let mut v = json!({
        "granted": false,
        "dry_run": dry_run,
        "policy": r.policy(),
        "reason": r.reason(),
    });
    if let Some(ms) = r.retry_after_ms() {
        v["retry_after_seconds"] = json!(ms.div_ceil(1000).max(1));
    }
    v
}

fn claim_json(upstream: &str, r: &OpRecord) -> Value {
    let (id, emergency) = match r.kind {
        OpKind::Claim { id, emergency } => (id, emergency),
        _ => (0, false),
    };
    json!({
        "id": format!("{id:016x}"),
        "upstream": upstream,
        "backend": r.backend,
        "reason": r.reason,
        "by": r.by,
        "started_at": r.at_ms,
        "expires_at": r.until_ms,
        "emergency": emergency,
    })
}

/// `POST /claims` by the admin token named `by`.
pub async fn post(
    shared: &Shared,
    budget: &dyn BudgetStore,
    view: &FleetView,
    body: &[u8],
    by: &str,
) -> Response<Vec<u8>> {
    let rt = shared.runtime.load_full();
    let mut done = Done {
        action: "claim",
        upstream: "",
        backend: "",
        by,
        result: "invalid",
        reason: String::new(),
    };
    let b = match parse(body) {
        Ok(b) => b,
        Err(msg) => {
            done.reason = msg.clone();
            record(shared, &done);
            return error(StatusCode::BAD_REQUEST, &msg);
        }
    };
    let (pi, bi) = match find(&rt.pools, &b.upstream, &b.backend) {
        Ok(ix) => ix,
        Err(msg) => return error(StatusCode::NOT_FOUND, &msg),
    };
    let pool = &rt.pools[pi];
    let backend = &pool.backends[bi];
    let groups_rt = Arc::clone(&rt);
    let groups = move |u: &str, be: &str| named_groups(&groups_rt, u, be);
    let ask = ask(&rt, pool, &backend.addr_str, b.emergency, &groups);
    done.upstream = &pool.name;
    done.backend = &backend.addr_str;
    done.reason = portcullis_policy::text::one_line(&b.reason);
    // Never the last backend that serves, emergency or not.
    if !super::checks::another_serves(pool, &backend.addr_str) {
        let mut v = super::checks::last_serving_refusal(pool);
        v["dry_run"] = json!(b.dry_run);
        done.result = "refused";
        done.reason = v["reason"].as_str().unwrap_or_default().to_string();
        record(shared, &done);
        return answer(StatusCode::CONFLICT, &v);
    }
    if b.dry_run {
        return dry_run(shared, budget, view, &rt, &ask, &mut done).await;
    }
    let req = claim_request(&b, by, &done.reason);
    let names = names(&rt);
    let params = &rt.config.culling.params;
    let outcome =
        portcullis_store::budget::claim(budget, &names, &ask, &rt.config.budget, params, &req)
            .await;
    match outcome {
        Ok(Ok(rec)) => {
            // Set from the store's state read right after the grant (or by itself when that
            // read fails): never on top of an operation that lapsed since the last sync.
            if !refresh(&rt, budget, view).await {
                backend.manual().put(rec.clone());
            }
            done.result = if b.emergency { "emergency" } else { "applied" };
            record(shared, &done);
            let mut v = claim_json(&pool.name, &rec);
            v["granted"] = json!(true);
            answer(StatusCode::CREATED, &v)
        }
        Ok(Err(r)) => {
            done.result = "refused";
            done.reason = r.reason();
            record(shared, &done);
            answer(StatusCode::CONFLICT, &refusal_json(&r, false))
        }
        Err(e) => store_down(shared, &mut done, &e.to_string()),
    }
}

/// A dry run: the claim checked on the fleet view (read from the store when the sync has
/// none yet), nothing committed.
async fn dry_run(
    shared: &Shared,
    budget: &dyn BudgetStore,
    view: &FleetView,
    rt: &Runtime,
    ask: &ClaimAsk<'_>,
    done: &mut Done<'_>,
) -> Response<Vec<u8>> {
    let state = match view.load() {
        Some(s) => s,
        None => match budget
            .fleet_state(&names(rt), &rt.config.culling.params)
            .await
        {
            Ok(s) => Arc::new(s),
            Err(e) => return store_down(shared, done, &e.to_string()),
        },
    };
    done.result = "dry_run";
    record(shared, done);
    match check_claim(ask, &state, &rt.config.budget) {
        Ok(()) => answer(StatusCode::OK, &json!({"granted": true, "dry_run": true})),
        Err(r) => answer(StatusCode::CONFLICT, &refusal_json(&r, true)),
    }
}

/// The operation a claim asks the store for: a random id, the lease, who and why.
fn claim_request(b: &ClaimBody, by: &str, reason: &str) -> OpRequest {
    OpRequest {
        kind: OpKind::Claim {
            id: u64::try_from(crate::observe::trace::random_u128() & u128::from(u64::MAX))
                .unwrap_or(1)
                .max(1),
            emergency: b.emergency,
        },
        by: by.to_string(),
        reason: reason.to_string(),
        ttl_ms: Some(b.seconds * 1000),
        force: false,
    }
}

fn store_down(shared: &Shared, done: &mut Done<'_>, e: &str) -> Response<Vec<u8>> {
    done.result = "store_error";
    done.reason = e.to_string();
    record(shared, done);
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("the store did not answer ({e}): nothing was claimed; traffic is unaffected"),
    )
}

/// The budget read afresh, or the sync's view when the store does not answer.
async fn current(
    rt: &Runtime,
    budget: &dyn BudgetStore,
    view: &FleetView,
) -> Option<Arc<FleetState>> {
    match budget
        .fleet_state(&names(rt), &rt.config.culling.params)
        .await
    {
        Ok(s) => Some(Arc::new(s)),
        Err(_) => view.load(),
    }
}

/// `GET /claims`: the claims in force, fleet-wide.
pub async fn list(
    shared: &Shared,
    budget: &dyn BudgetStore,
    view: &FleetView,
) -> Response<Vec<u8>> {
    let rt = shared.runtime.load_full();
    let Some(state) = current(&rt, budget, view).await else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the store did not answer and no view is kept yet",
        );
    };
    let all: Vec<Value> = state.claims().map(|(u, r)| claim_json(u, r)).collect();
    answer(StatusCode::OK, &Value::Array(all))
}

/// `DELETE /claims/{id}`: release early.
pub async fn delete(
    shared: &Shared,
    budget: &dyn BudgetStore,
    view: &FleetView,
    id_text: &str,
    by: &str,
) -> Response<Vec<u8>> {
    let Ok(id) = u64::from_str_radix(id_text, 16) else {
        return error(
            StatusCode::NOT_FOUND,
            "no such claim (ids are 16 hex digits)",
        );
    };
    let rt = shared.runtime.load_full();
    let state = match budget
        .fleet_state(&names(&rt), &rt.config.culling.params)
        .await
    {
        Ok(s) => s,
        Err(e) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("the store did not answer ({e}): nothing was released"),
            )
        }
    };
    let found = state
        .claims()
        .find(|(_, r)| matches!(r.kind, OpKind::Claim { id: i, .. } if i == id));
    let Some((upstream, rec)) = found else {
        return error(StatusCode::NOT_FOUND, "no such claim (released or expired)");
    };
    let groups = groups_of(upstream, named_groups(&rt, upstream, &rec.backend));
    let mut done = Done {
        action: "release",
        upstream,
        backend: &rec.backend,
        by,
        result: "applied",
        reason: rec.reason.clone(),
    };
    match budget
        .release_claim(upstream, &rec.backend, id, &groups)
        .await
    {
        Ok(true) => {
            if let Ok((pi, bi)) = find(&rt.pools, upstream, &rec.backend) {
                let b = &rt.pools[pi].backends[bi];
                b.manual().remove(&rec.field());
            }
            refresh(&rt, budget, view).await;
            record(shared, &done);
            answer(StatusCode::OK, &json!({"released": format!("{id:016x}")}))
        }
        Ok(false) => error(StatusCode::NOT_FOUND, "no such claim (released or expired)"),
        Err(e) => store_down(shared, &mut done, &e.to_string()),
    }
}

/// `GET /claims/feasible?upstream=NAME`: for each backend, whether a claim would be granted
/// now and, if not, which policy refuses; from the fleet view.
pub fn feasible(shared: &Shared, view: &FleetView, query: Option<&str>) -> Response<Vec<u8>> {
    let upstream = query
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("upstream="))
        .and_then(super::reply::decode);
    let Some(upstream) = upstream else {
        return error(
            StatusCode::BAD_REQUEST,
            "upstream: missing query parameter ?upstream=NAME",
        );
    };
    let rt = shared.runtime.load_full();
    let Some(pool) = rt.pools.iter().find(|p| p.name == upstream) else {
        return error(
            StatusCode::NOT_FOUND,
            &format!("unknown upstream {upstream:?}"),
        );
    };
    let Some(state) = view.load() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the fleet view is not read yet; retry in a second",
        );
    };
    let groups_rt = Arc::clone(&rt);
    let groups = move |u: &str, be: &str| named_groups(&groups_rt, u, be);
    let rows: Vec<Value> = pool
        .backends
        .iter()
        .map(|b| {
            let a = ask(&rt, pool, &b.addr_str, false, &groups);
            match check_claim(&a, &state, &rt.config.budget) {
                Ok(()) => json!({"address": b.addr_str, "granted": true}),
                Err(r) => {
                    let mut v = refusal_json(&r, true);
                    v["address"] = json!(b.addr_str);
                    v
                }
            }
        })
        .collect();
    answer(
        StatusCode::OK,
        &json!({"upstream": pool.name, "as_of": state.now_ms, "backends": rows}),
    )
}
