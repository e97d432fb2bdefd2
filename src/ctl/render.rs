//! What `portcullis ctl` prints: the admin API's answers as aligned tables and sentences.
//! Every string from an answer goes through [`clean`]; a field an answer lacks is `-`.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::client::clean;
use super::CtlCommand;

/// Now, in ms since the epoch.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// `secs` as `45s`, `9m59s`, `2h05m`, `3d04h`.
fn span(secs: i64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s if s < 86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        s => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// A time in ms since the epoch relative to `now`: `in 9m59s`, `expired`; `-` for none.
pub fn relative(at_ms: Option<i64>, now: i64) -> String {
    match at_ms {
        None => "-".into(),
        Some(t) if t <= now => "expired".into(),
        // rounded up: a lease of 600 s just granted reads `in 10m00s`
        Some(t) => format!("in {}", span((t - now + 999) / 1000)),
    }
}

/// The first of `keys` that `v` has, as text: strings as they are, numbers and booleans
/// written out, null or absent `-`.
fn field(v: &Value, keys: &[&str]) -> String {
    for k in keys {
        match &v[*k] {
            Value::Null => continue,
            Value::String(s) if s.is_empty() => return "-".into(),
            Value::String(s) => return clean(s),
            other => return clean(&other.to_string()),
        }
    }
    "-".into()
}

fn time_field(v: &Value, keys: &[&str], now: i64) -> String {
    let t = keys.iter().find_map(|k| v[*k].as_i64());
    relative(t, now)
}

/// Rows under a header, columns padded to their widest cell (the last one not padded).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, cell) in cells.enumerate() {
            if i + 1 == widths.len() {
                s.push_str(cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count());
                s.push_str(cell);
                s.push_str(&" ".repeat(pad + 2));
            }
        }
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = line(&mut header.iter().copied());
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

/// The entries of an answer that is a list, or holds one under `key`.
fn entries<'a>(v: &'a Value, key: &str) -> Option<&'a Vec<Value>> {
    v.as_array().or_else(|| v[key].as_array())
}

/// `GET /backends` entries (or one backend's record) as a table.
pub fn backends(list: &[Value], now: i64) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|b| {
            let mut source = field(b, &["source"]);
            if b["force"] == Value::Bool(true) {
                source.push_str(" (forced)");
            }
            vec![
                field(b, &["upstream"]),
                field(b, &["address"]),
                field(b, &["state"]),
                field(b, &["weight"]),
                source,
                field(b, &["by"]),
                field(b, &["reason"]),
                time_field(b, &["until"], now),
            ]
        })
        .collect();
    let mut header = vec![
        "UPSTREAM", "ADDRESS", "STATE", "WEIGHT", "SOURCE", "BY", "REASON", "UNTIL",
    ];
    let mut rows = rows;
    // Backends with names: a NAME column (the address stays the second).
    if list
        .iter()
        .any(|b| b["name"].is_string() && b["name"] != b["address"])
    {
        header.push("NAME");
        for (row, b) in rows.iter_mut().zip(list) {
            row.push(field(b, &["name"]));
        }
    }
    // With active checks, the last one (HAProxy's LastChk): `status 500 in 3ms, 1/3`.
    if list.iter().any(|b| b["check"].is_object()) {
        header.push("CHECK");
        for (row, b) in rows.iter_mut().zip(list) {
            row.push(check(&b["check"]));
        }
    }
    table(&header, &rows)
}

/// A backend's last active check: `ok in 2ms, 0/3`; `-` without one. With shared
/// probing, whose verdict the state is: `, fleet` (the probers' majority; this instance
/// does not probe it) or `, fleet+probing` (this instance is one of the probers).
fn check(c: &Value) -> String {
    let source = match (c["source"].as_str(), c["probing"].as_bool()) {
        (Some("fleet"), Some(true)) => ", fleet+probing",
        (Some("fleet"), _) => ", fleet",
        _ => "",
    };
    match (c["result"].as_str(), c["duration_ms"].as_u64()) {
        (Some(r), Some(ms)) => format!(
            "{} in {ms}ms, {}{source}",
            clean(r),
            field(c, &["progress"])
        ),
        _ => "-".into(),
    }
}

/// `GET /claims` entries as a table.
fn claims(list: &[Value], now: i64) -> String {
    if list.is_empty() {
        return "no active claims\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|c| {
            let mut reason = field(c, &["reason"]);
            if c["emergency"] == Value::Bool(true) {
                reason = format!("[emergency] {reason}");
            }
            vec![
                field(c, &["id"]),
                field(c, &["upstream"]),
                field(c, &["backend", "address"]),
                field(c, &["by"]),
                reason,
                time_field(c, &["expires_at", "until"], now),
            ]
        })
        .collect();
    table(
        &["ID", "UPSTREAM", "BACKEND", "BY", "REASON", "EXPIRES"],
        &rows,
    )
}

/// `GET /claims/feasible` entries as a table.
fn feasible(list: &[Value]) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|f| {
            let granted = f["granted"].as_bool().or_else(|| f["feasible"].as_bool());
            let retry = f["retry_after_seconds"]
                .as_i64()
                .map(|s| format!("{s}s"))
                .unwrap_or_else(|| "-".into());
            vec![
                field(f, &["backend", "address"]),
                match granted {
                    Some(true) => "granted".into(),
                    Some(false) => "refused".into(),
                    None => "-".into(),
                },
                field(f, &["policy"]),
                retry,
                field(f, &["reason"]),
            ]
        })
        .collect();
    table(
        &["BACKEND", "CLAIM", "POLICY", "RETRY AFTER", "REASON"],
        &rows,
    )
}

/// The answer pretty-printed, when its shape is not the one expected.
fn raw(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

/// What a successful `cmd` prints, from its answer `v`.
pub fn done(cmd: &CtlCommand, v: &Value) -> String {
    done_at(cmd, v, now_ms())
}

fn done_at(cmd: &CtlCommand, v: &Value, now: i64) -> String {
    match cmd {
        CtlCommand::Backends => match v.as_array() {
            Some(list) => backends(list, now),
            None => raw(v),
        },
        CtlCommand::Drain(_)
        | CtlCommand::Maint(_)
        | CtlCommand::Ready { .. }
        | CtlCommand::Weight { .. } => {
            if v.is_object() {
                backends(std::slice::from_ref(v), now)
            } else {
                raw(v)
            }
        }
        CtlCommand::Claim {
            upstream,
            address,
            dry_run,
            ..
        } => {
            let (up, addr) = (clean(upstream), clean(address));
            if *dry_run {
                format!("dry run: a claim on {up} {addr} would be granted now\n")
            } else {
                format!(
                    "claim {} granted: {up} {addr} is drained fleet-wide until it is released \
                     or expires ({})\n",
                    field(v, &["id"]),
                    time_field(v, &["expires_at"], now)
                )
            }
        }
        CtlCommand::Release { id } => format!("claim {} released\n", clean(id)),
        CtlCommand::Claims => match entries(v, "claims") {
            Some(list) => claims(list, now),
            None => raw(v),
        },
        CtlCommand::Feasible { .. } => match entries(v, "backends") {
            Some(list) => feasible(list),
            None => raw(v),
        },
        CtlCommand::Reload => "reloaded: the new configuration is applied\n".to_string(),
    }
}

/// What a refused reload prints: the proxy's error (file, line:column, key, why), and
/// that the running configuration stays.
pub fn reload_refusal(v: &Value) -> String {
    let error = match v["error"].as_str() {
        Some(e) => clean(e.strip_prefix("error: ").unwrap_or(e)),
        None => "(the answer gave no reason)".into(),
    };
    format!("reload refused, the running configuration stays: {error}")
}

/// What a refusal prints: `refused by <policy>: <reason>`, and when to retry.
pub fn refusal(v: &Value) -> String {
    let reason = match v["reason"].as_str() {
        Some(r) => clean(r),
        None => "(the answer gave no reason)".into(),
    };
    let mut s = String::from("refused");
    // The policy, unless the reason starts with it (`last_backend: this would ...`).
    if let Some(p) = v["policy"].as_str() {
        if !reason.starts_with(&format!("{p}:")) {
            s.push_str(&format!(" by the {} policy", clean(p)));
        }
    }
    s.push_str(": ");
    s.push_str(&reason);
    if let Some(secs) = v["retry_after_seconds"].as_i64() {
        s.push_str(&format!(" (retry after {secs} s)"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn relative_times() {
        let now = 1_000_000;
        assert_eq!(relative(None, now), "-");
        assert_eq!(relative(Some(now - 1), now), "expired");
        assert_eq!(relative(Some(now + 1), now), "in 1s");
        assert_eq!(relative(Some(now + 600_000), now), "in 10m00s");
        assert_eq!(relative(Some(now + 599_000), now), "in 9m59s");
        assert_eq!(relative(Some(now + 599_001), now), "in 10m00s");
        assert_eq!(relative(Some(now + 7_500_000), now), "in 2h05m");
        assert_eq!(
            relative(Some(now + 3 * 86_400_000 + 4 * 3_600_000), now),
            "in 3d04h"
        );
    }

    #[test]
    fn a_check_says_when_the_fleet_decided() {
        let c = json!({"result": "status 503", "duration_ms": 2, "progress": "0/2"});
        assert_eq!(check(&c), "status 503 in 2ms, 0/2");
        let mut f = c.clone();
        f["source"] = json!("fleet");
        f["probing"] = json!(false);
        assert_eq!(check(&f), "status 503 in 2ms, 0/2, fleet");
        f["probing"] = json!(true);
        assert_eq!(check(&f), "status 503 in 2ms, 0/2, fleet+probing");
        f["source"] = json!("local");
        assert_eq!(check(&f), "status 503 in 2ms, 0/2");
    }

    #[test]
    fn backends_table() {
        let now = 1_000_000;
        let list = vec![
            json!({"upstream": "app", "address": "10.0.0.5:8080", "state": "draining",
                   "weight": 1, "source": "manual", "by": "deployer", "reason": "deploy v2",
                   "until": now + 600_000, "force": true}),
            json!({"upstream": "app", "address": "10.0.0.6:8080", "state": "up",
                   "weight": 3, "source": null, "by": null, "reason": null, "until": null,
                   "force": false}),
        ];
        assert_eq!(
            backends(&list, now),
            "UPSTREAM  ADDRESS        STATE     WEIGHT  SOURCE           BY        REASON     UNTIL\n\
             app       10.0.0.5:8080  draining  1       manual (forced)  deployer  deploy v2  in 10m00s\n\
             app       10.0.0.6:8080  up        3       -                -         -          -\n"
        );
    }

    #[test]
    fn answers_cannot_write_terminal_escapes() {
        let list = vec![json!({"upstream": "a", "address": "b", "state": "up",
                               "reason": "x\u{1b}[2Jy\nz"})];
        let t = backends(&list, 0);
        assert!(!t.contains('\u{1b}') && t.lines().count() == 2, "{t:?}");
        let r = refusal(&json!({"reason": "no\u{1b}]0;t\u{7}", "policy": "fraction"}));
        assert!(!r.chars().any(char::is_control), "{r:?}");
    }

    #[test]
    fn refusals_name_the_policy_and_the_retry() {
        assert_eq!(
            refusal(&json!({"granted": false, "policy": "grace_period",
                            "reason": "the group's last claim started 3 s ago",
                            "retry_after_seconds": 27})),
            "refused by the grace_period policy: the group's last claim started 3 s ago \
             (retry after 27 s)"
        );
        assert_eq!(refusal(&json!({})), "refused: (the answer gave no reason)");
        assert_eq!(
            refusal(&json!({"policy": "last_backend", "reason": "last_backend: no"})),
            "refused: last_backend: no"
        );
    }

    #[test]
    fn claims_and_feasibility() {
        let now = 0;
        let cmd = CtlCommand::Claims;
        assert_eq!(done_at(&cmd, &json!([]), now), "no active claims\n");
        let t = done_at(
            &cmd,
            &json!([{"id": "c1", "upstream": "app", "backend": "h:1", "by": "ci",
                     "reason": "deploy", "expires_at": 61_000, "emergency": true}]),
            now,
        );
        assert!(
            t.contains("c1  ") && t.contains("[emergency] deploy") && t.contains("in 1m01s"),
            "{t}"
        );
        let cmd = CtlCommand::Feasible {
            upstream: "app".into(),
        };
        let t = done_at(
            &cmd,
            &json!({"upstream": "app", "as_of": 1, "backends": [
                {"address": "h:1", "granted": true},
                {"address": "h:2", "granted": false, "dry_run": true, "policy": "fraction",
                 "reason": "over", "retry_after_seconds": 5}]}),
            now,
        );
        assert!(
            t.lines()
                .nth(1)
                .is_some_and(|l| l.starts_with("h:1") && l.contains("granted")),
            "{t}"
        );
        assert!(
            t.lines()
                .nth(2)
                .is_some_and(|l| l.contains("refused  fraction  5s")),
            "{t}"
        );
        // an unexpected shape is shown as it came
        assert!(done_at(&cmd, &json!({"x": 1}), now).contains("\"x\": 1"));
        let cmd = CtlCommand::Claim {
            upstream: "app".into(),
            address: "h:1".into(),
            seconds: 600,
            reason: "r".into(),
            dry_run: false,
            emergency: false,
        };
        let t = done_at(&cmd, &json!({"id": "c9", "expires_at": 600_000}), now);
        assert!(
            t.starts_with("claim c9 granted: app h:1") && t.contains("in 10m00s"),
            "{t}"
        );
    }
}
