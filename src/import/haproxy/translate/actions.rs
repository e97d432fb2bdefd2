//! A rule's action: `use_backend`, `deny`, `redirect`, or a header change.

use crate::import::haproxy::parse::split_condition;
use crate::import::haproxy::parse::Directive;
use crate::import::haproxy::routes::Action;
use crate::import::haproxy::routes::Mods;

/// The action of a rule (`None`: a header rule), by its verb.
pub(super) fn action_of(d: &Directive, head: &[String]) -> Result<Option<Action>, String> {
    let kw = d.kw();
    if kw == "use_backend" {
        return match head.get(1) {
            Some(b) if !b.contains('%') => Ok(Some(Action::Proxy(b.clone()))),
            _ => Err("a dynamic backend name is not translated".into()),
        };
    }
    let (verb, rest) = if kw == "redirect" {
        ("redirect", &head[1..])
    } else {
        (
            head.get(1).map(String::as_str).unwrap_or(""),
            head.get(2..).unwrap_or(&[]),
        )
    };
    if kw == "http-response" {
        return match verb {
            "set-header" | "add-header" | "del-header" => Ok(None),
            _ => Err(format!("'http-response {verb}' is not translated")),
        };
    }
    match verb {
        "deny" => deny(rest).map(Some),
        "redirect" => redirect(rest).map(Some),
        "set-header" | "add-header" | "del-header" => Ok(None),
        "return" => {
            let status = rest
                .windows(2)
                .find(|w| w[0] == "status")
                .and_then(|w| w[1].parse::<u16>().ok())
                .unwrap_or(200);
            Err(format!(
                "'http-request return' (status {status}) with a body of its own is not translated"
            ))
        }
        v => Err(format!("'{kw} {v}' is not translated")),
    }
}

/// `deny [deny_status STATUS]`.
fn deny(rest: &[String]) -> Result<Action, String> {
    let mut status = 403;
    let mut i = 0;
    while i < rest.len() {
        match rest[i].as_str() {
            "deny_status" => {
                status = rest
                    .get(i + 1)
                    .and_then(|s| s.parse().ok())
                    .ok_or("deny_status needs a status")?;
                i += 2;
            }
            o => return Err(format!("'{o}' after deny is not translated")),
        }
    }
    if !(400..=599).contains(&status) {
        return Err(format!("deny_status {status} is not 400 to 599"));
    }
    Ok(Action::Deny(status))
}

/// `redirect location|prefix|scheme TARGET [code STATUS]`.
fn redirect(rest: &[String]) -> Result<Action, String> {
    let (how, target) = (
        rest.first().map(String::as_str).unwrap_or(""),
        rest.get(1).map(String::as_str).unwrap_or(""),
    );
    let mut status = 302;
    let mut i = 2;
    while i < rest.len() {
        match rest[i].as_str() {
            "code" => {
                status = rest
                    .get(i + 1)
                    .and_then(|s| s.parse().ok())
                    .ok_or("code needs a status")?;
                i += 2;
            }
            o => return Err(format!("redirect option '{o}' is not translated")),
        }
    }
    if ![301, 302, 303, 307, 308].contains(&status) {
        return Err(format!("redirect code {status}"));
    }
    let location = redirect_location(how, target)?;
    if location.is_empty() {
        return Err("an empty redirect target".into());
    }
    Ok(Action::Redirect { status, location })
}

/// A redirect's target as a portcullis location template (`{host}`, `{path_and_query}`).
fn redirect_location(how: &str, target: &str) -> Result<String, String> {
    Ok(match how {
        "location" => {
            if target.contains("%[") {
                match target {
                    "https://%[hdr(host)]%[capture.req.uri]"
                    | "https://%[req.hdr(host)]%[capture.req.uri]" => {
                        "https://{host}{path_and_query}".to_string()
                    }
                    _ => return Err("a location with sample expressions is not translated".into()),
                }
            } else {
                target.replace('{', "%7B").replace('}', "%7D")
            }
        }
        "prefix" => {
            if target.contains("%[") {
                return Err("a prefix with sample expressions is not translated".into());
            }
            format!("{}{{path_and_query}}", target.trim_end_matches('/'))
        }
        "scheme" => format!("{target}://{{host}}{{path_and_query}}"),
        _ => return Err(format!("'redirect {how}' is not translated")),
    })
}

/// A header rule's changes, and whether it has a condition.
pub(super) fn header_rule(d: &Directive) -> Result<(Mods, Option<()>), String> {
    let (head, cond) = split_condition(&d.args)?;
    let resp = d.kw() == "http-response";
    let name = head.get(2).cloned().unwrap_or_default();
    if name.is_empty() {
        return Err("a header rule needs a header name".into());
    }
    if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Err(format!("'{name}' is not a header name"));
    }
    let mut m = Mods::default();
    match head.get(1).map(String::as_str) {
        Some(v @ ("set-header" | "add-header")) => {
            let value = head.get(3).cloned().unwrap_or_default();
            if value.contains("%[")
                || value.contains("%{")
                || value.contains("%c")
                || value.contains("%t")
            {
                return Err("a value with log-format expressions is not translated".into());
            }
            if head.len() > 4 {
                return Err("a header value of several words: quote it".into());
            }
            let pair = (name.to_ascii_lowercase(), value);
            match (v, resp) {
                ("set-header", false) => m.req_set.push(pair),
                ("set-header", true) => m.resp_set.push(pair),
                (_, false) => m.req_add.push(pair),
                (_, true) => m.resp_add.push(pair),
            }
        }
        Some("del-header") => {
            if head.len() > 3 {
                return Err("del-header with a match method is not translated".into());
            }
            if resp {
                m.resp_del.push(name.to_ascii_lowercase())
            } else {
                m.req_del.push(name.to_ascii_lowercase())
            }
        }
        _ => return Err("not a header rule".into()),
    }
    Ok((m, cond.map(|_| ())))
}
