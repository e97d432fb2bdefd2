//! The translation of the sections into portcullis's configuration, and the report.

mod actions;
mod backend;
mod frontend;
mod render;
mod rules;
mod server;
mod settings;

use std::collections::{BTreeMap, BTreeSet};

use super::parse::{Config, Directive, Kind, Section};
use super::report::{Report, Status};
use super::routes::{Entry, Mods};

use Status::Unsupported as Unsup;

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

impl Check {
    /// A header of the probe: `Host` is its own field, the others are kept lowercased.
    fn set_header(&mut self, name: &str, value: &str) {
        if name.eq_ignore_ascii_case("host") {
            self.host = value.to_string();
        } else {
            self.headers
                .insert(name.to_ascii_lowercase(), value.to_string());
        }
    }
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

/// Translated, or approximated as the notes say.
fn verdict(notes: &[String]) -> Status {
    if notes.is_empty() {
        Status::Translated
    } else {
        Status::Approximated(notes.join("; "))
    }
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
    cx.global_and_defaults();
    // Backends (and listens) first: upstream names are needed by the frontends' rules.
    cx.backends();
    cx.frontends();
    cx.report_the_rest();
    let toml = cx.render();
    Translation {
        toml,
        pages: std::mem::take(&mut cx.out.page_files),
        report: cx.rep.into_lines(),
    }
}

impl Cx<'_> {
    /// The `global` section, the `defaults` sections' settings, and the report of the
    /// sections that are not translated (`userlist`, `peers`...).
    fn global_and_defaults(&mut self) {
        let cfg = self.cfg;
        for (i, s) in cfg.sections.iter().enumerate() {
            match s.kind {
                Kind::Global => self.global(s),
                Kind::Defaults => {
                    let st = self.settings_of(s, self.inherited(s), true);
                    self.settings[i] = Some(st);
                }
                Kind::Other => {
                    self.all_unsupported(s, &format!("'{}' sections are not translated", s.keyword))
                }
                _ => {}
            }
        }
    }

    /// The settings of the `defaults` section `s` inherits (HAProxy's own without one).
    fn inherited(&self, s: &Section) -> Settings {
        s.defaults
            .and_then(|d| self.settings[d].clone())
            .unwrap_or_default()
    }

    /// Every `backend` and `listen` as an upstream.
    fn backends(&mut self) {
        let cfg = self.cfg;
        for (i, s) in cfg.sections.iter().enumerate() {
            if matches!(s.kind, Kind::Backend | Kind::Listen) {
                let st = self.settings_of(s, self.inherited(s), false);
                self.settings[i] = Some(st.clone());
                self.backend(s, &st);
            }
        }
    }

    /// Every `frontend` and `listen` as listeners and routes.
    fn frontends(&mut self) {
        let mut first_frontend = true;
        let cfg = self.cfg;
        for (i, s) in cfg.sections.iter().enumerate() {
            if matches!(s.kind, Kind::Frontend | Kind::Listen) {
                let st = match &self.settings[i] {
                    Some(st) => st.clone(),
                    None => self.settings_of(s, self.inherited(s), false),
                };
                self.frontend(s, &st, &mut first_frontend);
            }
        }
    }

    /// Every directive not reported by now was not understood.
    fn report_the_rest(&mut self) {
        let cfg = self.cfg;
        for s in &cfg.sections {
            for d in &s.directives {
                if !self.rep.has(d.line) {
                    self.rep.put(
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
    }
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
