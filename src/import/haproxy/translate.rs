//! The translation of the sections into portcullis's configuration, and the report.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::acl::{cubes, named_acls, Acls, Cubes};
use super::parse::{split_condition, Config, Directive, Kind, Section};
use super::report::{Report, Status};
use super::routes::{self, Action, Entry, Mods, Region};

use Status::{Approximated as Approx, Translated as Ok_, Unsupported as Unsup};

/// Where the importer may read the files a configuration names (`errorfile`).
pub struct Options<'a> {
    /// Reads a file the HAProxy configuration names; `None` when it cannot be read.
    pub read_file: &'a dyn Fn(&str) -> Option<Vec<u8>>,
    /// Where the bodies of `errorfile` pages are written, as `DIR/CODE.http.body`; `None`:
    /// no page is written (the `errorfile` lines are reported unsupported).
    pub pages_dir: Option<String>,
}

/// The output: the TOML text, the pages to write (path, bytes) and the report.
pub struct Translation {
    pub toml: String,
    pub pages: Vec<(String, Vec<u8>)>,
    pub report: Vec<super::report::Line>,
}

/// Inherited from `defaults` (and overridden in a proxy).
#[derive(Debug, Clone, Default)]
struct Settings {
    /// `mode http` (HAProxy's default mode is tcp).
    http: bool,
    /// `timeout NAME` -> (ms, line)
    timeouts: BTreeMap<String, (u64, usize)>,
    balance: Option<(Vec<String>, usize)>,
    hash_consistent: bool,
    httpchk: Option<Check>,
    expect: Option<(String, String)>, // (expect_status, expect_body)
    default_server: Vec<String>,
    default_server_line: usize,
    maxconn: Option<(u64, usize)>,
    retries: Option<u64>,
    redispatch: bool,
    errorfiles: Vec<(u16, String, usize)>,
    default_backend: Option<(String, usize)>,
}

#[derive(Debug, Clone, Default)]
struct Check {
    method: String,
    path: String,
    host: String,
    headers: BTreeMap<String, String>,
}

/// One `[[upstreams]]` entry being built.
#[derive(Debug, Default)]
struct Upstream {
    name: String,
    lines: BTreeSet<usize>,
    backends: Vec<String>,
    balance: Option<(&'static str, Option<String>)>,
    health: Option<String>,
    connect_ms: Option<u64>,
    read_ms: Option<u64>,
    retries: u64,
    tls: bool,
    verify: bool,
    /// `timeout queue` (or HAProxy's default for it, `timeout connect`) when a server has
    /// a `maxconn`, with the line it comes from.
    queue_timeout: Option<(u64, &'static str)>,
    /// The sum of the servers' `maxqueue`.
    max_queue: Option<u64>,
    /// The servers' `slowstart`, in seconds.
    slow_start_s: Option<u64>,
    mods: Mods,
}

#[derive(Debug, Default)]
struct Out {
    listen: Vec<(String, usize)>,
    tls_listen: Vec<(String, usize)>,
    certs: Vec<(String, usize)>,
    min_tls: Option<String>,
    admin_listen: Option<(String, usize)>,
    threads: Option<u64>,
    max_connections: Option<(u64, usize)>,
    client_header_ms: Option<u64>,
    client_body_ms: Option<u64>,
    idle_ms: Option<u64>,
    tunnel_s: Option<u64>,
    upstreams: Vec<Upstream>,
    /// Per HTTP frontend: its entries, and the rule (line) of its fallback
    /// (`default_backend`, or the 503 of a frontend without one).
    frontends: Vec<(Vec<Entry>, usize)>,
    policies: Vec<(String, u64, u64, String, BTreeSet<usize>)>,
    pages: BTreeMap<u16, (String, String, usize)>,
    page_files: Vec<(String, Vec<u8>)>,
}

fn dir_name(d: &Directive) -> String {
    let kw = d.kw();
    match kw {
        "timeout"
        | "option"
        | "http-request"
        | "http-response"
        | "http-check"
        | "stats"
        | "no"
        | "tcp-request"
        | "tcp-response"
        | "http-after-response" => {
            format!("{kw} {}", d.arg(1))
        }
        _ => kw.to_string(),
    }
}

/// A count as written (digits), within what a TOML integer (64-bit signed) holds: a value
/// past it is refused like any malformed number, never written out unreadable.
pub fn count(s: &str) -> Result<u64, &'static str> {
    s.parse::<u64>()
        .ok()
        .filter(|n| i64::try_from(*n).is_ok())
        .ok_or("not a count")
}

/// HAProxy's largest time value (its timers are 32-bit: 2147483647 ms, about 24 days);
/// HAProxy refuses more, and so does the importer.
const MAX_TIME_MS: u64 = i32::MAX as u64;

/// HAProxy's time format: a number and an optional unit (us, ms, s, m, h, d); ms by default.
pub fn time_ms(s: &str) -> Option<u64> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let mul = match unit {
        "" | "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "us" => return Some(n / 1000).filter(|v| *v <= MAX_TIME_MS),
        _ => return None,
    };
    n.checked_mul(mul).filter(|v| *v <= MAX_TIME_MS)
}

/// `:80`, `*:80`, `0.0.0.0:80`, `[::]:80`, `ipv4@1.2.3.4:80` -> `host:port`.
fn bind_addr(a: &str) -> Option<String> {
    let a = a.strip_prefix("ipv4@").unwrap_or(a);
    let (host, port) = a.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = match host {
        "" | "*" => "0.0.0.0",
        h => h,
    };
    let addr = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    addr.parse::<std::net::SocketAddr>().ok().map(|_| addr)
}

/// A `server` address: `host:port` with an explicit port.
fn server_addr(a: &str) -> Result<String, String> {
    if a.contains('@') {
        return Err(format!("the address family in '{a}' is not translated"));
    }
    let Some((host, port)) = a.rsplit_once(':') else {
        return Err(format!(
            "'{a}' has no port (HAProxy would use the client's destination port)"
        ));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!("'{a}' is not host:port"));
    }
    Ok(a.to_string())
}

struct Cx<'a> {
    cfg: &'a Config,
    opts: &'a Options<'a>,
    rep: Report,
    out: Out,
    /// Per section index: the settings its directives give (defaults) or end with (proxies).
    settings: Vec<Option<Settings>>,
    crt_base: String,
}

/// Translates a parsed configuration.
pub fn translate(cfg: &Config, opts: &Options<'_>) -> Translation {
    let mut cx = Cx {
        cfg,
        opts,
        rep: Report::default(),
        out: Out::default(),
        settings: vec![None; cfg.sections.len()],
        crt_base: String::new(),
    };
    for (i, s) in cfg.sections.iter().enumerate() {
        match s.kind {
            Kind::Global => cx.global(s),
            Kind::Defaults => {
                let base = s
                    .defaults
                    .and_then(|d| cx.settings[d].clone())
                    .unwrap_or_default();
                let st = cx.settings_of(s, base, true);
                cx.settings[i] = Some(st);
            }
            Kind::Other => {
                cx.rep.put(
                    s.line,
                    &s.keyword,
                    Unsup(format!("'{}' sections are not translated", s.keyword)),
                );
                for d in &s.directives {
                    cx.rep.put(
                        d.line,
                        &dir_name(d),
                        Unsup(format!("'{}' sections are not translated", s.keyword)),
                    );
                }
            }
            _ => {}
        }
    }
    // Backends (and listens) first: upstream names are needed by the frontends' rules.
    for (i, s) in cfg.sections.iter().enumerate() {
        if matches!(s.kind, Kind::Backend | Kind::Listen) {
            let base = s
                .defaults
                .and_then(|d| cx.settings[d].clone())
                .unwrap_or_default();
            let st = cx.settings_of(s, base, false);
            cx.settings[i] = Some(st.clone());
            cx.backend(s, &st);
        }
    }
    let mut first_frontend = true;
    for (i, s) in cfg.sections.iter().enumerate() {
        if matches!(s.kind, Kind::Frontend | Kind::Listen) {
            let st = match &cx.settings[i] {
                Some(st) => st.clone(),
                None => {
                    let base = s
                        .defaults
                        .and_then(|d| cx.settings[d].clone())
                        .unwrap_or_default();
                    cx.settings_of(s, base, false)
                }
            };
            cx.frontend(s, &st, &mut first_frontend);
        }
    }
    // Every directive not reported by now was not understood.
    for s in &cfg.sections {
        for d in &s.directives {
            if !cx.rep.has(d.line) {
                cx.rep.put(
                    d.line,
                    &dir_name(d),
                    Unsup(format!(
                        "unknown or untranslated directive in a '{}' section",
                        s.keyword
                    )),
                );
            }
        }
    }
    let toml = cx.render();
    Translation {
        toml,
        pages: std::mem::take(&mut cx.out.page_files),
        report: cx.rep.into_lines(),
    }
}

impl Cx<'_> {
    fn global(&mut self, s: &Section) {
        for d in &s.directives {
            let name = dir_name(d);
            let st = match d.kw() {
                "maxconn" => match count(d.arg(1)) {
                    Ok(n) if n > 0 => {
                        self.out.max_connections = Some((n, d.line));
                        Ok_
                    }
                    _ => Unsup(format!("'{}' is not a positive number", d.arg(1))),
                },
                "nbthread" => match count(d.arg(1)) {
                    Ok(n) if n > 0 => {
                        self.out.threads = Some(n);
                        Ok_
                    }
                    _ => Unsup(format!("'{}' is not a positive number", d.arg(1))),
                },
                "log" => Approx("access-log lines go to [access_log] (JSON, stdout by default)".into()),
                "daemon" | "user" | "group" | "chroot" | "pidfile" | "master-worker" | "uid"
                | "gid" => Approx(
                    "the systemd unit runs portcullis in the foreground as the portcullis user, sandboxed"
                        .into(),
                ),
                "stats" => Approx(
                    "the runtime API is the admin listener ([server] admin_listen, `portcullis ctl`)"
                        .into(),
                ),
                "ca-base" => Approx("server certificates are verified against the system store".into()),
                "crt-base" => {
                    self.crt_base = d.arg(1).trim_end_matches('/').to_string();
                    Ok_
                }
                "ssl-default-bind-options" => {
                    let min = d.args.windows(2).find(|w| w[0] == "ssl-min-ver").map(|w| w[1].clone());
                    match min.as_deref() {
                        Some("TLSv1.2") => self.out.min_tls = Some("1.2".into()),
                        Some("TLSv1.3") => self.out.min_tls = Some("1.3".into()),
                        _ => {}
                    }
                    if d.args.len() == 3 && min.is_some() {
                        Ok_
                    } else {
                        Approx("ssl-min-ver is [tls] min_version; other options keep OpenSSL's defaults".into())
                    }
                }
                "ssl-default-bind-ciphers" | "ssl-default-bind-ciphersuites"
                | "ssl-default-server-ciphers" | "ssl-default-server-options"
                | "ssl-default-server-ciphersuites" | "tune.ssl.default-dh-param" => {
                    Approx("portcullis keeps OpenSSL's default ciphers and parameters".into())
                }
                _ => Unsup("no portcullis equivalent for this global directive".into()),
            };
            self.rep.put(d.line, &name, st);
        }
    }

    /// The settings a section's directives give, over `base`; reports the directives that
    /// are settings. `defaults`: the section is a defaults section.
    fn settings_of(&mut self, s: &Section, base: Settings, defaults: bool) -> Settings {
        let mut st = base;
        for d in &s.directives {
            let name = dir_name(d);
            let status = match d.kw() {
                "mode" => match d.arg(1) {
                    "http" => {
                        st.http = true;
                        Some(Ok_)
                    }
                    "tcp" => {
                        st.http = false;
                        Some(Unsup("portcullis proxies HTTP only (mode tcp)".into()))
                    }
                    m => Some(Unsup(format!("mode '{m}'"))),
                },
                "timeout" => Some(match time_ms(d.arg(2)) {
                    Some(ms) => {
                        st.timeouts.insert(d.arg(1).to_string(), (ms, d.line));
                        timeout_status(d.arg(1))
                    }
                    None => Unsup(format!("'{}' is not a time", d.arg(2))),
                }),
                "balance" => {
                    st.balance = Some((d.args[1..].to_vec(), d.line));
                    None // reported by the backend that uses it
                }
                "hash-type" => {
                    st.hash_consistent = d.arg(1) == "consistent";
                    Some(Ok_)
                }
                "option" => self.option(d, &mut st),
                "http-check" => Some(http_check(d, &mut st)),
                "default-server" => {
                    st.default_server = d.args[1..].to_vec();
                    st.default_server_line = d.line;
                    None
                }
                "maxconn" => match count(d.arg(1)) {
                    Ok(n) if n > 0 => {
                        st.maxconn = Some((n, d.line));
                        None
                    }
                    _ => Some(Unsup(format!("'{}' is not a positive number", d.arg(1)))),
                },
                "retries" => match count(d.arg(1)) {
                    Ok(n) => {
                        st.retries = Some(n);
                        Some(Approx(
                            "retries = N: portcullis retries a connect failure, reset, 502 or 503 on another backend (idempotent methods, within a retry budget)".into(),
                        ))
                    }
                    _ => Some(Unsup(format!("'{}' is not a number", d.arg(1)))),
                },
                "errorfile" => {
                    match d.arg(1).parse::<u16>() {
                        Ok(code) => st.errorfiles.push((code, d.arg(2).to_string(), d.line)),
                        Err(_) => self.rep.put(
                            d.line,
                            &name,
                            Unsup(format!("'{}' is not a status", d.arg(1))),
                        ),
                    }
                    None
                }
                "default_backend" => {
                    st.default_backend = Some((d.arg(1).to_string(), d.line));
                    None
                }
                "log" => Some(Approx(
                    "access-log lines go to [access_log] (JSON, stdout by default)".into(),
                )),
                _ if defaults => Some(match d.kw() {
                    "stats" => Unsup("stats in defaults: write it in the stats listener".into()),
                    "http-request" | "http-response" => Unsup(
                        "rules in a defaults section are not translated: move them to the frontend"
                            .into(),
                    ),
                    _ => Unsup("no portcullis equivalent for this defaults directive".into()),
                }),
                _ => None,
            };
            if let Some(status) = status {
                self.rep.put(d.line, &name, status);
            }
        }
        if defaults {
            // errorfiles of a defaults section: pages for the whole proxy
            let ef = st.errorfiles.clone();
            self.errorfiles(&ef);
        }
        st
    }

    fn option(&mut self, d: &Directive, st: &mut Settings) -> Option<Status> {
        Some(match d.arg(1) {
            "httplog" | "dontlognull" | "log-health-checks" | "httpslog" | "dontlog-normal" => {
                Approx("every request is one JSON access-log line ([access_log])".into())
            }
            "forwardfor" => Approx(
                "portcullis sets X-Forwarded-For (and -Proto, -Host) on every proxied request"
                    .into(),
            ),
            "http-server-close"
            | "httpclose"
            | "http-keep-alive"
            | "http-buffer-request"
            | "http-pretend-keepalive" => {
                Approx("portcullis keeps pooled keep-alive connections to the backends".into())
            }
            "redispatch" => {
                st.redispatch = true;
                Approx("a retry goes to another backend (upstream retries)".into())
            }
            "httpchk" => {
                let rest: Vec<&str> = d.args[2..].iter().map(String::as_str).collect();
                let (method, uri, ver) = match rest.as_slice() {
                    [] => ("OPTIONS", "/", ""),
                    [u] => ("OPTIONS", *u, ""),
                    [m, u] => (*m, *u, ""),
                    [m, u, v, ..] => (*m, *u, *v),
                };
                let mut chk = Check {
                    method: method.to_string(),
                    path: uri.to_string(),
                    ..Check::default()
                };
                // the old form: "HTTP/1.1\r\nHost:\ www" in the version
                for (i, part) in ver.split("\r\n").enumerate() {
                    if i == 0 {
                        continue;
                    }
                    if let Some((n, v)) = part.split_once(':') {
                        let (n, v) = (n.trim(), v.trim());
                        if n.eq_ignore_ascii_case("host") {
                            chk.host = v.to_string();
                        } else {
                            chk.headers.insert(n.to_ascii_lowercase(), v.to_string());
                        }
                    }
                }
                let ok_method = matches!(method, "GET" | "HEAD" | "OPTIONS");
                st.httpchk = Some(chk);
                if ok_method {
                    Ok_
                } else {
                    Unsup(format!(
                        "health checks use GET, HEAD or OPTIONS, not {method}"
                    ))
                }
            }
            _ => {
                return (!d.arg(1).is_empty())
                    .then(|| Unsup("no portcullis equivalent for this option".into()))
            }
        })
    }

    fn errorfiles(&mut self, list: &[(u16, String, usize)]) {
        const PAGES: [u16; 11] = [400, 401, 403, 404, 408, 413, 421, 429, 502, 503, 504];
        for (code, path, line) in list {
            if !PAGES.contains(code) {
                self.rep.put(
                    *line,
                    "errorfile",
                    Unsup(format!("portcullis writes no {code} of its own")),
                );
                continue;
            }
            let Some(dir) = &self.opts.pages_dir else {
                self.rep.put(
                    *line,
                    "errorfile",
                    Unsup("pages are written beside the output: use --out".into()),
                );
                continue;
            };
            let Some(bytes) = (self.opts.read_file)(path) else {
                self.rep
                    .put(*line, "errorfile", Unsup(format!("cannot read {path}")));
                continue;
            };
            // An HAProxy error file is a whole response: keep its body and its type.
            let (head, body) = split_response(&bytes);
            let ctype = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(n, _)| n.trim().eq_ignore_ascii_case("content-type"))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_else(|| "text/html".into());
            let file = format!("{dir}/{code}.html");
            if !self.out.pages.contains_key(code) {
                self.out.pages.insert(*code, (file.clone(), ctype, *line));
                self.out.page_files.push((file, body.to_vec()));
            }
            self.rep.put(*line, "errorfile", Approx(
                "its body is [errors.pages] (written beside the output); the status line and headers are portcullis's own".into(),
            ));
        }
    }

    fn backend(&mut self, s: &Section, st: &Settings) {
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
        // balance
        if let Some((args, line)) = &st.balance {
            let (mode, status) = balance(args, st.hash_consistent);
            u.balance = mode;
            u.lines.insert(*line);
            self.rep.put(*line, "balance", status);
        }
        // timeouts
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
        // servers
        let mut check: Option<CheckTiming> = None;
        let mut checks_differ = false;
        let mut some_unchecked = false;
        let mut any_checked = false;
        let mut any_maxconn = false;
        let mut slow_starts: Vec<(Option<u64>, usize)> = Vec::new();
        for d in &servers {
            let expanded = if d.kw() == "server-template" {
                match template(d) {
                    Ok(v) => v,
                    Err(e) => {
                        self.rep.put(d.line, "server-template", Unsup(e));
                        continue;
                    }
                }
            } else {
                vec![(d.arg(1).to_string(), d.arg(2).to_string())]
            };
            let first_param = if d.kw() == "server-template" { 4 } else { 3 };
            let mut params: Vec<String> = st.default_server.clone();
            params.extend(d.args.iter().skip(first_param).cloned());
            let sp = match server_params(&params) {
                Ok(p) => p,
                Err(e) => {
                    self.rep.put(d.line, d.kw(), Unsup(e));
                    continue;
                }
            };
            if !st.default_server.is_empty() {
                self.rep.put(st.default_server_line, "default-server", Ok_);
                u.lines.insert(st.default_server_line);
            }
            let mut notes = sp.notes.clone();
            if d.kw() == "server-template" {
                notes.push(format!(
                    "one backend on {} (portcullis re-resolves a name and balances over it as one backend; HAProxy fills {} slots from DNS)",
                    d.arg(3),
                    d.arg(2)
                ));
            }
            if sp.check {
                any_checked = true;
                let c = (
                    sp.inter,
                    sp.fastinter,
                    sp.downinter,
                    sp.rise,
                    sp.fall,
                    sp.port,
                );
                match &check {
                    None => check = Some(c),
                    Some(prev) if *prev != c => checks_differ = true,
                    _ => {}
                }
            } else {
                some_unchecked = true;
            }
            any_maxconn |= sp.maxconn.is_some_and(|m| m > 0);
            if !sp.disabled {
                slow_starts.push((sp.slowstart, d.line));
            }
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
            let mut ok = 0;
            for (name, addr) in expanded {
                if sp.disabled || sp.weight == Some(0) {
                    continue;
                }
                match server_addr(&addr) {
                    Ok(a) => {
                        let mut t = format!("{{ name = {}, address = {}", q(&name), q(&a));
                        if let Some(w) = sp.weight {
                            let _ = write!(t, ", weight = {w}");
                        }
                        if let Some(m) = sp.maxconn {
                            let _ = write!(t, ", max_conn = {m}");
                        }
                        if sp.backup {
                            t.push_str(", backup = true");
                        }
                        t.push_str(" }");
                        u.backends.push(t);
                        ok += 1;
                    }
                    Err(e) => notes.push(e),
                }
            }
            u.lines.insert(d.line);
            let status = if ok == 0 && !(sp.disabled || sp.weight == Some(0)) {
                Unsup(notes.join("; "))
            } else if notes.is_empty() {
                Ok_
            } else {
                Approx(notes.join("; "))
            };
            self.rep.put(d.line, d.kw(), status);
        }
        // the queue: HAProxy queues a request when every server is at its maxconn, up to
        // `timeout queue` (by default `timeout connect`)
        if any_maxconn {
            u.queue_timeout = match (st.timeouts.get("queue"), st.timeouts.get("connect")) {
                (Some((ms, _)), _) => Some((*ms, "timeout queue")),
                (None, Some((ms, _))) => {
                    Some((*ms, "timeout connect (HAProxy's default for timeout queue)"))
                }
                (None, None) => None,
            };
        }
        // slow start: per server in HAProxy, per upstream in portcullis
        if let Some((first, _)) = slow_starts.iter().find(|(s, _)| s.is_some()) {
            u.slow_start_s = first.map(|ms| ms.div_ceil(1000));
            if slow_starts.iter().any(|(s, _)| s != first) {
                for (_, line) in &slow_starts {
                    self.rep.put(*line, "server", Approx(
                        "portcullis ramps every backend of an upstream alike: the first server's slowstart is used for all".into(),
                    ));
                }
            }
        }
        // health check
        if any_checked {
            if let Some((inter, fastinter, downinter, rise, fall, port)) = check {
                match &st.httpchk {
                    Some(chk) => {
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
                        u.health = Some(h);
                    }
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
            }
            if checks_differ || some_unchecked {
                for d in &servers {
                    self.rep.put(d.line, d.kw(), Approx(
                        "portcullis checks every backend of an upstream alike: the first checked server's parameters are used for all".into(),
                    ));
                }
            }
        }
        // backend-level header rules (unconditional)
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
            if d.kw() == "maxconn" && s.kind == Kind::Backend {
                self.rep.put(
                    d.line,
                    "maxconn",
                    Unsup("HAProxy ignores maxconn in a backend (use the servers' maxconn)".into()),
                );
            }
        }
        if s.kind == Kind::Backend {
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

    fn all_unsupported(&mut self, s: &Section, why: &str) {
        self.rep.put(s.line, &s.keyword, Unsup(why.into()));
        for d in &s.directives {
            self.rep.put(d.line, &dir_name(d), Unsup(why.into()));
        }
    }

    fn upstream_exists(&self, name: &str) -> bool {
        self.out.upstreams.iter().any(|u| u.name == name)
    }

    fn frontend(&mut self, s: &Section, st: &Settings, first: &mut bool) {
        if !st.http {
            self.all_unsupported(
                s,
                "a mode tcp section (tcp is HAProxy's default mode): portcullis proxies HTTP only",
            );
            return;
        }
        let stats = s.directives.iter().any(|d| d.kw() == "stats");
        let acls: Acls = named_acls(&s.directives);
        for d in s.directives.iter().filter(|d| d.kw() == "acl") {
            let status = match acls
                .get(d.arg(1))
                .and_then(|v| v.iter().find(|(l, _)| *l == d.line))
            {
                Some((_, Ok(p))) => match &p.approx {
                    Some(a) => Approx(a.clone()),
                    None => Ok_,
                },
                Some((_, Err(e))) => Unsup(e.clone()),
                None => Unsup("unreadable ACL".into()),
            };
            self.rep.put(d.line, "acl", status);
        }
        // binds
        let mut binds: Vec<(String, usize, bool)> = Vec::new();
        if let Some(b) = &s.header_bind {
            binds.push((b.clone(), s.line, false));
        }
        for d in s.directives.iter().filter(|d| d.kw() == "bind") {
            let ssl = d.args.iter().any(|a| a == "ssl");
            let mut notes = Vec::new();
            let mut i = 2;
            while i < d.args.len() {
                match d.arg(i) {
                    "ssl" => {}
                    "crt" => {
                        i += 1;
                        let mut path = d.arg(i).to_string();
                        if !path.starts_with('/') && !self.crt_base.is_empty() {
                            path = format!("{}/{path}", self.crt_base);
                        }
                        self.out.certs.push((path, d.line));
                    }
                    "alpn" => i += 1,
                    "ssl-min-ver" => {
                        i += 1;
                        match d.arg(i) {
                            "TLSv1.2" => self.out.min_tls = Some("1.2".into()),
                            "TLSv1.3" => self.out.min_tls = Some("1.3".into()),
                            v => notes.push(format!("ssl-min-ver {v}")),
                        }
                    }
                    "v4v6" | "v6only" => {}
                    o => notes.push(format!("bind option '{o}' is not translated")),
                }
                i += 1;
            }
            let mut any = false;
            for a in d.arg(1).split(',') {
                match bind_addr(a) {
                    Some(addr) => {
                        if stats
                            && !ssl
                            && self.out.admin_listen.is_none()
                            && !s.directives.iter().any(|x| {
                                x.kw() == "default_backend"
                                    || x.kw() == "use_backend"
                                    || x.kw() == "server"
                            })
                        {
                            self.out.admin_listen = Some((addr, d.line));
                        } else {
                            binds.push((addr, d.line, ssl));
                        }
                        any = true;
                    }
                    None => notes.push(format!("address '{a}' is not translated")),
                }
            }
            let status = if !any {
                Unsup(notes.join("; "))
            } else if notes.is_empty() {
                Ok_
            } else {
                Approx(notes.join("; "))
            };
            self.rep.put(d.line, "bind", status);
        }
        // stats
        if stats {
            for d in s.directives.iter().filter(|d| d.kw() == "stats") {
                let st = match d.arg(1) {
                    "enable" => Ok_,
                    "uri" => Approx(format!(
                        "the status page is /status on [server] admin_listen (with /metrics, /backends), not {}",
                        d.arg(2)
                    )),
                    "refresh" => Approx("the status page refreshes itself every 2 s".into()),
                    "auth" | "realm" => Unsup(
                        "the admin page's GET endpoints have no password: bind admin_listen to a private address".into(),
                    ),
                    "admin" => Approx("POST endpoints need admin_token (or a loopback admin_listen)".into()),
                    "hide-version" | "show-legends" | "show-node" | "show-desc" => {
                        Approx("the page shows what it shows".into())
                    }
                    _ => Unsup("no portcullis equivalent".into()),
                };
                self.rep.put(d.line, &dir_name(d), st);
            }
        }
        if binds.is_empty() && stats {
            self.rep.put(s.line, &s.keyword, Ok_);
            return;
        }
        // client-side timeouts and maxconn, from the first frontend
        for (name, (ms, line)) in &st.timeouts {
            let slot = match name.as_str() {
                "client" => Some(&mut self.out.client_body_ms),
                "http-request" => Some(&mut self.out.client_header_ms),
                "http-keep-alive" => Some(&mut self.out.idle_ms),
                _ => None,
            };
            if let Some(slot) = slot {
                if slot.is_none() {
                    *slot = Some(*ms);
                } else if *slot != Some(*ms) {
                    self.rep.put(*line, &format!("timeout {name}"), Approx(
                        "portcullis's client timeouts are for every listener: the first frontend's is used".into(),
                    ));
                }
            }
            if name == "tunnel" && self.out.tunnel_s.is_none() {
                self.out.tunnel_s = Some(ms.div_ceil(1000).max(1));
            }
        }
        if let Some((n, line)) = st.maxconn {
            match self.out.max_connections {
                None => self.out.max_connections = Some((n, line)),
                Some((m, _)) if m == n => {}
                Some(_) => {}
            }
            self.rep.put(line, "maxconn", Ok_);
        }
        for (b, line, ssl) in binds {
            if ssl {
                self.out.tls_listen.push((b, line));
            } else {
                self.out.listen.push((b, line));
            }
        }
        if !*first {
            self.rep.put(s.line, &s.keyword, Approx(
                "portcullis's routes serve every listener: this frontend's rules are merged with the first one's".into(),
            ));
        } else {
            self.rep.put(s.line, &s.keyword, Ok_);
        }
        *first = false;
        let ef = st.errorfiles.clone();
        self.errorfiles(&ef);
        self.rules(s, st, &acls);
    }

    /// The frontend's request rules, `use_backend`s and `default_backend`, as entries.
    fn rules(&mut self, s: &Section, st: &Settings, acls: &Acls) {
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
    fn rate_rule(
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

    fn render(&self) -> String {
        let o = &self.out;
        let mut t = String::new();
        t.push_str("# Translated from an HAProxy configuration by `portcullis import-haproxy`.\n");
        t.push_str(
            "# Each block names the HAProxy lines it comes from; the report on stderr says\n",
        );
        t.push_str("# what was translated, approximated or left out.\n\n");
        t.push_str("[server]\n");
        let mut listen: Vec<&(String, usize)> = Vec::new();
        for l in &o.listen {
            if !listen.iter().any(|x| x.0 == l.0) {
                listen.push(l);
            }
        }
        if listen.is_empty() && o.tls_listen.is_empty() {
            t.push_str("# no HTTP frontend: portcullis's default listener\nlisten = [\"127.0.0.1:8080\"]\n");
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
        if !o.tls_listen.is_empty() {
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
        t.push_str("# HAProxy sheds nothing, limits no rate unless told, and ejects no backend on errors.\n[shedding]\nmax_concurrency = 0\n\n");
        t.push_str("[rate_limit]\nenabled = false   # no default policy: only the stick-table policies below\nheaders = false   # HAProxy adds no RateLimit fields\n\n");
        for (name, limit, window, prefix, ls) in &o.policies {
            let _ = writeln!(t, "[[rate_limit.policies]]   # stick-table, track-sc0 and the deny, {}\nname = {}\nkey = \"client_ip\"\nlimit = {limit}\nwindow_seconds = {window}\npath_prefix = {}\n", lines(ls.iter().copied()), q(name), q(prefix));
        }
        t.push_str("[culling]\nenabled = false\n\n");
        if !o.pages.is_empty() {
            t.push_str("[errors.pages]   # errorfile: each body, without HAProxy's status line and headers\n");
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
        if o.upstreams.is_empty() {
            t.push_str("# portcullis needs one upstream; no route below uses this one\n[[upstreams]]\nname = \"unused\"\nbackends = [\"127.0.0.1:9\"]\n\n");
        }
        for u in &o.upstreams {
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
                let _ = writeln!(t, "[upstreams.health_check]   # option httpchk, http-check, server check parameters\n{h}");
            }
            t.push('\n');
        }
        let entries = merged(&o.frontends);
        match routes::order(entries.clone()) {
            Ok(list) => {
                for e in &list {
                    render_route(&mut t, e);
                }
            }
            Err(routes::TooMany) => {
                t.push_str("# the rules need more routes than the importer writes: only the fallback is kept\n");
                if let Some(e) = entries.last() {
                    render_route(&mut t, e);
                }
            }
        }
        t
    }
}

/// The frontends' entries as one list: one frontend's as they are; several frontends'
/// rules one after the other without their fallbacks, then one fallback: the first that
/// proxies (a frontend without `default_backend` would otherwise answer 503 for all).
fn merged(frontends: &[(Vec<Entry>, usize)]) -> Vec<Entry> {
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

fn render_route(t: &mut String, e: &Entry) {
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
fn lines(it: impl Iterator<Item = usize>) -> String {
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

fn split_response(b: &[u8]) -> (String, &[u8]) {
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

fn timeout_status(name: &str) -> Status {
    match name {
        "connect" | "server" | "http-request" | "http-keep-alive" | "tunnel" => Ok_,
        "client" => Approx("server.client_body_timeout_ms: the longest pause between body reads; an idle connection closes after idle_timeout_ms".into()),
        "check" => Ok_,
        "queue" => Ok_, // reported by the backend that has it
        _ => Unsup(format!("no portcullis equivalent for 'timeout {name}'")),
    }
}

fn http_check(d: &Directive, st: &mut Settings) -> Status {
    match d.arg(1) {
        "send" => {
            let chk = st.httpchk.get_or_insert_with(|| Check {
                method: "OPTIONS".into(),
                path: "/".into(),
                ..Check::default()
            });
            let mut i = 2;
            let mut notes = Vec::new();
            while i < d.args.len() {
                match d.arg(i) {
                    "meth" => {
                        chk.method = d.arg(i + 1).to_string();
                        i += 2;
                    }
                    "uri" => {
                        chk.path = d.arg(i + 1).to_string();
                        i += 2;
                    }
                    "ver" => i += 2,
                    "hdr" => {
                        let (n, v) = (d.arg(i + 1), d.arg(i + 2));
                        if n.eq_ignore_ascii_case("host") {
                            chk.host = v.to_string();
                        } else {
                            chk.headers.insert(n.to_ascii_lowercase(), v.to_string());
                        }
                        i += 3;
                    }
                    o => {
                        notes.push(format!("'{o}' is not translated"));
                        i += 1;
                    }
                }
            }
            if !matches!(chk.method.as_str(), "GET" | "HEAD" | "OPTIONS") {
                return Unsup(format!(
                    "health checks use GET, HEAD or OPTIONS, not {}",
                    chk.method
                ));
            }
            if notes.is_empty() {
                Ok_
            } else {
                Approx(notes.join("; "))
            }
        }
        "expect" => {
            let (neg, i) = if d.arg(2) == "!" {
                (true, 3)
            } else {
                (false, 2)
            };
            if neg {
                return Unsup("a negated expect is not translated".into());
            }
            let e = st
                .expect
                .get_or_insert_with(|| ("200-399".into(), String::new()));
            match d.arg(i) {
                "status" => {
                    let v = d.arg(i + 1);
                    if v.split(',')
                        .all(|p| p.split('-').all(|n| n.parse::<u16>().is_ok()))
                    {
                        e.0 = v.to_string();
                        Ok_
                    } else {
                        Unsup(format!("status '{v}'"))
                    }
                }
                "string" => {
                    e.1 = d.arg(i + 1).to_string();
                    Ok_
                }
                o => Unsup(format!(
                    "'http-check expect {o}' is not translated (status or string)"
                )),
            }
        }
        "disable-on-404" => Unsup("no equivalent".into()),
        "connect" => Approx("probes connect to the backend (or health_check.port)".into()),
        _ => Unsup("no portcullis equivalent".into()),
    }
}

fn balance(args: &[String], consistent: bool) -> (Option<(&'static str, Option<String>)>, Status) {
    let a = args.first().map(String::as_str).unwrap_or("");
    let hashed = |key: String| {
        (
            Some(("consistent_hash", Some(key))),
            if consistent {
                Ok_
            } else {
                Approx("consistent hashing (HAProxy's default map-based hash moves more keys when a server changes)".into())
            },
        )
    };
    match a {
        "roundrobin" | "static-rr" => (Some(("round_robin", None)), Ok_),
        "leastconn" => (
            Some(("least_requests", None)),
            Approx("least requests in flight of two backends picked at random".into()),
        ),
        "random" => (
            Some(("random", None)),
            if args.len() > 1 {
                Approx("random by weight (one draw)".into())
            } else {
                Ok_
            },
        ),
        "source" => hashed("client_ip".into()),
        "uri" => hashed("path".into()),
        "url_param" if args.len() > 1 => hashed(format!("query:{}", args[1])),
        _ => {
            if let Some(h) = a.strip_prefix("hdr(").and_then(|x| x.strip_suffix(')')) {
                if !h.is_empty() {
                    return hashed(format!("header:{}", h.to_ascii_lowercase()));
                }
            }
            (
                None,
                Unsup(format!(
                    "balance '{a}' has no portcullis equivalent: round robin"
                )),
            )
        }
    }
}

/// A server's check parameters: inter, fastinter, downinter, rise, fall, port.
type CheckTiming = (u64, Option<u64>, Option<u64>, u64, u64, u16);

#[derive(Debug, Default)]
struct ServerParams {
    check: bool,
    inter: u64,
    fastinter: Option<u64>,
    downinter: Option<u64>,
    rise: u64,
    fall: u64,
    port: u16,
    weight: Option<u64>,
    maxconn: Option<u64>,
    backup: bool,
    disabled: bool,
    slowstart: Option<u64>,
    maxqueue: Option<u64>,
    ssl: bool,
    verify: bool,
    notes: Vec<String>,
}

fn server_params(p: &[String]) -> Result<ServerParams, String> {
    let mut s = ServerParams {
        inter: 2000,
        rise: 2,
        fall: 3,
        verify: true,
        ..ServerParams::default()
    };
    let mut i = 0;
    let num = |i: usize| -> Result<u64, String> {
        p.get(i).and_then(|v| count(v).ok()).ok_or_else(|| {
            format!(
                "'{}' needs a number",
                p.get(i.wrapping_sub(1)).map(String::as_str).unwrap_or("")
            )
        })
    };
    let time = |i: usize| -> Result<u64, String> {
        p.get(i).and_then(|v| time_ms(v)).ok_or_else(|| {
            format!(
                "'{}' needs a time",
                p.get(i.wrapping_sub(1)).map(String::as_str).unwrap_or("")
            )
        })
    };
    while i < p.len() {
        match p[i].as_str() {
            "check" => s.check = true,
            "no-check" => s.check = false,
            "inter" => {
                s.inter = time(i + 1)?;
                i += 1;
            }
            "fastinter" => {
                s.fastinter = Some(time(i + 1)?);
                i += 1;
            }
            "downinter" => {
                s.downinter = Some(time(i + 1)?);
                i += 1;
            }
            "rise" => {
                s.rise = num(i + 1)?.clamp(1, 1000);
                i += 1;
            }
            "fall" => {
                s.fall = num(i + 1)?.clamp(1, 1000);
                i += 1;
            }
            "port" => {
                s.port = u16::try_from(num(i + 1)?).map_err(|_| "port out of range".to_string())?;
                i += 1;
            }
            "weight" => {
                let w = num(i + 1)?;
                if w > 256 {
                    return Err(format!("weight {w} is above HAProxy's 256"));
                }
                s.weight = Some(w);
                i += 1;
            }
            "maxconn" => {
                s.maxconn = Some(num(i + 1)?);
                i += 1;
            }
            "backup" => s.backup = true,
            "disabled" => s.disabled = true,
            "enabled" => s.disabled = false,
            "ssl" => s.ssl = true,
            "verify" => {
                if p.get(i + 1).map(String::as_str) == Some("none") {
                    s.verify = false;
                }
                i += 1;
            }
            "slowstart" => {
                s.slowstart = Some(time(i + 1)?);
                i += 1;
            }
            "maxqueue" => {
                s.maxqueue = Some(num(i + 1)?);
                i += 1;
            }
            "check-ssl" | "resolvers" | "init-addr" | "cookie" | "id" | "agent-check"
            | "agent-port" | "agent-inter" | "on-marked-down" | "on-error" | "error-limit"
            | "observe" | "sni" | "ca-file" | "crt" | "alpn" | "proto" | "send-proxy"
            | "send-proxy-v2" | "resolve-prefer" | "pool-max-conn" | "pool-purge-delay" => {
                let takes = !matches!(
                    p[i].as_str(),
                    "check-ssl" | "agent-check" | "send-proxy" | "send-proxy-v2"
                );
                s.notes.push(format!("'{}' is not translated", p[i]));
                if takes {
                    i += 1;
                }
            }
            o => s.notes.push(format!("'{o}' is not translated")),
        }
        i += 1;
    }
    Ok(s)
}

/// `server-template PREFIX NUM|RANGE FQDN[:PORT]`: PREFIX1..PREFIXn, all on the same
/// address (HAProxy fills them from DNS; with a literal address each is that address).
fn template(d: &Directive) -> Result<Vec<(String, String)>, String> {
    let prefix = d.arg(1);
    let range = d.arg(2);
    let addr = d.arg(3);
    let (lo, hi) = match range.split_once('-') {
        Some((a, b)) => (
            count(a).map_err(|_| format!("'{range}' is not a number or range"))?,
            count(b).map_err(|_| format!("'{range}' is not a number or range"))?,
        ),
        None => (
            1,
            count(range).map_err(|_| format!("'{range}' is not a number or range"))?,
        ),
    };
    if lo == 0 || hi < lo || hi - lo >= 1000 {
        return Err(format!("range '{range}' (1 to 1000 servers)"));
    }
    if addr.is_empty() {
        return Err("server-template needs an address".into());
    }
    Ok(vec![(prefix.to_string(), addr.to_string())])
}

fn action_of(d: &Directive, head: &[String]) -> Result<Option<Action>, String> {
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
fn header_rule(d: &Directive) -> Result<(Mods, Option<()>), String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_past_what_haproxy_or_toml_hold_are_refused() {
        assert_eq!(time_ms("24d"), Some(24 * 86_400_000));
        assert_eq!(time_ms("2147483647"), Some(2_147_483_647));
        assert_eq!(time_ms("2147483648"), None, "HAProxy's timers are 32-bit");
        assert_eq!(time_ms("11111111111111111111"), None);
        assert_eq!(time_ms("25d"), None);
        assert_eq!(count("9223372036854775807"), Ok(i64::MAX as u64));
        assert!(count("9223372036854775808").is_err());
        assert!(count("-1").is_err());
    }

    #[test]
    fn times_and_addresses() {
        assert_eq!(time_ms("5000"), Some(5000));
        assert_eq!(time_ms("5s"), Some(5000));
        assert_eq!(time_ms("1m"), Some(60_000));
        assert_eq!(time_ms("2h"), Some(7_200_000));
        assert_eq!(time_ms("1500us"), Some(1));
        assert_eq!(time_ms("5x"), None);
        assert_eq!(time_ms("99999999999999999999d"), None);
        assert_eq!(bind_addr(":80").as_deref(), Some("0.0.0.0:80"));
        assert_eq!(bind_addr("*:443").as_deref(), Some("0.0.0.0:443"));
        assert_eq!(bind_addr("::1:8080").as_deref(), Some("[::1]:8080"));
        assert_eq!(bind_addr("/run/h.sock"), None);
        assert!(server_addr("10.0.0.1:80").is_ok());
        assert!(server_addr("10.0.0.1").is_err());
        assert!(server_addr("unix@/run/x").is_err());
    }

    #[test]
    fn a_whole_file_in_memory() {
        let text = "defaults\n mode http\nfrontend f\n bind :8080\n acl a path_beg /a\n use_backend b if a\n default_backend c\nbackend b\n server s 10.0.0.1:80 check\n option httpchk GET /h\nbackend c\n server s 10.0.0.2:80\n";
        let none = |_: &str| None;
        let opts = Options {
            read_file: &|_| None,
            pages_dir: None,
        };
        let cfg = super::super::parse::parse(text, &none).unwrap_or_else(|e| panic!("{e}"));
        let t = translate(&cfg, &opts);
        assert!(
            t.report.iter().all(|l| l.status == Status::Translated),
            "{:?}",
            t.report
        );
        assert!(t.toml.contains("path = \"/h\""), "{}", t.toml);
        assert!(t.toml.contains("path_prefix = \"/a\"\nupstream = \"b\""));
        assert!(t.toml.parse::<toml::Table>().is_ok());
    }
}
