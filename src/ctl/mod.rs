//! `portcullis ctl`: a command-line client of the runtime admin API (CONTRACT §12), for an
//! operator at a terminal or a deploy script:
//!
//! ```text
//! portcullis ctl [--admin URL] [--token-file F] [--json] backends
//! portcullis ctl drain app 10.0.0.5:8080 --reason "disk swap" --seconds 3600
//! portcullis ctl claim app 10.0.0.5:8080 --seconds 600 --reason deploy
//! ```
//!
//! Each command is one HTTP request ([`request`]) to the admin listener; the answer is
//! printed readably (or verbatim with `--json`). Exit status: 0 done, 1 refused by the
//! disruption budget (HTTP 409, the answer's reason printed) or failed (unreachable, an
//! HTTP error; the message names the URL and the status), 2 a usage error (clap's, a bad
//! `--admin` URL, an unreadable token file). The token is never printed.

mod client;
mod conf;
mod render;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{json, Map, Value};

pub use client::encode;
use client::{Admin, Answer};

/// `--admin` when neither it nor `PORTCULLIS_ADMIN` is given: the default `admin_listen`.
pub const DEFAULT_ADMIN: &str = "http://127.0.0.1:9090";

/// Exit status of a refusal or a failure.
const EXIT_FAILED: u8 = 1;
/// Exit status of a usage error (as clap's own).
const EXIT_USAGE: u8 = 2;

/// `portcullis ctl`'s arguments.
#[derive(Debug, Args)]
#[command(after_help = "\
Exit status: 0 done; 1 refused by the disruption budget (HTTP 409: the reason is printed) \
or failed (admin API unreachable, an HTTP error); 2 a usage error.

Examples:
  portcullis ctl backends
  portcullis ctl drain app 10.0.0.5:8080 --reason \"disk swap\" --seconds 3600
  portcullis ctl ready app 10.0.0.5:8080
  portcullis ctl --token-file /etc/portcullis/admin.token claim app 10.0.0.5:8080 --seconds 600 --reason deploy")]
pub struct CtlArgs {
    /// Base URL of the admin API (the proxy's `server.admin_listen`); `http://` is assumed
    /// when no scheme is given.
    /// [default: the `--conf` file's `admin_listen`, else http://127.0.0.1:9090]
    #[arg(long, value_name = "URL", env = "PORTCULLIS_ADMIN", global = true)]
    pub admin: Option<String>,
    /// The running proxy's config file: without `--admin`, its `server.admin_listen` is
    /// the admin API (an unspecified address, `0.0.0.0` or `[::]`, is reached on
    /// loopback), and without `--token-file` its `server.admin_token_file` or
    /// `server.admin_token` is the token (what the systemd unit's `ExecReload` uses).
    /// Read leniently: a file that does not parse leaves the defaults (for `reload`, its
    /// parse error is the refusal: exit 1 without asking the proxy).
    #[arg(
        short = 'c',
        long = "conf",
        value_name = "FILE",
        env = "PORTCULLIS_CONF",
        global = true
    )]
    pub conf: Option<PathBuf>,
    /// File holding the admin token (`server.admin_token` or a name of
    /// `server.admin_tokens`), sent as `Authorization: Bearer`; a trailing newline is
    /// removed. Needed for every command but `backends`, `claims` and `feasible` when the
    /// proxy has a token.
    #[arg(
        long,
        value_name = "FILE",
        env = "PORTCULLIS_TOKEN_FILE",
        global = true
    )]
    pub token_file: Option<PathBuf>,
    /// Print the API's JSON answer as it came (refusals too), for scripts.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// List every backend: upstream, address, state, weight, source, by, reason, until.
    Backends,
    /// Drain a backend: no new requests go to it on any instance sharing the store;
    /// in-flight ones finish.
    Drain(Operation),
    /// Maintenance: as drain, and the backend is neither probed nor readmitted
    /// automatically.
    Maint(Operation),
    /// Put a backend back in rotation: clears drain, maint and a manual cull.
    Ready {
        /// The upstream's name (`[[upstreams]] name`).
        upstream: String,
        /// The backend's address, `host:port` (e.g. `10.0.0.5:8080`, `[::1]:80`).
        address: String,
        /// Why, for the journal.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Set a backend's weight on every instance (0: no new requests).
    Weight {
        /// The upstream's name (`[[upstreams]] name`).
        upstream: String,
        /// The backend's address, `host:port` (e.g. `10.0.0.5:8080`, `[::1]:80`).
        address: String,
        /// The new weight, 0 to 1000.
        #[arg(value_parser = clap::value_parser!(u64).range(0..=1000))]
        weight: u64,
        /// Why, for the journal.
        #[arg(long)]
        reason: Option<String>,
        /// The weight lapses by itself after this many seconds (default: until `ready`).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        seconds: Option<u64>,
        /// Pass `max_culled_fraction` (recorded); never the last backend.
        #[arg(long)]
        force: bool,
    },
    /// Claim a backend from the fleet's disruption budget, as a deploy tool does: granted,
    /// it is drained fleet-wide until released or expired; refused, exit 1 with the
    /// policy that refused and when to retry.
    Claim {
        /// The upstream's name (`[[upstreams]] name`).
        upstream: String,
        /// The backend's address, `host:port` (e.g. `10.0.0.5:8080`, `[::1]:80`).
        address: String,
        /// How long the claim lasts unless released.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        seconds: u64,
        /// Why, for the journal.
        #[arg(long)]
        reason: String,
        /// Ask whether it would be granted, changing nothing.
        #[arg(long)]
        dry_run: bool,
        /// Granted past every limit but the last backend; while it lasts, other claims on
        /// the upstream are refused.
        #[arg(long)]
        emergency: bool,
    },
    /// Release a claim before it expires.
    Release {
        /// The claim's id, as `claim` printed it.
        id: String,
    },
    /// List the active claims.
    Claims,
    /// Reload the proxy's config file and wait for the outcome: exit 0 when applied, 1
    /// when refused (the error on stderr; the running config stays), as `POST /reload`.
    Reload,
    /// For each backend of UPSTREAM: would a claim be granted now, and if not which policy
    /// refuses (the audit before a rolling deploy).
    Feasible {
        /// The upstream's name (`[[upstreams]] name`).
        upstream: String,
    },
}

/// The backend and the lease of a drain or maint.
#[derive(Debug, Args)]
pub struct Operation {
    /// The upstream's name (`[[upstreams]] name`).
    pub upstream: String,
    /// The backend's address, `host:port` (e.g. `10.0.0.5:8080`, `[::1]:80`).
    pub address: String,
    /// Why (journaled with who did it).
    #[arg(long)]
    pub reason: String,
    /// The operation lapses by itself after this many seconds (default: until `ready`).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub seconds: Option<u64>,
    /// Pass `max_culled_fraction` (recorded); never the last backend.
    #[arg(long)]
    pub force: bool,
}

/// One request to the admin API: method, path (and query) under the base URL, JSON body.
#[derive(Debug, PartialEq)]
pub struct Request {
    pub method: Method,
    pub path: String,
    pub body: Option<Value>,
}

/// `{"reason": r, "seconds": s, "force": true}`, each only when given.
fn op_body(
    reason: Option<&str>,
    seconds: Option<u64>,
    force: bool,
    extra: Option<(&str, Value)>,
) -> Value {
    let mut m = Map::new();
    if let Some((k, v)) = extra {
        m.insert(k.into(), v);
    }
    if let Some(r) = reason {
        m.insert("reason".into(), r.into());
    }
    if let Some(s) = seconds {
        m.insert("seconds".into(), s.into());
    }
    if force {
        m.insert("force".into(), true.into());
    }
    Value::Object(m)
}

fn backend_path(upstream: &str, address: &str, action: &str) -> String {
    format!(
        "/backends/{}/{}/{action}",
        encode(upstream),
        encode(address)
    )
}

/// The request `cmd` makes.
pub fn request(cmd: &CtlCommand) -> Request {
    let (method, path, body) = match cmd {
        CtlCommand::Backends => (Method::GET, "/backends".to_string(), None),
        CtlCommand::Drain(op) | CtlCommand::Maint(op) => {
            let action = if matches!(cmd, CtlCommand::Drain(_)) {
                "drain"
            } else {
                "maint"
            };
            (
                Method::POST,
                backend_path(&op.upstream, &op.address, action),
                Some(op_body(Some(&op.reason), op.seconds, op.force, None)),
            )
        }
        CtlCommand::Ready {
            upstream,
            address,
            reason,
        } => (
            Method::POST,
            backend_path(upstream, address, "ready"),
            Some(op_body(reason.as_deref(), None, false, None)),
        ),
        CtlCommand::Weight {
            upstream,
            address,
            weight,
            reason,
            seconds,
            force,
        } => (
            Method::POST,
            backend_path(upstream, address, "weight"),
            Some(op_body(
                reason.as_deref(),
                *seconds,
                *force,
                Some(("weight", (*weight).into())),
            )),
        ),
        CtlCommand::Claim {
            upstream,
            address,
            seconds,
            reason,
            dry_run,
            emergency,
        } => (
            Method::POST,
            "/claims".to_string(),
            Some(json!({
                "upstream": upstream,
                "backend": address,
                "seconds": seconds,
                "reason": reason,
                "dry_run": dry_run,
                "emergency": emergency,
            })),
        ),
        CtlCommand::Release { id } => (Method::DELETE, format!("/claims/{}", encode(id)), None),
        CtlCommand::Claims => (Method::GET, "/claims".to_string(), None),
        CtlCommand::Feasible { upstream } => (
            Method::GET,
            format!("/claims/feasible?upstream={}", encode(upstream)),
            None,
        ),
        CtlCommand::Reload => (Method::POST, "/reload".to_string(), None),
    };
    Request { method, path, body }
}

/// Runs `portcullis ctl`: one request, its answer printed; the exit status.
pub fn run(args: &CtlArgs) -> ExitCode {
    let from_conf = args.conf.as_deref().map(conf::read).unwrap_or_default();
    // A reload of a file that is not even TOML: its admin address (and token) cannot be
    // read from it, and the proxy would refuse it anyway. Say why, as the proxy would.
    if let (CtlCommand::Reload, None, Some(path), true) =
        (&args.command, &args.admin, &args.conf, from_conf.unreadable)
    {
        if let Err(e) = crate::config::load(path) {
            let error = json!({ "error": e.to_string() });
            eprintln!("{}", render::reload_refusal(&error));
            return ExitCode::from(EXIT_FAILED);
        }
    }
    let admin_url = args
        .admin
        .clone()
        .or(from_conf.admin)
        .unwrap_or_else(|| DEFAULT_ADMIN.to_string());
    let token = match &args.token_file {
        Some(f) => client::Token::File(f.clone()),
        None => match from_conf.token {
            Some(t) => t,
            None => client::Token::None,
        },
    };
    let admin = match Admin::new(&admin_url, token) {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("error: {msg}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let req = request(&args.command);
    let answer = match admin.send(&req) {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("error: {msg}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    match outcome(&admin, &args.command, &req, &answer) {
        Outcome::Done => {
            if args.json {
                print_raw(&answer.body);
            } else {
                print!("{}", render::done(&args.command, &answer.json()));
            }
            ExitCode::SUCCESS
        }
        Outcome::Refused => {
            if args.json {
                print_raw(&answer.body);
            }
            if matches!(args.command, CtlCommand::Reload) {
                eprintln!("{}", render::reload_refusal(&answer.json()));
            } else {
                eprintln!("{}", render::refusal(&answer.json()));
            }
            ExitCode::from(EXIT_FAILED)
        }
        Outcome::Failed(msg) => {
            eprintln!("error: {msg}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// What an answer means.
#[derive(Debug, PartialEq)]
enum Outcome {
    Done,
    /// The budget said no: 409, or a 2xx answer with `"granted": false` (a dry run).
    Refused,
    /// Anything else: the message to print.
    Failed(String),
}

/// The status and the shape of the answer `cmd` gets when it is done.
fn expected(cmd: &CtlCommand) -> (&'static [u16], fn(&Value) -> bool) {
    fn backend(v: &Value) -> bool {
        v["address"].is_string() && v["state"].is_string()
    }
    match cmd {
        CtlCommand::Backends | CtlCommand::Claims => (&[200], Value::is_array),
        CtlCommand::Drain(_)
        | CtlCommand::Maint(_)
        | CtlCommand::Ready { .. }
        | CtlCommand::Weight { .. } => (&[200], backend),
        // a dry run answers 200 (granted or not), a granted claim 201 with its id
        CtlCommand::Claim { .. } => (&[200, 201], |v| {
            v["granted"] == Value::Bool(true)
                && (v["dry_run"] == Value::Bool(true) || v["id"].is_string())
        }),
        CtlCommand::Release { .. } => (&[200], |v| v["released"].is_string()),
        CtlCommand::Reload => (&[200], |v| v["reloaded"] == Value::Bool(true)),
        CtlCommand::Feasible { .. } => (&[200], |v| v["backends"].is_array()),
    }
}

fn outcome(admin: &Admin, cmd: &CtlCommand, req: &Request, a: &Answer) -> Outcome {
    if !a.marker {
        return Outcome::Failed(format!(
            "{} {} answered {} without the {} header: this is not a portcullis admin API \
             (is --admin, or PORTCULLIS_ADMIN, the proxy's admin_listen and not a proxy port?); \
             nothing was done by ctl",
            req.method,
            admin.shown_url(&req.path),
            a.status,
            client::MARKER,
        ));
    }
    let body = a.json();
    if matches!(cmd, CtlCommand::Reload)
        && a.status.as_u16() == 400
        && body["reloaded"] == Value::Bool(false)
    {
        return Outcome::Refused;
    }
    let refusal = body["granted"] == Value::Bool(false) && body["reason"].is_string();
    if a.status.as_u16() == 409 && refusal {
        return Outcome::Refused;
    }
    let (statuses, shape) = expected(cmd);
    if statuses.contains(&a.status.as_u16()) {
        if a.status.as_u16() == 200 && refusal && matches!(cmd, CtlCommand::Claim { .. }) {
            return Outcome::Refused; // a dry run that would be refused
        }
        if shape(&body) {
            return Outcome::Done;
        }
        return Outcome::Failed(format!(
            "{} {}: {} with an answer ctl does not recognise: {}",
            req.method,
            admin.shown_url(&req.path),
            a.status,
            client::clean(a.body.chars().take(200).collect::<String>().trim())
        ));
    }
    Outcome::Failed(admin.http_error(req, a))
}

/// The body as it came, ending in a newline.
fn print_raw(body: &str) {
    if body.is_empty() {
        return;
    }
    if body.ends_with('\n') {
        print!("{body}");
    } else {
        println!("{body}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Top {
        #[command(subcommand)]
        cmd: Top2,
    }
    #[derive(Debug, Subcommand)]
    enum Top2 {
        Ctl(CtlArgs),
    }

    fn parse(args: &[&str]) -> Result<CtlArgs, clap::Error> {
        let mut all = vec!["portcullis", "ctl"];
        all.extend_from_slice(args);
        Top::try_parse_from(all).map(|t| match t.cmd {
            Top2::Ctl(c) => c,
        })
    }

    fn req(args: &[&str]) -> Request {
        let a = parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        request(&a.command)
    }

    #[test]
    fn backend_actions_encode_the_address_and_send_only_what_was_given() {
        let r = req(&[
            "drain",
            "app",
            "10.0.0.5:8080",
            "--reason",
            "disk swap",
            "--seconds",
            "600",
        ]);
        assert_eq!(r.method, Method::POST);
        assert_eq!(r.path, "/backends/app/10.0.0.5%3A8080/drain");
        assert_eq!(r.body, Some(json!({"reason": "disk swap", "seconds": 600})));

        let r = req(&["maint", "app", "[::1]:80", "--reason", "x", "--force"]);
        assert_eq!(r.path, "/backends/app/%5B%3A%3A1%5D%3A80/maint");
        assert_eq!(r.body, Some(json!({"reason": "x", "force": true})));

        let r = req(&["ready", "app", "h:1"]);
        assert_eq!(
            (r.path.as_str(), r.body),
            ("/backends/app/h%3A1/ready", Some(json!({})))
        );
        let r = req(&["ready", "app", "h:1", "--reason", "fixed"]);
        assert_eq!(r.body, Some(json!({"reason": "fixed"})));

        let r = req(&["weight", "app", "h:1", "0", "--reason", "canary"]);
        assert_eq!(r.path, "/backends/app/h%3A1/weight");
        assert_eq!(r.body, Some(json!({"weight": 0, "reason": "canary"})));

        let r = req(&["backends"]);
        assert_eq!(
            (r.method, r.path.as_str(), r.body),
            (Method::GET, "/backends", None)
        );
    }

    #[test]
    fn claims_requests() {
        let r = req(&[
            "claim",
            "app",
            "10.0.0.5:8080",
            "--seconds",
            "600",
            "--reason",
            "deploy",
        ]);
        assert_eq!(
            (r.method.clone(), r.path.as_str()),
            (Method::POST, "/claims")
        );
        assert_eq!(
            r.body,
            Some(
                json!({"upstream": "app", "backend": "10.0.0.5:8080", "seconds": 600,
                        "reason": "deploy", "dry_run": false, "emergency": false})
            )
        );
        let r = req(&[
            "claim",
            "app",
            "h:1",
            "--seconds",
            "1",
            "--reason",
            "r",
            "--dry-run",
            "--emergency",
        ]);
        let body = r.body.unwrap_or_default();
        assert_eq!(
            (&body["dry_run"], &body["emergency"]),
            (&json!(true), &json!(true))
        );

        let r = req(&["release", "c/1 2"]);
        assert_eq!(
            (r.method, r.path.as_str()),
            (Method::DELETE, "/claims/c%2F1%202")
        );
        let r = req(&["claims"]);
        assert_eq!((r.method, r.path.as_str()), (Method::GET, "/claims"));
        let r = req(&["feasible", "my app&x=1"]);
        assert_eq!(
            (r.method, r.path.as_str()),
            (Method::GET, "/claims/feasible?upstream=my%20app%26x%3D1")
        );
    }

    #[test]
    fn a_409_or_a_dry_run_that_would_be_refused_is_a_refusal() {
        let admin = Admin::new("http://127.0.0.1:1", client::Token::None).unwrap();
        let a = |status: u16, body: &str| Answer {
            status: reqwest::StatusCode::from_u16(status).unwrap(),
            body: body.into(),
            marker: true,
        };
        let o = |args: &[&str], status, body| {
            let cmd = parse(args).unwrap().command;
            outcome(&admin, &cmd, &request(&cmd), &a(status, body))
        };
        let backends = &["backends"][..];
        let claim = &["claim", "app", "h:1", "--seconds", "60", "--reason", "r"][..];
        let drain = &["drain", "app", "h:1", "--reason", "r"][..];
        assert_eq!(o(backends, 200, "[]"), Outcome::Done);
        assert_eq!(
            o(claim, 201, r#"{"id": "00ab", "granted": true}"#),
            Outcome::Done
        );
        assert_eq!(
            o(&["release", "00ab"], 200, r#"{"released": "00ab"}"#),
            Outcome::Done
        );
        assert_eq!(
            o(claim, 409, r#"{"granted": false, "reason": "r"}"#),
            Outcome::Refused
        );
        assert_eq!(
            o(
                claim,
                200,
                r#"{"granted": false, "dry_run": true, "reason": "r"}"#
            ),
            Outcome::Refused
        );
        assert_eq!(
            o(drain, 200, r#"{"address": "h:1", "state": "draining"}"#),
            Outcome::Done
        );
        assert!(
            matches!(o(backends, 503, r#"{"error": "store down"}"#), Outcome::Failed(m) if m.contains("503 Service Unavailable: store down"))
        );
        assert!(
            matches!(o(backends, 404, "not found\n"), Outcome::Failed(m) if m.ends_with("/backends: 404 Not Found: not found"))
        );
    }

    #[test]
    fn a_reload_is_done_applied_and_refused_with_the_error() {
        let admin = Admin::new("http://127.0.0.1:1", client::Token::None).unwrap();
        let cmd = parse(&["reload"]).unwrap().command;
        let req = request(&cmd);
        assert_eq!((req.method.clone(), req.body.clone()), (Method::POST, None));
        let a = |status: u16, body: &str| Answer {
            status: reqwest::StatusCode::from_u16(status).unwrap(),
            body: body.into(),
            marker: true,
        };
        assert_eq!(
            outcome(&admin, &cmd, &req, &a(200, r#"{"reloaded": true}"#)),
            Outcome::Done
        );
        let refused = r#"{"reloaded": false, "error": "error: /etc/p.toml:3:1: rate_limit.limit: must be at least 1"}"#;
        assert_eq!(
            outcome(&admin, &cmd, &req, &a(400, refused)),
            Outcome::Refused
        );
        let v: Value = serde_json::from_str(refused).unwrap();
        assert_eq!(
            render::reload_refusal(&v),
            "reload refused, the running configuration stays: /etc/p.toml:3:1: \
             rate_limit.limit: must be at least 1"
        );
        // the plain-text answer of an older proxy, or a 403: a failure naming the status
        assert!(matches!(
            outcome(&admin, &cmd, &req, &a(400, "error: x\n")),
            Outcome::Failed(m) if m.contains("400 Bad Request: error: x")
        ));
        assert!(matches!(
            outcome(&admin, &cmd, &req, &a(200, "reloaded\n")),
            Outcome::Failed(_)
        ));
    }

    #[test]
    fn an_answer_that_is_not_the_admin_apis_is_a_failure() {
        let admin = Admin::new("http://127.0.0.1:1", client::Token::None).unwrap();
        let claim = parse(&["claim", "app", "h:1", "--seconds", "60", "--reason", "r"])
            .unwrap()
            .command;
        let req = request(&claim);
        // a backend behind the proxy port answers any POST with 200 and its own body
        let proxy_port = Answer {
            status: reqwest::StatusCode::OK,
            body: "hello from demo backend\n".into(),
            marker: false,
        };
        assert!(
            matches!(outcome(&admin, &claim, &req, &proxy_port), Outcome::Failed(m) if m.contains("not a portcullis admin API"))
        );
        // marked, but the wrong status or shape for the action
        for (status, body) in [
            (200, r#"{"granted": true}"#),
            (202, r#"{"id": "00ab", "granted": true}"#),
            (200, "[]"),
        ] {
            let a = Answer {
                status: reqwest::StatusCode::from_u16(status).unwrap(),
                body: body.into(),
                marker: true,
            };
            assert!(
                matches!(outcome(&admin, &claim, &req, &a), Outcome::Failed(_)),
                "{status} {body}"
            );
        }
    }

    #[test]
    fn usage_errors_are_clap_errors() {
        for bad in [
            &["drain", "app", "h:1"][..],                  // no --reason
            &["claim", "app", "h:1", "--reason", "r"][..], // no --seconds
            &["claim", "app", "h:1", "--seconds", "0", "--reason", "r"][..],
            &["weight", "app", "h:1", "1001"][..],
            &["weight", "app", "h:1", "-1"][..],
            &["drain", "app", "h:1", "--reason", "r", "--seconds", "x"][..],
            &["frobnicate"][..],
            &[][..],
        ] {
            let e = parse(bad).err().unwrap_or_else(|| panic!("{bad:?} parsed"));
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
        }
        // global flags go before or after the command
        let a = parse(&["backends", "--json", "--admin", "http://h:1"]).unwrap();
        assert!(a.json);
        assert_eq!(a.admin.as_deref(), Some("http://h:1"));
        let a = parse(&["reload", "-c", "/etc/portcullis/portcullis.toml"]).unwrap();
        assert_eq!(
            a.conf.as_deref(),
            Some(std::path::Path::new("/etc/portcullis/portcullis.toml"))
        );
        assert_eq!(request(&a.command).path, "/reload");
    }
}
