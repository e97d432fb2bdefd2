//! A `backend` (or a `listen`'s backend part): an upstream, its servers and their
//! parameters.

use std::fmt::Write as _;

use super::actions::header_rule;
use super::render::q;
use super::server::{server_params, template, CheckTiming, ServerParams};
use super::settings::balance;
use super::{dir_name, server_addr, verdict, Check, Cx, Settings, Upstream};
use crate::import::haproxy::parse::Directive;
use crate::import::haproxy::parse::Kind;
use crate::import::haproxy::parse::Section;
use crate::import::haproxy::report::Status;
use Status::{Approximated as Approx, Translated as Ok_, Unsupported as Unsup};

impl Cx<'_> {
    /// A `backend` (or a `listen` with servers) as an upstream, when a server is usable.
    pub(super) fn backend(&mut self, s: &Section, st: &Settings) {
        if !st.http {
            self.all_unsupported(
                s,
                "a mode tcp section (tcp is HAProxy's default mode): portcullis proxies HTTP only",
            );
            return;
        }
        let servers: Vec<&Directive> = s
            .directives
            .iter()
            .filter(|d| d.kw() == "server" || d.kw() == "server-template")
            .collect();
        if s.kind == Kind::Listen && servers.is_empty() {
            return; // a stats listener, or a frontend-like listen
        }
        let mut u = Upstream {
            name: s.name.clone(),
            verify: true,
            ..Upstream::default()
        };
        u.lines.insert(s.line);
        self.upstream_settings(&mut u, st);
        let mut seen = ServerSummary::default();
        for d in &servers {
            self.server(&mut u, d, st, &mut seen);
        }
        if seen.any_maxconn {
            u.queue_timeout = queue_timeout(st);
        }
        self.slow_start(&mut u, &seen.slow_starts);
        if let Some(timing) = seen.check {
            let alike = !(seen.checks_differ || seen.some_unchecked);
            self.health_check(&mut u, st, &servers, timing, alike);
        }
        self.backend_header_rules(s, &mut u);
        if s.kind == Kind::Backend {
            for d in s.directives.iter().filter(|d| d.kw() == "maxconn") {
                self.rep.put(
                    d.line,
                    "maxconn",
                    Unsup("HAProxy ignores maxconn in a backend (use the servers' maxconn)".into()),
                );
            }
            let ef = st.errorfiles.clone();
            self.errorfiles(&ef);
        }
        self.rep.put(
            s.line,
            s.keyword.as_str(),
            if u.backends.is_empty() {
                Approx("no usable server: its requests are answered 503, as HAProxy does".into())
            } else {
                Ok_
            },
        );
        if !u.backends.is_empty() {
            self.out.upstreams.push(u);
        }
    }

    /// The upstream's balancing, timeouts and retries, from the section's settings.
    fn upstream_settings(&mut self, u: &mut Upstream, st: &Settings) {
        if let Some((args, line)) = &st.balance {
            let (mode, status) = balance(args, st.hash_consistent);
            u.balance = mode;
            u.lines.insert(*line);
            self.rep.put(*line, "balance", status);
        }
        for (name, (ms, line)) in &st.timeouts {
            if matches!(name.as_str(), "connect" | "server" | "check") {
                u.lines.insert(*line);
            }
            match name.as_str() {
                "connect" => u.connect_ms = Some(*ms),
                "server" => u.read_ms = Some(*ms),
                "queue" => {
                    u.lines.insert(*line);
                }
                _ => {}
            }
        }
        u.retries = if st.redispatch {
            st.retries.unwrap_or(3).min(3)
        } else {
            0
        };
    }

    /// One `server` or `server-template` line: its backends, what it sets on the whole
    /// upstream (queue, TLS), and what `seen` gathers of it for the upstream-wide settings.
    fn server(&mut self, u: &mut Upstream, d: &Directive, st: &Settings, seen: &mut ServerSummary) {
        let is_template = d.kw() == "server-template";
        let expanded = if is_template {
            match template(d) {
                Ok(v) => v,
                Err(e) => {
                    self.rep.put(d.line, "server-template", Unsup(e));
                    return;
                }
            }
        } else {
            vec![(d.arg(1).to_string(), d.arg(2).to_string())]
        };
        let first_param = if is_template { 4 } else { 3 };
        let mut params: Vec<String> = st.default_server.clone();
        params.extend(d.args.iter().skip(first_param).cloned());
        let sp = match server_params(&params) {
            Ok(p) => p,
            Err(e) => {
                self.rep.put(d.line, d.kw(), Unsup(e));
                return;
            }
        };
        if !st.default_server.is_empty() {
            self.rep.put(st.default_server_line, "default-server", Ok_);
            u.lines.insert(st.default_server_line);
        }
        let mut notes = sp.notes.clone();
        if is_template {
            notes.push(format!(
                "one backend on {} (portcullis re-resolves a name and balances over it as one backend; HAProxy fills {} slots from DNS)",
                d.arg(3),
                d.arg(2)
            ));
        }
        seen.add(&sp, d.line);
        if let Some(q) = sp.maxqueue {
            u.max_queue = Some(u.max_queue.unwrap_or(0).saturating_add(q).max(1));
            notes.push(
                "maxqueue: portcullis has one queue per upstream, of the servers' sum".into(),
            );
        }
        if sp.ssl {
            u.tls = true;
            if !sp.verify {
                u.verify = false;
            }
        }
        if sp.disabled {
            notes.push("a disabled server is left out (hold one out at run time with `portcullis ctl maint`)".into());
        }
        if sp.weight == Some(0) {
            notes.push("weight 0 (no new traffic) is left out".into());
        }
        let left_out = sp.disabled || sp.weight == Some(0);
        let written = if left_out {
            0
        } else {
            push_backends(u, expanded, &sp, &mut notes)
        };
        u.lines.insert(d.line);
        let status = if written == 0 && !left_out {
            Unsup(notes.join("; "))
        } else {
            verdict(&notes)
        };
        self.rep.put(d.line, d.kw(), status);
    }

    /// Slow start: per server in HAProxy, per upstream in portcullis (the first server's).
    fn slow_start(&mut self, u: &mut Upstream, slow_starts: &[(Option<u64>, usize)]) {
        if let Some((first, _)) = slow_starts.iter().find(|(s, _)| s.is_some()) {
            u.slow_start_s = first.map(|ms| ms.div_ceil(1000));
            if slow_starts.iter().any(|(s, _)| s != first) {
                for (_, line) in slow_starts {
                    self.rep.put(*line, "server", Approx(
                        "portcullis ramps every backend of an upstream alike: the first server's slowstart is used for all".into(),
                    ));
                }
            }
        }
    }

    /// The upstream's health check: `option httpchk` and `http-check` with the first checked
    /// server's `timing`; none without httpchk (HAProxy's layer-4 check). `alike`: every
    /// server is checked with the same parameters.
    fn health_check(
        &mut self,
        u: &mut Upstream,
        st: &Settings,
        servers: &[&Directive],
        timing: CheckTiming,
        alike: bool,
    ) {
        match &st.httpchk {
            Some(chk) => u.health = Some(health_table(chk, st, timing)),
            None => {
                for d in servers
                    .iter()
                    .filter(|d| d.args.iter().any(|a| a == "check"))
                {
                    self.rep.put(d.line, d.kw(), Approx(
                        "a layer-4 connect check (no option httpchk): portcullis checks over HTTP only, none is written".into(),
                    ));
                }
            }
        }
        if !alike {
            for d in servers {
                self.rep.put(d.line, d.kw(), Approx(
                    "portcullis checks every backend of an upstream alike: the first checked server's parameters are used for all".into(),
                ));
            }
        }
    }

    /// The backend's own header rules, unconditional only: they apply to every route to it.
    fn backend_header_rules(&mut self, s: &Section, u: &mut Upstream) {
        for d in &s.directives {
            if matches!(d.kw(), "http-request" | "http-response")
                && matches!(d.arg(1), "set-header" | "add-header" | "del-header")
            {
                match header_rule(d) {
                    Ok((m, None)) => {
                        u.mods.then(&m);
                        u.lines.insert(d.line);
                        self.rep.put(d.line, &dir_name(d), Ok_);
                    }
                    Ok((_, Some(_))) => self.rep.put(
                        d.line,
                        &dir_name(d),
                        Unsup(
                            "a conditional header rule in a backend: move it to the frontend"
                                .into(),
                        ),
                    ),
                    Err(e) => self.rep.put(d.line, &dir_name(d), Unsup(e)),
                }
            }
        }
    }

    pub(super) fn all_unsupported(&mut self, s: &Section, why: &str) {
        self.rep.put(s.line, &s.keyword, Unsup(why.into()));
        for d in &s.directives {
            self.rep.put(d.line, &dir_name(d), Unsup(why.into()));
        }
    }

    pub(super) fn upstream_exists(&self, name: &str) -> bool {
        self.out.upstreams.iter().any(|u| u.name == name)
    }
}

/// What the servers of a backend say of the settings portcullis keeps per upstream.
#[derive(Debug, Default)]
struct ServerSummary {
    /// The first checked server's check parameters.
    check: Option<CheckTiming>,
    /// A checked server's parameters differ from the first's.
    checks_differ: bool,
    /// A server is not checked.
    some_unchecked: bool,
    /// A server has a positive maxconn (requests then queue).
    any_maxconn: bool,
    /// Each enabled server's slowstart (ms), with its line.
    slow_starts: Vec<(Option<u64>, usize)>,
}

impl ServerSummary {
    fn add(&mut self, sp: &ServerParams, line: usize) {
        if sp.check {
            let c = (
                sp.inter,
                sp.fastinter,
                sp.downinter,
                sp.rise,
                sp.fall,
                sp.port,
            );
            match &self.check {
                None => self.check = Some(c),
                Some(prev) if *prev != c => self.checks_differ = true,
                _ => {}
            }
        } else {
            self.some_unchecked = true;
        }
        self.any_maxconn |= sp.maxconn.is_some_and(|m| m > 0);
        if !sp.disabled {
            self.slow_starts.push((sp.slowstart, line));
        }
    }
}

/// Writes a server's backends (one per name and address of a template) into the upstream;
/// an address portcullis cannot use is a note. Returns how many were written.
fn push_backends(
    u: &mut Upstream,
    expanded: Vec<(String, String)>,
    sp: &ServerParams,
    notes: &mut Vec<String>,
) -> usize {
    let mut written = 0;
    for (name, addr) in expanded {
        match server_addr(&addr) {
            Ok(a) => {
                u.backends.push(backend_entry(&name, &a, sp));
                written += 1;
            }
            Err(e) => notes.push(e),
        }
    }
    written
}

/// A backend's inline table: its name, address, and the server's weight, maxconn and
/// backup flag.
fn backend_entry(name: &str, addr: &str, sp: &ServerParams) -> String {
    let mut more = String::new();
    if let Some(w) = sp.weight {
        let _ = write!(more, ", weight = {w}");
    }
    if let Some(m) = sp.maxconn {
        let _ = write!(more, ", max_conn = {m}");
    }
    if sp.backup {
        more.push_str(", backup = true");
    }
    format!("{{ name = {}, address = {}{more} }}", q(name), q(addr))
}

/// The queue: HAProxy queues a request when every server is at its maxconn, up to
/// `timeout queue` (by default `timeout connect`).
fn queue_timeout(st: &Settings) -> Option<(u64, &'static str)> {
    match (st.timeouts.get("queue"), st.timeouts.get("connect")) {
        (Some((ms, _)), _) => Some((*ms, "timeout queue")),
        (None, Some((ms, _))) => {
            Some((*ms, "timeout connect (HAProxy's default for timeout queue)"))
        }
        (None, None) => None,
    }
}

/// The `[upstreams.health_check]` table's body.
fn health_table(chk: &Check, st: &Settings, timing: CheckTiming) -> String {
    let (inter, fastinter, downinter, rise, fall, port) = timing;
    let (status, body) = st
        .expect
        .clone()
        .unwrap_or_else(|| ("200-399".into(), String::new()));
    let timeout = st
        .timeouts
        .get("check")
        .map(|t| t.0)
        .unwrap_or(inter)
        .max(1);
    let fast = fastinter.or(downinter).unwrap_or(inter);
    let mut h = format!(
        "path = {}\nmethod = {}\nexpect_status = {}\ninterval_ms = {}\nfast_interval_ms = {}\ntimeout_ms = {}\nrise = {}\nfall = {}\n",
        q(&chk.path), q(&chk.method), q(&status), inter.max(100), fast.max(100), timeout.min(600_000), rise, fall
    );
    if !chk.host.is_empty() {
        let _ = writeln!(h, "host = {}", q(&chk.host));
    }
    if !body.is_empty() {
        let _ = writeln!(h, "expect_body = {}", q(&body));
    }
    if !chk.headers.is_empty() {
        let hs: Vec<String> = chk
            .headers
            .iter()
            .map(|(k, v)| format!("{} = {}", q(k), q(v)))
            .collect();
        let _ = writeln!(h, "headers = {{ {} }}", hs.join(", "));
    }
    if port != 0 {
        let _ = writeln!(h, "port = {port}");
    }
    h
}
