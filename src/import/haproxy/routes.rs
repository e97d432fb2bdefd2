//! From HAProxy's ordered rules to portcullis's route table.
//!
//! HAProxy evaluates a frontend's `http-request` rules in order, then its `use_backend`
//! rules in order, then `default_backend`: the first match wins. portcullis picks, among
//! the routes matching a request, the one with the longest `path_prefix`, then a
//! host-specific one before an any-host one, then the one with more of `methods` /
//! `client_cidrs` set, then the first in the file. This module turns the first into the
//! second without changing any request's outcome:
//!
//! 1. each rule is a list of [`Entry`]s (a region of requests and what happens to them),
//!    in HAProxy's order; a negated condition (`!acl`, `unless`) becomes a
//!    [`Action::Fallthrough`] entry for the excluded region before the rule's own entry,
//!    and a fall-through region is then covered by the later rules' entries restricted
//!    to it ([`resolve_fallthrough`]);
//! 2. header rules with a condition split the entries they partly cover ([`apply_mods`]);
//! 3. where a later entry would win in portcullis over an earlier one it overlaps, the
//!    earlier one's restriction to the overlap is placed before it ([`order`]), so the
//!    earlier rule still wins there.

use std::collections::BTreeSet;

use ipnet::IpNet;

/// Most entries a translation may produce (bounds the work on any input).
pub const MAX_ENTRIES: usize = 256;
/// Most passes of [`order`] (each adds the restrictions the previous one made necessary).
const MAX_PASSES: usize = 32;

/// A set of requests: all of these conditions hold (`None`: any).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Region {
    /// Lower-case host.
    pub host: Option<String>,
    pub prefix: String,
    /// Upper-case methods.
    pub methods: Option<BTreeSet<String>>,
    pub cidrs: Option<Vec<IpNet>>,
}

impl Region {
    /// Every request.
    pub fn any() -> Self {
        Self {
            prefix: "/".into(),
            ..Self::default()
        }
    }

    fn conditions(&self) -> u8 {
        u8::from(self.methods.is_some()) + u8::from(self.cidrs.is_some())
    }

    /// portcullis's order between routes that both match: larger wins.
    fn rank(&self) -> (usize, bool, u8) {
        (self.prefix.len(), self.host.is_some(), self.conditions())
    }

    /// The requests in both; `None` when there are none.
    pub fn intersect(&self, o: &Region) -> Option<Region> {
        let host = match (&self.host, &o.host) {
            (None, h) | (h, None) => h.clone(),
            (Some(a), Some(b)) if a == b => Some(a.clone()),
            _ => return None,
        };
        let prefix = if self.prefix.starts_with(&o.prefix) {
            self.prefix.clone()
        } else if o.prefix.starts_with(&self.prefix) {
            o.prefix.clone()
        } else {
            return None;
        };
        let methods = match (&self.methods, &o.methods) {
            (None, m) | (m, None) => m.clone(),
            (Some(a), Some(b)) => {
                let m: BTreeSet<String> = a.intersection(b).cloned().collect();
                if m.is_empty() {
                    return None;
                }
                Some(m)
            }
        };
        let cidrs = match (&self.cidrs, &o.cidrs) {
            (None, c) | (c, None) => c.clone(),
            (Some(a), Some(b)) => {
                let mut out: Vec<IpNet> = Vec::new();
                for x in a {
                    for y in b {
                        let n = if x.contains(y) {
                            *y
                        } else if y.contains(x) {
                            *x
                        } else {
                            continue;
                        };
                        if !out.contains(&n) {
                            out.push(n);
                        }
                    }
                }
                if out.is_empty() {
                    return None;
                }
                Some(out)
            }
        };
        Some(Region {
            host,
            prefix,
            methods,
            cidrs,
        })
    }

    /// Whether every request of `self` is in `o`.
    pub fn within(&self, o: &Region) -> bool {
        let host = match (&o.host, &self.host) {
            (None, _) => true,
            (Some(a), Some(b)) => a == b,
            (Some(_), None) => false,
        };
        let methods = match (&o.methods, &self.methods) {
            (None, _) => true,
            (Some(a), Some(b)) => b.is_subset(a),
            (Some(_), None) => false,
        };
        let cidrs = match (&o.cidrs, &self.cidrs) {
            (None, _) => true,
            (Some(a), Some(b)) => b.iter().all(|n| a.iter().any(|m| m.contains(n))),
            (Some(_), None) => false,
        };
        host && methods && cidrs && self.prefix.starts_with(&o.prefix)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Forward to this upstream.
    Proxy(String),
    Deny(u16),
    Redirect {
        status: u16,
        location: String,
    },
    /// Not decided by this rule: the later rules decide (resolved away before output).
    Fallthrough,
}

/// Header changes: `set`, `add`, `remove` on the request and on the response.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Mods {
    pub req_set: Vec<(String, String)>,
    pub req_add: Vec<(String, String)>,
    pub req_del: Vec<String>,
    pub resp_set: Vec<(String, String)>,
    pub resp_add: Vec<(String, String)>,
    pub resp_del: Vec<String>,
}

impl Mods {
    pub fn is_empty(&self) -> bool {
        *self == Mods::default()
    }

    /// `self` then `o`, as HAProxy applies rules in order: a later `set` or `del` of a
    /// field replaces what earlier rules did to it.
    pub fn then(&mut self, o: &Mods) {
        fn set(
            sets: &mut Vec<(String, String)>,
            adds: &mut Vec<(String, String)>,
            dels: &mut Vec<String>,
            n: &str,
            v: &str,
        ) {
            sets.retain(|(k, _)| !k.eq_ignore_ascii_case(n));
            adds.retain(|(k, _)| !k.eq_ignore_ascii_case(n));
            dels.retain(|k| !k.eq_ignore_ascii_case(n));
            sets.push((n.to_string(), v.to_string()));
        }
        fn del(
            sets: &mut Vec<(String, String)>,
            adds: &mut Vec<(String, String)>,
            dels: &mut Vec<String>,
            n: &str,
        ) {
            sets.retain(|(k, _)| !k.eq_ignore_ascii_case(n));
            adds.retain(|(k, _)| !k.eq_ignore_ascii_case(n));
            if !dels.iter().any(|k| k.eq_ignore_ascii_case(n)) {
                dels.push(n.to_string());
            }
        }
        for (n, v) in &o.req_set {
            set(
                &mut self.req_set,
                &mut self.req_add,
                &mut self.req_del,
                n,
                v,
            );
        }
        for (n, v) in &o.req_add {
            self.req_add.push((n.clone(), v.clone()));
        }
        for n in &o.req_del {
            del(&mut self.req_set, &mut self.req_add, &mut self.req_del, n);
        }
        for (n, v) in &o.resp_set {
            set(
                &mut self.resp_set,
                &mut self.resp_add,
                &mut self.resp_del,
                n,
                v,
            );
        }
        for (n, v) in &o.resp_add {
            self.resp_add.push((n.clone(), v.clone()));
        }
        for n in &o.resp_del {
            del(
                &mut self.resp_set,
                &mut self.resp_add,
                &mut self.resp_del,
                n,
            );
        }
    }
}

/// Requests of `region` get `action` (and `mods` when proxied); `lines` are the HAProxy
/// lines it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub region: Region,
    pub action: Action,
    pub mods: Mods,
    pub lines: BTreeSet<usize>,
    /// The rule (its line) this entry is part of: a fall-through skips its own rule.
    pub rule: usize,
}

impl Entry {
    pub fn new(region: Region, action: Action, line: usize) -> Self {
        Self {
            region,
            action,
            mods: Mods::default(),
            lines: BTreeSet::from([line]),
            rule: line,
        }
    }

    fn restricted(&self, to: &Region, more_lines: &BTreeSet<usize>) -> Option<Entry> {
        let region = self.region.intersect(to)?;
        let mut lines = self.lines.clone();
        lines.extend(more_lines.iter().copied());
        Some(Entry {
            region,
            action: self.action.clone(),
            mods: self.mods.clone(),
            lines,
            rule: self.rule,
        })
    }
}

/// Too many routes would be needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooMany;

/// Replaces each [`Action::Fallthrough`] entry by the entries of the later rules (not its
/// own rule's) restricted to its region, in order (the last entry should cover every
/// request).
pub fn resolve_fallthrough(entries: Vec<Entry>) -> Result<Vec<Entry>, TooMany> {
    let mut out: Vec<Entry> = Vec::new();
    for e in entries.into_iter().rev() {
        if e.action == Action::Fallthrough {
            let covered: Vec<Entry> = out
                .iter()
                .filter(|later| later.rule != e.rule)
                .filter_map(|later| later.restricted(&e.region, &e.lines))
                .collect();
            let mut merged = covered;
            merged.append(&mut out);
            out = merged;
        } else {
            out.insert(0, e);
        }
        if out.len() > MAX_ENTRIES {
            return Err(TooMany);
        }
    }
    Ok(out)
}

/// Applies header rules `mods` to the proxied requests of the regions `cubes` (any of
/// them), splitting an entry that a cube covers only in part.
pub fn apply_mods(
    entries: Vec<Entry>,
    cubes: &[Region],
    mods: &Mods,
    line: usize,
) -> Result<Vec<Entry>, TooMany> {
    let mut out = Vec::with_capacity(entries.len());
    for mut e in entries {
        if !matches!(e.action, Action::Proxy(_)) {
            out.push(e);
            continue;
        }
        if cubes.iter().any(|c| e.region.within(c)) {
            e.mods.then(mods);
            e.lines.insert(line);
            out.push(e);
            continue;
        }
        for c in cubes {
            if let Some(mut part) = e.restricted(c, &BTreeSet::from([line])) {
                part.mods.then(mods);
                out.push(part);
            }
        }
        out.push(e);
        if out.len() > MAX_ENTRIES {
            return Err(TooMany);
        }
    }
    Ok(out)
}

/// The entries in an order portcullis's route choice keeps HAProxy's first match: where
/// a later entry outranks an earlier one it overlaps, the earlier one restricted to the
/// overlap is added beside the earlier one (until nothing more is added), so the earlier
/// rule still wins there. Entries no request can reach are dropped.
pub fn order(entries: Vec<Entry>) -> Result<Vec<Entry>, TooMany> {
    // (HAProxy priority: the index of the rule's entry, lower wins; the entry)
    if entries.len() > MAX_ENTRIES {
        return Err(TooMany);
    }
    let mut all: Vec<(usize, Entry)> = entries.into_iter().enumerate().collect();
    let mut passes = 0;
    loop {
        passes += 1;
        if passes > MAX_PASSES {
            return Err(TooMany);
        }
        let mut added: Vec<(usize, Entry)> = Vec::new();
        for (a, (pa, ea)) in all.iter().enumerate() {
            for (pb, eb) in all.iter().skip(a + 1) {
                if pb <= pa || eb.region.rank() <= ea.region.rank() {
                    continue;
                }
                let Some(part) = ea.restricted(&eb.region, &BTreeSet::new()) else {
                    continue;
                };
                let known = all.iter().chain(added.iter()).any(|(p, f)| {
                    *p <= *pa
                        && part.region.within(&f.region)
                        && f.region.rank() >= part.region.rank()
                });
                if !known {
                    added.push((*pa, part));
                    if all.len() + added.len() > MAX_ENTRIES {
                        return Err(TooMany);
                    }
                }
            }
        }
        if added.is_empty() {
            break;
        }
        all.extend(added);
        // stable: equal priorities keep the order they were found in
        all.sort_by_key(|(p, _)| *p);
    }
    // Drop what an earlier entry of at least the same rank covers entirely.
    let mut out: Vec<Entry> = Vec::with_capacity(all.len());
    for (_, e) in all {
        if out
            .iter()
            .any(|f| e.region.within(&f.region) && f.region.rank() >= e.region.rank())
        {
            continue;
        }
        out.push(e);
    }
    Ok(out)
}

/// portcullis's choice for a request: the first of the highest-ranked matching entries.
/// (Used by the tests to check [`order`] against HAProxy's first match.)
#[cfg(test)]
pub fn portcullis_pick<'a>(entries: &'a [Entry], probe: &Region) -> Option<&'a Entry> {
    let mut best: Option<&Entry> = None;
    for e in entries {
        if probe.within(&e.region) && best.is_none_or(|b| e.region.rank() > b.region.rank()) {
            best = Some(e);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(host: Option<&str>, prefix: &str, methods: &[&str], cidrs: &[&str]) -> Region {
        Region {
            host: host.map(String::from),
            prefix: prefix.into(),
            methods: (!methods.is_empty()).then(|| methods.iter().map(|m| m.to_string()).collect()),
            cidrs: (!cidrs.is_empty()).then(|| {
                cidrs
                    .iter()
                    .map(|c| c.parse().unwrap_or_else(|_| panic!("{c}")))
                    .collect()
            }),
        }
    }

    fn first_match<'a>(entries: &'a [Entry], probe: &Region) -> Option<&'a Entry> {
        entries.iter().find(|e| probe.within(&e.region))
    }

    fn proxy(u: &str) -> Action {
        Action::Proxy(u.into())
    }

    #[test]
    fn intersections_and_containment() {
        let a = r(None, "/api", &["GET", "POST"], &["10.0.0.0/8"]);
        let b = r(
            Some("x.test"),
            "/",
            &["POST"],
            &["10.1.0.0/16", "192.168.0.0/16"],
        );
        assert_eq!(
            a.intersect(&b),
            Some(r(Some("x.test"), "/api", &["POST"], &["10.1.0.0/16"]))
        );
        assert_eq!(
            r(None, "/a", &[], &[]).intersect(&r(None, "/b", &[], &[])),
            None
        );
        assert_eq!(
            r(Some("a"), "/", &[], &[]).intersect(&r(Some("b"), "/", &[], &[])),
            None
        );
        assert!(r(Some("a"), "/x/y", &["GET"], &[]).within(&r(None, "/x", &[], &[])));
        assert!(!r(None, "/x", &[], &[]).within(&r(None, "/x", &["GET"], &[])));
    }

    /// HAProxy's first match over the rules as written: a matching fall-through entry
    /// skips the rest of its own rule.
    fn haproxy_pick<'a>(rules: &'a [Entry], probe: &Region) -> Option<&'a Entry> {
        let mut skipped = BTreeSet::new();
        for e in rules {
            if skipped.contains(&e.rule) || !probe.within(&e.region) {
                continue;
            }
            if e.action == Action::Fallthrough {
                skipped.insert(e.rule);
                continue;
            }
            return Some(e);
        }
        None
    }

    /// Every probe gets in portcullis (after `resolve_fallthrough` and `order`) what
    /// HAProxy's first match over the rules as written gives.
    fn check_equivalent(rules: Vec<Entry>, probes: &[Region]) {
        let resolved = resolve_fallthrough(rules.clone()).unwrap_or_else(|_| panic!("too many"));
        assert!(resolved.iter().all(|e| e.action != Action::Fallthrough));
        for p in probes {
            assert_eq!(
                first_match(&resolved, p).map(|e| &e.action),
                haproxy_pick(&rules, p).map(|e| &e.action),
                "resolved, probe {p:?}"
            );
        }
        let routes = order(resolved).unwrap_or_else(|_| panic!("too many"));
        for p in probes {
            let want = haproxy_pick(&rules, p).map(|e| &e.action);
            let got = portcullis_pick(&routes, p).map(|e| &e.action);
            assert_eq!(got, want, "probe {p:?}\nroutes {routes:#?}");
        }
    }

    fn probes() -> Vec<Region> {
        let mut v = Vec::new();
        for host in [None, Some("a.test"), Some("b.test")] {
            for path in ["/", "/api", "/api/v2/x", "/admin", "/static/x"] {
                for m in ["GET", "POST"] {
                    for ip in ["10.1.2.3/32", "192.168.1.1/32"] {
                        v.push(r(host, path, &[m], &[ip]));
                    }
                }
            }
        }
        v
    }

    #[test]
    fn an_earlier_broad_deny_still_wins_over_a_longer_prefix() {
        // http-request deny if { src 10.0.0.0/8 }
        // use_backend api if { path_beg /api }
        // default_backend web
        let rules = vec![
            Entry::new(r(None, "/", &[], &["10.0.0.0/8"]), Action::Deny(403), 1),
            Entry::new(r(None, "/api", &[], &[]), proxy("api"), 2),
            Entry::new(Region::any(), proxy("web"), 3),
        ];
        check_equivalent(rules, &probes());
    }

    #[test]
    fn negations_fall_through_to_later_rules() {
        // http-request deny if { path_beg /admin } !{ src 10.0.0.0/8 }
        // use_backend api if { hdr(host) -i a.test } !{ method POST }
        // default_backend web
        let rules = vec![
            Entry::new(
                r(None, "/admin", &[], &["10.0.0.0/8"]),
                Action::Fallthrough,
                1,
            ),
            Entry::new(r(None, "/admin", &[], &[]), Action::Deny(403), 1),
            Entry::new(
                r(Some("a.test"), "/", &["POST"], &[]),
                Action::Fallthrough,
                2,
            ),
            Entry::new(r(Some("a.test"), "/", &[], &[]), proxy("api"), 2),
            Entry::new(Region::any(), proxy("web"), 3),
        ];
        check_equivalent(rules, &probes());
    }

    #[test]
    fn host_and_method_rules_in_any_order() {
        let rules = vec![
            Entry::new(
                r(None, "/", &["POST"], &[]),
                Action::Redirect {
                    status: 302,
                    location: "/x".into(),
                },
                1,
            ),
            Entry::new(r(Some("b.test"), "/static", &[], &[]), proxy("static"), 2),
            Entry::new(r(None, "/api/v2", &[], &["192.168.0.0/16"]), proxy("v2"), 3),
            Entry::new(r(Some("a.test"), "/", &[], &[]), proxy("a"), 4),
            Entry::new(r(None, "/api", &[], &[]), proxy("api"), 5),
            Entry::new(Region::any(), proxy("web"), 6),
        ];
        check_equivalent(rules, &probes());
    }

    #[test]
    fn conditional_header_rules_split_entries() {
        let entries = vec![
            Entry::new(r(None, "/api", &[], &[]), proxy("api"), 2),
            Entry::new(Region::any(), proxy("web"), 3),
        ];
        let mods = Mods {
            req_set: vec![("x-v2".into(), "1".into())],
            ..Mods::default()
        };
        let out = apply_mods(entries, &[r(None, "/api/v2", &[], &[])], &mods, 9)
            .unwrap_or_else(|_| panic!("too many"));
        let routes = order(out).unwrap_or_else(|_| panic!("too many"));
        let v2 = portcullis_pick(&routes, &r(None, "/api/v2/x", &["GET"], &[]));
        assert_eq!(v2.map(|e| &e.action), Some(&proxy("api")));
        assert_eq!(v2.map(|e| e.mods.req_set.len()), Some(1));
        let web = portcullis_pick(&routes, &r(None, "/a", &["GET"], &[]));
        assert_eq!(web.map(|e| e.mods.is_empty()), Some(true));
    }

    #[test]
    fn later_set_or_del_replaces_earlier_rules() {
        let mut m = Mods {
            req_set: vec![("X-A".into(), "1".into())],
            req_add: vec![("X-B".into(), "1".into())],
            ..Mods::default()
        };
        m.then(&Mods {
            req_del: vec!["x-a".into()],
            req_set: vec![("x-b".into(), "2".into())],
            ..Mods::default()
        });
        assert_eq!(m.req_set, [("x-b".to_string(), "2".to_string())]);
        assert!(m.req_add.is_empty());
        assert_eq!(m.req_del, ["x-a"]);
    }

    #[test]
    fn work_is_bounded() {
        // Many overlapping rules of growing rank: the result stays under the cap or fails.
        let mut rules = Vec::new();
        for i in 0..200 {
            rules.push(Entry::new(
                r(None, &format!("/{}", "a".repeat(i % 50)), &[], &[]),
                Action::Deny(403),
                i,
            ));
        }
        let _ = order(rules);
    }
}
