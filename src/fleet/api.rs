//! The runtime API on the admin listener (CONTRACT §12): `GET /backends` and
//! `POST /backends/{upstream}/{address}/{drain|maint|ready|weight}`. Bodies are JSON; a
//! malformed one is 400 naming the field, an unknown upstream or backend 404, a refusal
//! by the budget 409 with the policy and a reason a person can act on, a store that does
//! not answer 503 (the action was not applied; traffic is unaffected). Every action is
//! journaled (`/status` `recent_decisions`), counted
//! (`portcullis_admin_actions_total{action,result}`) and logged as one line.

use http::{Response, StatusCode};
use portcullis_policy::cull::ops::{OpKind, OpRequest, MAX_REASON};
use portcullis_policy::cull::BudgetStore;
use serde::Deserialize;
use serde_json::{json, Value};

use super::reply::{answer, decode, error, find, record, Done};
use super::sync::rebuild_if_weights_changed;
use super::view::backend_view;
use crate::state::Shared;

/// The longest body read (bytes); a longer one is 413.
pub const MAX_BODY: usize = 16 * 1024;

/// The longest lease (`seconds`): 31 days.
const MAX_SECONDS: u64 = 31 * 24 * 3600;

/// The highest weight, as in `[[upstreams]] weights`.
const MAX_WEIGHT: u64 = 1000;

/// `GET /backends`: every backend of every upstream.
pub fn list(shared: &Shared) -> Response<Vec<u8>> {
    let rt = shared.runtime.load();
    let all: Vec<Value> = rt
        .pools
        .iter()
        .flat_map(|p| p.backends.iter().map(move |b| backend_view(p, b)))
        .collect();
    answer(StatusCode::OK, &Value::Array(all))
}

/// The action of a path's last segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Drain,
    Maint,
    Ready,
    Weight,
}

impl Action {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "drain" => Some(Action::Drain),
            "maint" => Some(Action::Maint),
            "ready" => Some(Action::Ready),
            "weight" => Some(Action::Weight),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Action::Drain => "drain",
            Action::Maint => "maint",
            Action::Ready => "ready",
            Action::Weight => "weight",
        }
    }
}

/// A body of any action; which fields an action takes is checked after.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    reason: Option<String>,
    seconds: Option<u64>,
    force: Option<bool>,
    weight: Option<u64>,
}

/// `{upstream}/{address}/{action}` after `/backends/`.
fn parse_path(rest: &str) -> Result<(String, String, Action), (StatusCode, &'static str)> {
    let parts: Vec<&str> = rest.split('/').collect();
    let [up, addr, action] = parts[..] else {
        return Err((
            StatusCode::NOT_FOUND,
            "expected /backends/{upstream}/{address}/{drain|maint|ready|weight}",
        ));
    };
    let Some(action) = Action::parse(action) else {
        return Err((
            StatusCode::NOT_FOUND,
            "unknown action: expected drain, maint, ready or weight",
        ));
    };
    match (decode(up), decode(addr)) {
        (Some(u), Some(a)) => Ok((u, a, action)),
        _ => Err((
            StatusCode::BAD_REQUEST,
            "invalid percent-encoding in the path",
        )),
    }
}

/// The body, checked for `action`: the request the store is asked.
fn parse_body(action: Action, body: &[u8], by: &str) -> Result<Option<OpRequest>, String> {
    let body: Body = if body.iter().all(u8::is_ascii_whitespace) {
        Body::default()
    } else {
        let de = &mut serde_json::Deserializer::from_slice(body);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            // A syntax error has no field (`?`): it is the body's.
            let field = if path == "." || path.starts_with('?') {
                "body".to_string()
            } else {
                path
            };
            format!("{field}: {}", e.into_inner())
        })?
    };
    if let Some(r) = &body.reason {
        if r.len() > MAX_REASON {
            return Err(format!("reason: longer than {MAX_REASON} bytes"));
        }
    }
    let ttl_ms = match body.seconds {
        Some(s) if !(1..=MAX_SECONDS).contains(&s) => {
            return Err(format!("seconds: must be between 1 and {MAX_SECONDS}"))
        }
        s => s.map(|s| s * 1000),
    };
    let kind = match action {
        Action::Ready => return Ok(None),
        Action::Drain => OpKind::Drain,
        Action::Maint => OpKind::Maint,
        Action::Weight => match body.weight {
            Some(w) if w <= MAX_WEIGHT => OpKind::Weight(w as u32),
            Some(_) => return Err(format!("weight: must be between 0 and {MAX_WEIGHT}")),
            None => return Err("weight: missing field `weight`".into()),
        },
    };
    if action != Action::Weight && body.weight.is_some() {
        return Err("weight: only the weight action takes a weight".into());
    }
    let reason = match (body.reason, action) {
        // Control characters become spaces: a reason stays one line of a log or a page.
        (Some(r), _) if !r.trim().is_empty() => portcullis_policy::text::one_line(&r),
        (_, Action::Weight) => String::new(),
        _ => return Err("reason: missing field `reason` (say why, for the journal)".into()),
    };
    Ok(Some(OpRequest {
        kind,
        by: by.to_string(),
        reason,
        ttl_ms,
        force: body.force.unwrap_or(false),
    }))
}

/// The fuzzing entry point (`fuzz/`): [`parse_path`] over `rest` (what follows
/// `/backends/`), then [`parse_body`] for its action, as a `POST` is parsed. The upstream,
/// the address and the request the store would be asked. Not part of the API.
#[doc(hidden)]
pub fn fuzz_parse(rest: &str, body: &[u8]) -> Result<(String, String, Option<OpRequest>), String> {
    let (up, addr, action) = parse_path(rest).map_err(|(_, msg)| msg.to_string())?;
    parse_body(action, body, "fuzz").map(|req| (up, addr, req))
}

/// `POST /backends/{upstream}/{address}/{action}` (`rest` is the path after `/backends/`),
/// by the admin token named `by`.
pub async fn act(
    shared: &Shared,
    budget: &dyn BudgetStore,
    view: &super::sync::FleetView,
    rest: &str,
    body: &[u8],
    by: &str,
) -> Response<Vec<u8>> {
    let (up, addr, action) = match parse_path(rest) {
        Ok(p) => p,
        Err((status, msg)) => return error(status, msg),
    };
    let rt = shared.runtime.load_full();
    let (pi, bi) = match find(&rt.pools, &up, &addr) {
        Ok(ix) => ix,
        Err(msg) => return error(StatusCode::NOT_FOUND, &msg),
    };
    let pool = &rt.pools[pi];
    let b = &pool.backends[bi];
    let mut done = Done {
        action: action.name(),
        upstream: &pool.name,
        backend: &b.addr_str,
        by,
        result: "invalid",
        reason: String::new(),
    };
    let req = match parse_body(action, body, by) {
        Ok(r) => r,
        Err(msg) => {
            done.reason = msg.clone();
            record(shared, &done);
            return error(StatusCode::BAD_REQUEST, &msg);
        }
    };
    if let Some((reason, body)) = refused_before_store(&rt, pool, b, req.as_ref(), view) {
        done.result = "refused";
        done.reason = reason;
        record(shared, &done);
        return answer(StatusCode::CONFLICT, &body);
    }
    apply(shared, budget, view, &rt, (pool, b), req, done).await
}

/// The action in the store, and its answer: the backend as it stands now (set from the
/// store's state read right after), a refusal by the budget (409), or a store that did not
/// answer (503).
async fn apply(
    shared: &Shared,
    budget: &dyn BudgetStore,
    view: &super::sync::FleetView,
    rt: &crate::state::Runtime,
    (pool, b): (&crate::upstream::Pool, &crate::upstream::BackendState),
    req: Option<OpRequest>,
    mut done: Done<'_>,
) -> Response<Vec<u8>> {
    // The record granted, set on the backend from the store's state read right after (or
    // by itself when that read fails).
    let mut granted = None;
    let outcome = match &req {
        None => budget.clear_ops(&pool.name, &b.addr_str).await.map(|_| {
            b.manual().set(Vec::new());
            Ok(())
        }),
        Some(req) => {
            let total = u32::try_from(pool.backends.len()).unwrap_or(u32::MAX);
            let fraction = rt.config.culling.params.max_culled_fraction;
            budget
                .put_op(&pool.name, &b.addr_str, total, fraction, req)
                .await
                .map(|r| r.map(|record| granted = Some(record)))
        }
    };
    done.reason = req.as_ref().map(|r| r.reason.clone()).unwrap_or_default();
    match outcome {
        Ok(Ok(())) => {
            done.result = "applied";
            record(shared, &done);
            if !super::checks::refresh(rt, budget, view).await {
                if let Some(record) = granted.take() {
                    b.manual().put(record);
                }
            }
            rebuild_if_weights_changed(shared);
            answer(StatusCode::OK, &backend_view(pool, b))
        }
        Ok(Err(refusal)) => {
            done.result = "refused";
            done.reason = refusal.reason();
            record(shared, &done);
            answer(
                StatusCode::CONFLICT,
                &refusal_body(refusal.policy(), &refusal.reason()),
            )
        }
        Err(e) => {
            done.result = "store_error";
            done.reason = e.to_string();
            record(shared, &done);
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("the store did not answer ({e}): the action was not applied; traffic is unaffected"),
            )
        }
    }
}

/// What refuses an action before the store is asked (the reason and the 409's body):
/// never the last backend that serves, forced or not (the store counts what is out, not
/// what is down by its health check); and a voluntary operation that takes the backend
/// out answers to `[budget]` too, from the fleet view (the fraction and the last backend
/// are then checked atomically by the store).
fn refused_before_store(
    rt: &std::sync::Arc<crate::state::Runtime>,
    pool: &crate::upstream::Pool,
    b: &crate::upstream::BackendState,
    req: Option<&OpRequest>,
    view: &super::sync::FleetView,
) -> Option<(String, Value)> {
    let takes_out = req.is_some_and(|r| r.kind.takes_out());
    if takes_out && !super::checks::another_serves(pool, &b.addr_str) {
        let v = super::checks::last_serving_refusal(pool);
        let reason = v["reason"].as_str().unwrap_or_default().to_string();
        return Some((reason, v));
    }
    if takes_out && req.is_some_and(|r| !r.force) {
        let refusal = super::checks::voluntary_check(rt, pool, &b.addr_str, view)?;
        return Some((
            refusal.reason(),
            refusal_body(refusal.policy(), &refusal.reason()),
        ));
    }
    None
}

/// A refusal's 409 body.
fn refusal_body(policy: &str, reason: &str) -> Value {
    json!({"granted": false, "policy": policy, "reason": reason})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_percent_encoded_addresses() {
        let (u, a, act) = parse_path("app/10.0.0.5%3A8080/drain").unwrap_or_else(|_| panic!());
        assert_eq!(
            (u.as_str(), a.as_str(), act),
            ("app", "10.0.0.5:8080", Action::Drain)
        );
        assert!(parse_path("app/10.0.0.5:8080/explode").is_err());
        // found by the admin fuzz target: a sign is not a hex digit
        assert!(parse_path("app/%+1/drain").is_err());
        assert!(parse_path("%+a/b/drain").is_err());
        assert!(parse_path("app/10.0.0.5:8080").is_err());
        assert!(parse_path("app/%zz/drain").is_err());
        assert!(parse_path("app/%ff/drain").is_err(), "not UTF-8");
    }

    #[test]
    fn bodies_name_the_field() {
        let e = |action, body: &str| {
            parse_body(action, body.as_bytes(), "ops")
                .err()
                .unwrap_or_default()
        };
        assert!(
            e(Action::Drain, r#"{"reason": 5}"#).starts_with("reason:"),
            "{}",
            e(Action::Drain, r#"{"reason": 5}"#)
        );
        assert!(e(Action::Drain, r#"{"reason": "x", "seconds": -1}"#).starts_with("seconds:"));
        assert!(e(Action::Drain, r#"{"reason": "x", "seconds": 0}"#).starts_with("seconds:"));
        assert!(e(Action::Drain, r#"{"reason": "x", "colour": 1}"#).contains("colour"));
        assert!(
            e(Action::Drain, "{").starts_with("body:"),
            "{}",
            e(Action::Drain, "{")
        );
        assert!(e(Action::Drain, "{}").starts_with("reason:"));
        assert!(e(Action::Weight, r#"{"weight": 1001}"#).starts_with("weight:"));
        assert!(e(Action::Weight, "{}").starts_with("weight:"));
        assert!(e(Action::Drain, r#"{"reason": "x", "weight": 1}"#).starts_with("weight:"));
        let long = format!(r#"{{"reason": "{}"}}"#, "x".repeat(MAX_REASON + 1));
        assert!(e(Action::Maint, &long).starts_with("reason:"));
        let ok = parse_body(
            Action::Drain,
            br#"{"reason": "deploy", "seconds": 60, "force": true}"#,
            "ops",
        );
        let ok = ok
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!());
        assert_eq!(
            (ok.kind, ok.ttl_ms, ok.force, ok.by.as_str()),
            (OpKind::Drain, Some(60_000), true, "ops")
        );
        assert!(matches!(parse_body(Action::Ready, b"", "ops"), Ok(None)));
    }
}
