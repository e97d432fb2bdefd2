//! The translation written out as `portcullis.toml` text.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::{Cx, Out, Upstream};
use crate::import::haproxy::routes;
use crate::import::haproxy::routes::Action;
use crate::import::haproxy::routes::Entry;
use crate::import::haproxy::routes::Region;

impl Cx<'_> {
    pub(super) fn render(&self) -> String {
        let o = &self.out;
        let mut t = String::new();
        t.push_str("# Translated from an HAProxy configuration by `portcullis import-haproxy`.\n");
        t.push_str(
            "# Each block names the HAProxy lines it comes from; the report on stderr says\n",
        );
        t.push_str("# what was translated, approximated or left out.\n\n");
        render_server(&mut t, o);
        render_tls(&mut t, o);
        render_limits(&mut t, o);
        render_pages(&mut t, o);
        if o.upstreams.is_empty() {
            t.push_str("# portcullis needs one upstream; no route below uses this one\n[[upstreams]]\nname = \"unused\"\nbackends = [\"127.0.0.1:9\"]\n\n");
        }
        for u in &o.upstreams {
            render_upstream(&mut t, u);
        }
        render_routes(&mut t, &o.frontends);
        t
    }
}

/// `[server]`: the listeners, the admin listener, the process's limits and the client
/// timeouts.
fn render_server(t: &mut String, o: &Out) {
    t.push_str("[server]\n");
    let mut listen: Vec<&(String, usize)> = Vec::new();
    for l in &o.listen {
        if !listen.iter().any(|x| x.0 == l.0) {
            listen.push(l);
        }
    }
    if listen.is_empty() && o.tls_listen.is_empty() {
        t.push_str(
            "# no HTTP frontend: portcullis's default listener\nlisten = [\"127.0.0.1:8080\"]\n",
        );
    } else if listen.is_empty() {
        t.push_str("# every frontend is TLS: the cleartext listener is on loopback only\nlisten = [\"127.0.0.1:8080\"]\n");
    } else {
        let _ = writeln!(
            t,
            "listen = [{}]   # bind, {}",
            listen
                .iter()
                .map(|l| q(&l.0))
                .collect::<Vec<_>>()
                .join(", "),
            lines(listen.iter().map(|l| l.1))
        );
    }
    match &o.admin_listen {
        Some((a, line)) => {
            let _ = writeln!(
                t,
                "admin_listen = {}   # the stats listener, line {line}",
                q(a)
            );
        }
        None => t.push_str(
            "admin_listen = \"127.0.0.1:9090\"   # /status, /metrics (HAProxy's stats page)\n",
        ),
    }
    if let Some(n) = o.threads {
        let _ = writeln!(t, "threads = {n}   # global nbthread");
    }
    if let Some((n, line)) = o.max_connections {
        let _ = writeln!(t, "max_connections = {n}   # maxconn, line {line}");
    }
    if let Some(ms) = o.client_header_ms {
        let _ = writeln!(
            t,
            "client_header_timeout_ms = {ms}   # timeout http-request"
        );
    }
    if let Some(ms) = o.client_body_ms {
        let _ = writeln!(t, "client_body_timeout_ms = {ms}   # timeout client");
    }
    if let Some(ms) = o.idle_ms {
        let _ = writeln!(t, "idle_timeout_ms = {ms}   # timeout http-keep-alive");
    }
    if let Some(s) = o.tunnel_s {
        let _ = writeln!(t, "tunnel_idle_timeout_seconds = {s}   # timeout tunnel");
    }
    t.push('\n');
}

/// `[tls]`, when a frontend binds with `ssl`: its listeners and certificates.
fn render_tls(t: &mut String, o: &Out) {
    if o.tls_listen.is_empty() {
        return;
    }
    t.push_str("[tls]\n");
    let mut tl: Vec<String> = Vec::new();
    for l in &o.tls_listen {
        if !tl.contains(&l.0) {
            tl.push(l.0.clone());
        }
    }
    let _ = writeln!(
        t,
        "listen = [{}]   # bind ... ssl, {}",
        tl.iter().map(|a| q(a)).collect::<Vec<_>>().join(", "),
        lines(o.tls_listen.iter().map(|l| l.1))
    );
    if let Some(v) = &o.min_tls {
        let _ = writeln!(t, "min_version = {}   # ssl-min-ver", q(v));
    }
    for (c, line) in &o.certs {
        let _ = writeln!(t, "[[tls.certificates]]   # crt, line {line}: HAProxy's PEM holds the certificate and its key\ncert = {}\nkey = {}", q(c), q(c));
    }
    t.push('\n');
}

/// `[shedding]`, `[rate_limit]` with the stick-table policies, and `[culling]`: off but
/// for the rate limits the configuration has.
fn render_limits(t: &mut String, o: &Out) {
    t.push_str("# HAProxy sheds nothing, limits no rate unless told, and ejects no backend on errors.\n[shedding]\nmax_concurrency = 0\n\n");
    t.push_str("[rate_limit]\nenabled = false   # no default policy: only the stick-table policies below\nheaders = false   # HAProxy adds no RateLimit fields\n\n");
    for (name, limit, window, prefix, ls) in &o.policies {
        let _ = writeln!(t, "[[rate_limit.policies]]   # stick-table, track-sc0 and the deny, {}\nname = {}\nkey = \"client_ip\"\nlimit = {limit}\nwindow_seconds = {window}\npath_prefix = {}\n", lines(ls.iter().copied()), q(name), q(prefix));
    }
    t.push_str("[culling]\nenabled = false\n\n");
}

/// `[errors.pages]`: the bodies of the `errorfile`s.
fn render_pages(t: &mut String, o: &Out) {
    if o.pages.is_empty() {
        return;
    }
    t.push_str(
        "[errors.pages]   # errorfile: each body, without HAProxy's status line and headers\n",
    );
    for (code, (file, ctype, line)) in &o.pages {
        let _ = writeln!(
            t,
            "\"{code}\" = {{ file = {}, content_type = {} }}   # line {line}",
            q(file),
            q(ctype)
        );
    }
    t.push('\n');
}

/// One `[[upstreams]]` table, with its health check.
fn render_upstream(t: &mut String, u: &Upstream) {
    let _ = writeln!(
        t,
        "[[upstreams]]   # backend {}, {}",
        u.name,
        lines(u.lines.iter().copied())
    );
    let _ = writeln!(t, "name = {}", q(&u.name));
    let _ = writeln!(t, "backends = [\n  {},\n]", u.backends.join(",\n  "));
    if let Some((mode, key)) = &u.balance {
        let _ = writeln!(t, "balance = {}", q(mode));
        if let Some(k) = key {
            let _ = writeln!(t, "hash_key = {}", q(k));
        }
    }
    if let Some(ms) = u.connect_ms {
        let _ = writeln!(t, "connect_timeout_ms = {ms}   # timeout connect");
    }
    if let Some(ms) = u.read_ms {
        let _ = writeln!(t, "read_timeout_ms = {ms}   # timeout server");
    }
    let _ = writeln!(
        t,
        "retries = {}   # {}",
        u.retries,
        if u.retries == 0 {
            "HAProxy retries no request on another server without option redispatch"
        } else {
            "option redispatch"
        }
    );
    if u.tls {
        t.push_str("tls = true   # server ... ssl\n");
        if !u.verify {
            t.push_str("verify = false   # verify none\n");
        }
    }
    if let Some((ms, from)) = u.queue_timeout {
        let _ = writeln!(t, "queue_timeout_ms = {ms}   # {from}: requests wait while every server is at its maxconn");
    }
    if let Some(n) = u.max_queue {
        let _ = writeln!(t, "max_queue = {n}   # the servers' maxqueue");
    }
    if let Some(sec) = u.slow_start_s {
        let _ = writeln!(t, "slow_start_seconds = {sec}   # server slowstart");
    }
    if let Some(h) = &u.health {
        let _ = writeln!(
            t,
            "[upstreams.health_check]   # option httpchk, http-check, server check parameters\n{h}"
        );
    }
    t.push('\n');
}

/// The `[[routes]]`, in the order portcullis matches them; only the fallback when they are
/// too many.
fn render_routes(t: &mut String, frontends: &[(Vec<Entry>, usize)]) {
    let entries = merged(frontends);
    match routes::order(entries.clone()) {
        Ok(list) => {
            for e in &list {
                render_route(t, e);
            }
        }
        Err(routes::TooMany) => {
            t.push_str("# the rules need more routes than the importer writes: only the fallback is kept\n");
            if let Some(e) = entries.last() {
                render_route(t, e);
            }
        }
    }
}

/// The frontends' entries as one list: one frontend's as they are; several frontends'
/// rules one after the other without their fallbacks, then one fallback: the first that
/// proxies (a frontend without `default_backend` would otherwise answer 503 for all).
pub(super) fn merged(frontends: &[(Vec<Entry>, usize)]) -> Vec<Entry> {
    if frontends.len() <= 1 {
        return frontends.first().map(|f| f.0.clone()).unwrap_or_default();
    }
    let mut out: Vec<Entry> = Vec::new();
    for (entries, fb) in frontends {
        out.extend(entries.iter().filter(|e| e.rule != *fb).cloned());
    }
    let fallbacks: Vec<&Entry> = frontends
        .iter()
        .filter_map(|(entries, fb)| {
            entries
                .iter()
                .find(|e| e.rule == *fb && e.region == Region::any())
        })
        .collect();
    let chosen = fallbacks
        .iter()
        .find(|e| matches!(e.action, Action::Proxy(_)))
        .or(fallbacks.first());
    if let Some(e) = chosen {
        out.push((*e).clone());
    }
    out
}

pub(super) fn render_route(t: &mut String, e: &Entry) {
    let _ = writeln!(t, "[[routes]]   # {}", lines(e.lines.iter().copied()));
    if let Some(h) = &e.region.host {
        let _ = writeln!(t, "host = {}", q(h));
    }
    let _ = writeln!(t, "path_prefix = {}", q(&e.region.prefix));
    if let Some(m) = &e.region.methods {
        let _ = writeln!(
            t,
            "methods = [{}]",
            m.iter().map(|x| q(x)).collect::<Vec<_>>().join(", ")
        );
    }
    if let Some(c) = &e.region.cidrs {
        let _ = writeln!(
            t,
            "client_cidrs = [{}]",
            c.iter()
                .map(|x| q(&x.to_string()))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    match &e.action {
        Action::Proxy(u) => {
            let _ = writeln!(t, "upstream = {}", q(u));
        }
        Action::Deny(s) => {
            let _ = writeln!(t, "action = \"deny\"\nstatus = {s}");
        }
        Action::Redirect { status, location } => {
            let _ = writeln!(
                t,
                "action = \"redirect\"\nstatus = {status}\nlocation = {}",
                q(location)
            );
        }
        Action::Fallthrough => {}
    }
    if matches!(e.action, Action::Proxy(_)) {
        let m = &e.mods;
        let table = |set: &[(String, String)],
                     add: &[(String, String)],
                     del: &[String]|
         -> Option<String> {
            if set.is_empty() && add.is_empty() && del.is_empty() {
                return None;
            }
            let kv = |v: &[(String, String)]| {
                v.iter()
                    .map(|(k, v)| format!("{} = {}", q(k), q(v)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let mut parts = Vec::new();
            if !set.is_empty() {
                parts.push(format!("set = {{ {} }}", kv(set)));
            }
            if !add.is_empty() {
                parts.push(format!("add = {{ {} }}", kv(add)));
            }
            if !del.is_empty() {
                parts.push(format!(
                    "remove = [{}]",
                    del.iter().map(|x| q(x)).collect::<Vec<_>>().join(", ")
                ));
            }
            Some(format!("{{ {} }}", parts.join(", ")))
        };
        if let Some(s) = table(&m.req_set, &m.req_add, &m.req_del) {
            let _ = writeln!(t, "request_headers = {s}");
        }
        if let Some(s) = table(&m.resp_set, &m.resp_add, &m.resp_del) {
            let _ = writeln!(t, "response_headers = {s}");
        }
    }
    t.push('\n');
}

/// "line 3" or "lines 3, 5".
pub(super) fn lines(it: impl Iterator<Item = usize>) -> String {
    let set: BTreeSet<usize> = it.collect();
    let list = set
        .iter()
        .map(|l| l.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if set.len() == 1 {
        format!("line {list}")
    } else {
        format!("lines {list}")
    }
}

/// A TOML basic string.
pub fn q(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

pub(super) fn split_response(b: &[u8]) -> (String, &[u8]) {
    let find = |pat: &[u8]| {
        b.windows(pat.len())
            .position(|w| w == pat)
            .map(|p| p + pat.len())
    };
    match find(b"\r\n\r\n").or_else(|| find(b"\n\n")) {
        Some(p) => (String::from_utf8_lossy(&b[..p]).into_owned(), &b[p..]),
        None => (String::new(), b),
    }
}
