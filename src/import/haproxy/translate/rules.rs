//! A frontend's `http-request` and `http-response` rules (with their ACL conditions) as
//! routes and header changes, and its rate-limit rules (`track-sc`, `deny if sc…`).

use std::collections::BTreeSet;

use super::actions::{action_of, header_rule};
use super::{dir_name, time_ms, verdict, Cx, Settings};
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

/// What a frontend's rules build up, in their order.
#[derive(Debug, Default)]
struct FrontendRules {
    entries: Vec<Entry>,
    /// The header rules: the regions they apply to, their changes, their line.
    mods: Vec<(Vec<Region>, Mods, usize)>,
    /// `track-sc0 src`: its line and the path prefix of the requests it counts.
    tracked: Option<(usize, String)>,
    /// The stick-table of client addresses: its period (ms) and line.
    table: Option<(u64, usize)>,
}

impl Cx<'_> {
    /// The frontend's request rules, `use_backend`s and `default_backend`, as entries.
    pub(super) fn rules(&mut self, s: &Section, st: &Settings, acls: &Acls) {
        let mut built = FrontendRules {
            table: self.stick_table(s),
            ..FrontendRules::default()
        };
        // http-request rules first (in order), then use_backend (in order)
        let ordered = s
            .directives
            .iter()
            .filter(|d| matches!(d.kw(), "http-request" | "redirect" | "http-response"))
            .chain(s.directives.iter().filter(|d| d.kw() == "use_backend"));
        for d in ordered {
            self.rule(d, &s.name, acls, &mut built);
        }
        let fallback = self.fallback(s, st);
        let fallback_rule = fallback.rule;
        built.entries.push(fallback);
        match self.resolve(built.entries, &built.mods) {
            Ok(e) => self.out.frontends.push((e, fallback_rule)),
            Err(routes::TooMany) => self.rep.put(
                s.line,
                &s.keyword,
                Unsup("its rules need more routes than the importer writes".into()),
            ),
        }
    }

    /// The frontend's stick-table, when it is one a rate-limit policy translates: its
    /// period (ms) and line.
    fn stick_table(&mut self, s: &Section) -> Option<(u64, usize)> {
        let mut table = None;
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
        table
    }

    /// One rule (`http-request`, `redirect`, `http-response` or `use_backend`) with its
    /// condition: a tracking, a rate limit, a header change or entries.
    fn rule(&mut self, d: &Directive, frontend: &str, acls: &Acls, built: &mut FrontendRules) {
        let name = dir_name(d);
        let (head, c, unless) = match condition(d, acls) {
            Ok(x) => x,
            Err(e) => {
                self.rep.put(d.line, &name, Unsup(e));
                return;
            }
        };
        if d.kw() == "http-request" && d.arg(1) == "track-sc0" {
            self.track(d, &name, &head, &c, unless, built);
            return;
        }
        if let Some(limit) = c.rate {
            let status = self.rate_rule(
                d,
                &head,
                &c,
                unless,
                limit,
                built.tracked.clone(),
                built.table,
                frontend,
            );
            self.rep.put(d.line, &name, status);
            return;
        }
        let mut notes = c.approx.clone();
        let action = match action_of(d, &head) {
            Ok(Some(a)) => a,
            Ok(None) => {
                self.header_change(d, &name, &c, unless, &notes, built);
                return;
            }
            Err(e) => {
                self.rep.put(d.line, &name, Unsup(e));
                return;
            }
        };
        let action = match action {
            Action::Proxy(b) if !self.upstream_exists(&b) => {
                if self.backend_declared(&b) {
                    notes.push(format!("backend '{b}' has no usable server: 503"));
                    Action::Deny(503)
                } else {
                    self.rep
                        .put(d.line, &name, Unsup(format!("no backend named '{b}'")));
                    return;
                }
            }
            a => a,
        };
        match push_entries(&mut built.entries, &c, unless, action, d.line) {
            Ok(()) => self.rep.put(d.line, &name, verdict(&notes)),
            Err(why) => self.rep.put(d.line, &name, Unsup(why.into())),
        }
    }

    /// `http-request track-sc0 src`: the requests a rate limit counts, all of them or those
    /// under one path prefix.
    fn track(
        &mut self,
        d: &Directive,
        name: &str,
        head: &[String],
        c: &Cubes,
        unless: bool,
        built: &mut FrontendRules,
    ) {
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
                built.tracked = Some((d.line, prefix));
                self.rep.put(d.line, name, Ok_);
            }
            _ => self.rep.put(
                d.line,
                name,
                Unsup(
                    "only 'track-sc0 src', unconditional or on a path prefix, is translated".into(),
                ),
            ),
        }
    }

    /// A header rule of the frontend: its changes, on the regions of its condition.
    fn header_change(
        &mut self,
        d: &Directive,
        name: &str,
        c: &Cubes,
        unless: bool,
        notes: &[String],
        built: &mut FrontendRules,
    ) {
        match header_rule(d) {
            Ok((m, _)) => {
                if unless || c.cubes.iter().any(|(_, n)| !n.is_empty()) {
                    self.rep.put(
                        d.line,
                        name,
                        Unsup("a negated condition on a header rule is not translated".into()),
                    );
                    return;
                }
                built
                    .mods
                    .push((c.cubes.iter().map(|(p, _)| p.clone()).collect(), m, d.line));
                self.rep.put(d.line, name, verdict(notes));
            }
            Err(e) => self.rep.put(d.line, name, Unsup(e)),
        }
    }

    /// Whether the configuration has a backend (or listen) of this name, usable or not.
    fn backend_declared(&self, name: &str) -> bool {
        self.cfg
            .sections
            .iter()
            .any(|x| x.name == name && matches!(x.kind, Kind::Backend | Kind::Listen))
    }

    /// The frontend's last entry: its `default_backend`, or 503 as HAProxy answers
    /// without one (a `listen` with servers proxies to itself).
    fn fallback(&mut self, s: &Section, st: &Settings) -> Entry {
        match &st.default_backend {
            Some((b, line)) if self.upstream_exists(b) => {
                self.rep.put(*line, "default_backend", Ok_);
                Entry::new(Region::any(), Action::Proxy(b.clone()), *line)
            }
            Some((b, line)) => {
                let known = self.backend_declared(b);
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
        }
    }

    /// The entries as routes: first match resolved, the frontend's header rules applied,
    /// and each upstream's own header rules put before the route's.
    fn resolve(
        &self,
        entries: Vec<Entry>,
        mods: &[(Vec<Region>, Mods, usize)],
    ) -> Result<Vec<Entry>, routes::TooMany> {
        let mut e = routes::resolve_fallthrough(entries)?;
        for (cubes, m, line) in mods {
            e = routes::apply_mods(e, cubes, m, *line)?;
        }
        for en in e.iter_mut() {
            if let Action::Proxy(up) = &en.action {
                if let Some(u) = self.out.upstreams.iter().find(|u| u.name == *up) {
                    let mut base = u.mods.clone();
                    base.then(&en.mods);
                    en.mods = base;
                }
            }
        }
        Ok(e)
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
        verdict(&notes)
    }
}

/// A rule's words before its condition, the condition as cubes (every request without
/// one), and whether it is an `unless`.
fn condition(d: &Directive, acls: &Acls) -> Result<(Vec<String>, Cubes, bool), String> {
    let (head, cond) = split_condition(&d.args)?;
    let c = match &cond {
        None => Cubes {
            cubes: vec![(Region::any(), Vec::new())],
            ..Cubes::default()
        },
        Some(c) => cubes(c, acls)?,
    };
    let unless = cond.as_ref().is_some_and(|c| c.unless);
    Ok((head, c, unless))
}

/// The entries of a rule's action on the regions of its condition: the regions its
/// negated terms exclude fall through first (with `unless`, the condition's regions fall
/// through and the action takes the rest).
fn push_entries(
    entries: &mut Vec<Entry>,
    c: &Cubes,
    unless: bool,
    action: Action,
    line: usize,
) -> Result<(), &'static str> {
    if unless {
        if c.cubes.iter().any(|(_, n)| !n.is_empty()) {
            return Err("'unless' with a negated term is not translated");
        }
        for (p, _) in &c.cubes {
            entries.push(Entry::new(p.clone(), Action::Fallthrough, line));
        }
        entries.push(Entry::new(Region::any(), action, line));
    } else {
        for (p, negs) in &c.cubes {
            for n in negs {
                if let Some(x) = p.intersect(n) {
                    entries.push(Entry::new(x, Action::Fallthrough, line));
                }
            }
            entries.push(Entry::new(p.clone(), action.clone(), line));
        }
    }
    Ok(())
}
