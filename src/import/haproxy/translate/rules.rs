//! A frontend's `http-request` and `http-response` rules (with their ACL conditions) as
//! routes and header changes, and its rate-limit rules (`track-sc`, `deny if sc…`).

use std::collections::BTreeSet;

use super::{dir_name, time_ms, Cx, Settings};
use crate::import::haproxy::acl::cubes;
use crate::import::haproxy::acl::Acls;
use crate::import::haproxy::acl::Cubes;
use crate::import::haproxy::parse::split_condition;
use crate::import::haproxy::parse::Directive;
use crate::import::haproxy::parse::Kind;
use crate::import::haproxy::parse::Section;
use crate::import::haproxy::report::Status;
use crate::import::haproxy::routes;
use crate::import::haproxy::routes::Action;
use crate::import::haproxy::routes::Entry;
use crate::import::haproxy::routes::Mods;
use crate::import::haproxy::routes::Region;
use Status::{Approximated as Approx, Translated as Ok_, Unsupported as Unsup};

impl Cx<'_> {
    /// The frontend's request rules, `use_backend`s and `default_backend`, as entries.
    pub(super) fn rules(&mut self, s: &Section, st: &Settings, acls: &Acls) {
        let mut entries: Vec<Entry> = Vec::new();
        let mut mods: Vec<(Vec<Region>, Mods, usize)> = Vec::new();
        let mut tracked: Option<(usize, String)> = None;
        let mut table: Option<(u64, usize)> = None;
        for d in s.directives.iter().filter(|d| d.kw() == "stick-table") {
            let period = d
                .args
                .iter()
                .find_map(|a| {
                    a.strip_prefix("http_req_rate(")
                        .and_then(|x| x.strip_suffix(')'))
                })
                .and_then(time_ms);
            match (d.arg(2), period) {
                ("ip" | "ipv6", Some(p)) => {
                    table = Some((p, d.line));
                    self.rep.put(d.line, "stick-table", Ok_);
                }
                _ => self.rep.put(d.line, "stick-table", Unsup(
                    "only a table of client addresses storing http_req_rate(PERIOD) is translated (a rate-limit policy)".into(),
                )),
            }
        }
        // http-request rules first (in order), then use_backend (in order)
        let ordered: Vec<&Directive> = s
            .directives
            .iter()
            .filter(|d| matches!(d.kw(), "http-request" | "redirect" | "http-response"))
            .chain(s.directives.iter().filter(|d| d.kw() == "use_backend"))
            .collect();
        for d in ordered {
            let name = dir_name(d);
            let (head, cond) = match split_condition(&d.args) {
                Ok(x) => x,
                Err(e) => {
                    self.rep.put(d.line, &name, Unsup(e));
                    continue;
                }
            };
            let c = match &cond {
                None => Ok(Cubes {
                    cubes: vec![(Region::any(), Vec::new())],
                    ..Cubes::default()
                }),
                Some(c) => cubes(c, acls),
            };
            let c = match c {
                Ok(c) => c,
                Err(e) => {
                    self.rep.put(d.line, &name, Unsup(e));
                    continue;
                }
            };
            let unless = cond.as_ref().is_some_and(|c| c.unless);
            let mut notes = c.approx.clone();
            // track-sc0 and the rate-limit deny
            if d.kw() == "http-request" && d.arg(1) == "track-sc0" {
                // the requests counted: all, or those under one path prefix
                let one_prefix = match c.cubes.as_slice() {
                    [(r, negs)]
                        if negs.is_empty()
                            && !unless
                            && r.host.is_none()
                            && r.methods.is_none()
                            && r.cidrs.is_none() =>
                    {
                        Some(r.prefix.clone())
                    }
                    _ => None,
                };
                match (d.arg(2), one_prefix) {
                    ("src", Some(prefix)) if head.len() == 3 => {
                        tracked = Some((d.line, prefix));
                        self.rep.put(d.line, &name, Ok_);
                    }
                    _ => self.rep.put(d.line, &name, Unsup(
                        "only 'track-sc0 src', unconditional or on a path prefix, is translated".into(),
                    )),
                }
                continue;
            }
            if let Some(limit) = c.rate {
                let status =
                    self.rate_rule(d, &head, &c, unless, limit, tracked.clone(), table, &s.name);
                self.rep.put(d.line, &name, status);
                continue;
            }
            let action = match action_of(d, &head) {
                Ok(Some(a)) => a,
                Ok(None) => {
                    // a header rule
                    match header_rule(d) {
                        Ok((m, _)) => {
                            if unless || c.cubes.iter().any(|(_, n)| !n.is_empty()) {
                                self.rep.put(
                                    d.line,
                                    &name,
                                    Unsup(
                                        "a negated condition on a header rule is not translated"
                                            .into(),
                                    ),
                                );
                                continue;
                            }
                            mods.push((
                                c.cubes.iter().map(|(p, _)| p.clone()).collect(),
                                m,
                                d.line,
                            ));
                            let st = if notes.is_empty() {
                                Ok_
                            } else {
                                Approx(notes.join("; "))
                            };
                            self.rep.put(d.line, &name, st);
                        }
                        Err(e) => self.rep.put(d.line, &name, Unsup(e)),
                    }
                    continue;
                }
                Err(e) => {
                    self.rep.put(d.line, &name, Unsup(e));
                    continue;
                }
            };
            let action = match action {
                Action::Proxy(b) if !self.upstream_exists(&b) => {
                    if self
                        .cfg
                        .sections
                        .iter()
                        .any(|x| x.name == b && matches!(x.kind, Kind::Backend | Kind::Listen))
                    {
                        notes.push(format!("backend '{b}' has no usable server: 503"));
                        Action::Deny(503)
                    } else {
                        self.rep
                            .put(d.line, &name, Unsup(format!("no backend named '{b}'")));
                        continue;
                    }
                }
                a => a,
            };
            if unless {
                if c.cubes.iter().any(|(_, n)| !n.is_empty()) {
                    self.rep.put(
                        d.line,
                        &name,
                        Unsup("'unless' with a negated term is not translated".into()),
                    );
                    continue;
                }
                for (p, _) in &c.cubes {
                    entries.push(Entry::new(p.clone(), Action::Fallthrough, d.line));
                }
                entries.push(Entry::new(Region::any(), action, d.line));
            } else {
                for (p, negs) in &c.cubes {
                    for n in negs {
                        if let Some(x) = p.intersect(n) {
                            entries.push(Entry::new(x, Action::Fallthrough, d.line));
                        }
                    }
                    entries.push(Entry::new(p.clone(), action.clone(), d.line));
                }
            }
            let status = if notes.is_empty() {
                Ok_
            } else {
                Approx(notes.join("; "))
            };
            self.rep.put(d.line, &name, status);
        }
        // default_backend (or 503, as HAProxy answers without one)
        let fallback = match &st.default_backend {
            Some((b, line)) if self.upstream_exists(b) => {
                self.rep.put(*line, "default_backend", Ok_);
                Entry::new(Region::any(), Action::Proxy(b.clone()), *line)
            }
            Some((b, line)) => {
                let known = self
                    .cfg
                    .sections
                    .iter()
                    .any(|x| x.name == *b && matches!(x.kind, Kind::Backend | Kind::Listen));
                self.rep.put(
                    *line,
                    "default_backend",
                    if known {
                        Approx(format!("backend '{b}' has no usable server: 503"))
                    } else {
                        Unsup(format!("no backend named '{b}': 503"))
                    },
                );
                Entry::new(Region::any(), Action::Deny(503), *line)
            }
            None if s.kind == Kind::Listen && self.upstream_exists(&s.name) => {
                Entry::new(Region::any(), Action::Proxy(s.name.clone()), s.line)
            }
            None => Entry::new(Region::any(), Action::Deny(503), s.line),
        };
        let fallback_rule = fallback.rule;
        entries.push(fallback);
        // backend-level header rules go with the routes to their upstream
        let result = routes::resolve_fallthrough(entries).and_then(|mut e| {
            for (cubes, m, line) in &mods {
                e = routes::apply_mods(e, cubes, m, *line)?;
            }
            for en in e.iter_mut() {
                if let Action::Proxy(up) = &en.action {
                    if let Some(u) = self.out.upstreams.iter().find(|u| u.name == *up) {
                        let mut m = en.mods.clone();
                        let mut base = u.mods.clone();
                        base.then(&m);
                        m = base;
                        en.mods = m;
                    }
                }
            }
            Ok(e)
        });
        match result {
            Ok(e) => self.out.frontends.push((e, fallback_rule)),
            Err(routes::TooMany) => self.rep.put(
                s.line,
                &s.keyword,
                Unsup("its rules need more routes than the importer writes".into()),
            ),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn rate_rule(
        &mut self,
        d: &Directive,
        head: &[String],
        c: &Cubes,
        unless: bool,
        limit: u64,
        tracked: Option<(usize, String)>,
        table: Option<(u64, usize)>,
        frontend: &str,
    ) -> Status {
        if d.kw() != "http-request" || d.arg(1) != "deny" || unless {
            return Unsup("a request rate is translated in 'http-request deny if { sc_http_req_rate(0) gt N }' only".into());
        }
        let (Some((track_line, track_prefix)), Some((period, table_line))) = (tracked, table)
        else {
            return Unsup("the rate needs 'http-request track-sc0 src' and a 'stick-table ... store http_req_rate(PERIOD)' in the frontend".into());
        };
        let mut notes = c.approx.clone();
        let mut prefix = "/".to_string();
        if c.cubes.len() != 1 {
            notes.push("the rate limit applies to every request".into());
        } else if let Some((r, negs)) = c.cubes.first() {
            prefix = r.prefix.clone();
            if r.host.is_some() || r.methods.is_some() || r.cidrs.is_some() || !negs.is_empty() {
                notes.push("only the path prefix of the condition is kept".into());
            }
        }
        // HAProxy counts every tracked request, and denies those the deny's condition
        // matches; portcullis counts and refuses the requests under one prefix.
        if prefix != track_prefix {
            notes.push(format!(
                "portcullis counts the requests under {prefix} only; HAProxy counts every tracked request (under {track_prefix})"
            ));
        }
        notes.push("a refused request does not count against the limit (HAProxy's http_req_rate counts it)".into());
        let status = head
            .windows(2)
            .find(|w| w[0] == "deny_status")
            .and_then(|w| w[1].parse::<u16>().ok())
            .unwrap_or(403);
        if status != 429 {
            notes.push(format!(
                "portcullis answers 429 with Retry-After, not {status}"
            ));
        }
        let window = period.div_ceil(1000).max(1);
        if period % 1000 != 0 {
            notes.push(format!(
                "the {period} ms period is rounded up to {window} s"
            ));
        }
        let name = format!("{frontend}-{}", self.out.policies.len() + 1);
        self.out.policies.push((
            name,
            limit.max(1),
            window,
            prefix,
            BTreeSet::from([d.line, track_line, table_line]),
        ));
        if notes.is_empty() {
            Ok_
        } else {
            Approx(notes.join("; "))
        }
    }
}

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
        "deny" => {
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
            Ok(Some(Action::Deny(status)))
        }
        "redirect" => {
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
            let location = match how {
                "location" => {
                    if target.contains("%[") {
                        match target {
                            "https://%[hdr(host)]%[capture.req.uri]"
                            | "https://%[req.hdr(host)]%[capture.req.uri]" => {
                                "https://{host}{path_and_query}".to_string()
                            }
                            _ => {
                                return Err(
                                    "a location with sample expressions is not translated".into()
                                )
                            }
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
            };
            if location.is_empty() {
                return Err("an empty redirect target".into());
            }
            Ok(Some(Action::Redirect { status, location }))
        }
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
