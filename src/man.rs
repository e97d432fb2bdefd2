//! The man pages, generated from what they describe: `portcullis(8)` and
//! `portcullis-ctl(1)` from the command line's own definition (`clap_mangen`), and
//! `portcullis.toml(5)` from the config types (`config::reference`). `docs/man/` holds
//! their output, which the Debian package installs; a test keeps them equal.

use clap::{Arg, Command};
use clap_mangen::Man;
use portcullis::config::reference::roff_text;

/// The pages `--print-man` knows.
pub const NAMES: [&str; 3] = ["portcullis", "portcullis.toml", "portcullis-ctl"];

/// The page `name` in roff; `cli` is the whole command line.
pub fn render(cli: Command, name: &str) -> Result<String, String> {
    let version = cli.get_version().unwrap_or_default().to_string();
    match name {
        "portcullis" => proxy_page(cli),
        "portcullis.toml" => Ok(portcullis::config::reference::man_page(&version)),
        "portcullis-ctl" => ctl_page(cli),
        other => Err(format!("no man page {other:?} (one of {NAMES:?})")),
    }
}

fn roff(f: impl Fn(&mut Vec<u8>) -> std::io::Result<()>) -> Result<String, String> {
    let mut buf = Vec::new();
    f(&mut buf).map_err(|e| e.to_string())?;
    String::from_utf8(buf).map_err(|e| e.to_string())
}

/// `.SH TITLE` and paragraphs (Markdown code spans become bold).
fn section(title: &str, paragraphs: &[&str]) -> String {
    let mut s = format!(".SH {title}\n");
    for (i, p) in paragraphs.iter().enumerate() {
        if i > 0 {
            s.push_str(".PP\n");
        }
        s.push_str(&roff_text(p));
        s.push('\n');
    }
    s
}

/// A man page section's list: a tag and what it means.
type Items = &'static [(&'static str, &'static str)];

/// `.TP` items: (tag, text).
fn items(title: &str, list: &[(&str, &str)]) -> String {
    let mut s = format!(".SH {title}\n");
    for (tag, text) in list {
        s.push_str(&format!(".TP\n{}\n{}\n", roff_text(tag), roff_text(text)));
    }
    s
}

/// portcullis(8)'s prose: what the options and the command line do not say.
const PROXY_DESCRIPTION: &[&str] = &[
    "portcullis is an HTTP/1.1 and HTTP/2 edge proxy built on Pingora, put in front of \
         HTTP services where HAProxy would be. Besides routing and balancing it keeps a \
         fleet healthy with three gates: load shedding (a cap on requests in flight, by \
         priority class: 503 with `Retry-After`), per-API-key rate limiting with one limit \
         across the fleet (counts shared through Redis, decided from local memory: 429 \
         with `Retry-After` and the `RateLimit` fields), and upstream culling under a \
         fleet-wide disruption budget (failing backends ejected through a lease every \
         instance sees, never the last one).",
    "The proxy reads its configuration from the file given with `-c` (see \
         portcullis.toml(5)), serves the proxy listeners and an admin listener \
         (`/healthz`, `/readyz`, `/metrics`, `/status`, `POST /reload` and the runtime \
         API that `portcullis ctl` drives, see portcullis-ctl(1)). Without a `[redis]` \
         section it runs as a single instance with in-process stores.",
];

const PROXY_COMMANDS: Items = &[(
    "portcullis ctl ...",
    "Drive a running proxy through its admin API: list backends; drain, maintain, \
         readmit or reweight one; claim one from the disruption budget. See \
         portcullis-ctl(1).",
)];

const PROXY_SIGNALS: Items = &[
    (
        "SIGTERM",
        "Graceful shutdown: `/readyz` answers 503 at once while requests are still \
             proxied for `server.drain_seconds` (with `Connection: close`); then the \
             listeners close and the process exits as soon as nothing is in flight, or \
             after `server.shutdown_timeout_seconds`.",
    ),
    (
        "SIGQUIT",
        "Zero-downtime upgrade: once a new process started with `-u` listens on \
             `server.upgrade_sock` (waited for up to 5 s), hand it the listeners, then \
             drain and exit. Without a new process it logs why and stays up.",
    ),
    (
        "SIGHUP",
        "Reload the configuration file (as `POST /reload`): routes, backends, caps, \
             limits and culling parameters apply without a restart; an invalid file keeps \
             the configuration in force. Listener, thread and Redis changes need an \
             upgrade.",
    ),
    ("SIGINT", "Fast exit."),
    (
        "SIGUSR1",
        "Reopen the access log file (`[access_log] path`), after logrotate.",
    ),
];

const PROXY_EXIT_STATUS: Items = &[
    (
        "0",
        "The proxy stopped normally, or `--check` found the file valid (it prints OK).",
    ),
    (
        "2",
        "The configuration is invalid or unreadable: the error names the file, the \
             line and column, and the key path (`error: FILE:LINE:COL: key.path: \
             reason`).",
    ),
];

const PROXY_ENVIRONMENT: Items = &[
    (
        "RUST_LOG",
        "Filter of the process log (default `info`); Pingora's own crates are capped \
             at `info`.",
    ),
    (
        "NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID",
        "Under systemd (`Type=notify`) the proxy says `READY=1`, `RELOADING=1`, \
             `STOPPING=1` and, with `WatchdogSec=`, `WATCHDOG=1`.",
    ),
    (
        "Any variable named in the file",
        "String values may hold `${NAME}` or `${NAME:-default}`, read whenever the \
             file is read.",
    ),
];

const PROXY_FILES: Items = &[
    (
        "/etc/portcullis/portcullis.toml",
        "The configuration of the Debian package's `portcullis.service`.",
    ),
    (
        "conf/portcullis.toml",
        "The default of `-c`, relative to the working directory.",
    ),
];

fn proxy_page(cli: Command) -> Result<String, String> {
    let cmd = cli.clone().bin_name("portcullis");
    let man = Man::new(cmd).section("8").manual("System Administration");
    let mut page = roff(|w| {
        man.render_title(w)?;
        man.render_name_section(w)?;
        man.render_synopsis_section(w)?;
        Ok(())
    })?;
    page.push_str(&section("DESCRIPTION", PROXY_DESCRIPTION));
    page.push_str(&roff(|w| man.render_options_section(w))?);
    page.push_str(&items("COMMANDS", PROXY_COMMANDS));
    page.push_str(&items("SIGNALS", PROXY_SIGNALS));
    page.push_str(&items("EXIT STATUS", PROXY_EXIT_STATUS));
    page.push_str(&items("ENVIRONMENT", PROXY_ENVIRONMENT));
    page.push_str(&items("FILES", PROXY_FILES));
    page.push_str(".SH SEE ALSO\n\\fBportcullis.toml\\fR(5), \\fBportcullis\\-ctl\\fR(1)\n");
    Ok(page)
}

/// `--reason <REASON>`, or `<UPSTREAM>` for a positional argument.
fn arg_tag(a: &Arg) -> String {
    let value = a
        .get_value_names()
        .and_then(|v| v.first())
        .map(|v| v.to_string())
        .unwrap_or_else(|| a.get_id().as_str().to_uppercase());
    if a.is_positional() {
        return format!("<{value}>");
    }
    let flag = match (a.get_long(), a.get_short()) {
        (Some(l), _) => format!("--{l}"),
        (None, Some(s)) => format!("-{s}"),
        (None, None) => a.get_id().to_string(),
    };
    let takes_value = a.get_num_args().is_some_and(|n| n.takes_values())
        && !matches!(
            a.get_action(),
            clap::ArgAction::SetTrue | clap::ArgAction::SetFalse
        );
    if takes_value {
        format!("{flag} <{value}>")
    } else {
        flag
    }
}

/// portcullis-ctl(1)'s prose: what the subcommands' own help does not say.
const CTL_DESCRIPTION: &[&str] = &[
    "The command-line client of a running portcullis proxy's runtime API, for an \
         operator at a terminal or a deploy script. Each command is one HTTP request to \
         the admin listener (`GET /backends`, `POST \
         /backends/{upstream}/{address}/{drain|maint|ready|weight}`, `/claims`); the \
         answer is printed readably, or as it came with `--json`. Every action is \
         checked against the fleet's disruption budget, the same one automatic culls \
         spend, and journaled with who did it.",
    "The backend address goes into the path percent-encoded (`10.0.0.5%3A8080`). An \
         answer counts as done only with the status and shape its action answers and the \
         admin API's `X-Portcullis-Admin` header: pointed at a proxy port by mistake, \
         `ctl` says so and exits 1. The token is never printed; control, line-separator \
         and bidirectional-formatting characters in what it prints become spaces.",
];

const CTL_EXIT_STATUS: Items = &[
    ("0", "Done."),
    (
        "1",
        "Refused by the disruption budget (HTTP 409: the answer's reason and policy \
             are printed on stderr), or failed: the admin API unreachable, timed out \
             after 10 s, an HTTP error (the message names the method, the URL and the \
             status), or an answer that is not the admin API's.",
    ),
    (
        "2",
        "A usage error: a missing argument, a bad `--admin` URL, an unreadable token \
             file (a token file must be a regular file of at most 64 KiB).",
    ),
];

const CTL_ENVIRONMENT: Items = &[
    ("PORTCULLIS_ADMIN", "The default of `--admin`."),
    ("PORTCULLIS_TOKEN_FILE", "The default of `--token-file`."),
];

const CTL_EXAMPLES: &[&str] = &[
    "portcullis ctl backends",
    "portcullis ctl drain app 10.0.0.5:8080 --reason \"disk swap\" --seconds 3600",
    "portcullis ctl ready app 10.0.0.5:8080",
    "portcullis ctl weight app 10.0.0.6:8080 0 --reason \"canary off\"",
    "portcullis ctl feasible app",
    "ID=$(portcullis ctl --json claim app 10.0.0.5:8080 --seconds 600 --reason deploy | jq -r .id)",
    "portcullis ctl release \"$ID\"",
];

fn ctl_page(cli: Command) -> Result<String, String> {
    let mut cli = cli;
    cli.build();
    let ctl = cli
        .find_subcommand("ctl")
        .cloned()
        .ok_or("the command line has no ctl")?
        .name("portcullis-ctl")
        .bin_name("portcullis ctl")
        .version(env!("CARGO_PKG_VERSION"));
    let man = Man::new(ctl.clone()).section("1").manual("User Commands");
    let mut page = roff(|w| {
        man.render_title(w)?;
        man.render_name_section(w)?;
        man.render_synopsis_section(w)?;
        Ok(())
    })?;
    page.push_str(&section("DESCRIPTION", CTL_DESCRIPTION));
    page.push_str(&roff(|w| man.render_options_section(w))?);
    page.push_str(".SH COMMANDS\n");
    for sub in ctl.get_subcommands().filter(|s| s.get_name() != "help") {
        page.push_str(&ctl_command(sub));
    }
    page.push_str(&items("EXIT STATUS", CTL_EXIT_STATUS));
    page.push_str(&items("ENVIRONMENT", CTL_ENVIRONMENT));
    page.push_str(".SH EXAMPLES\n.nf\n");
    for line in CTL_EXAMPLES {
        page.push_str(&roff_text(line));
        page.push('\n');
    }
    page.push_str(".fi\n");
    page.push_str(".SH SEE ALSO\n\\fBportcullis\\fR(8), \\fBportcullis.toml\\fR(5)\n");
    Ok(page)
}

/// One `ctl` subcommand's entry: its synopsis, what it does, and each argument.
fn ctl_command(sub: &Command) -> String {
    let args: Vec<&Arg> = sub
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !a.is_global_set())
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .collect();
    let mut synopsis = format!("portcullis ctl {}", sub.get_name());
    for a in &args {
        let tag = arg_tag(a);
        if a.is_required_set() || a.is_positional() {
            synopsis.push_str(&format!(" {tag}"));
        } else {
            synopsis.push_str(&format!(" [{tag}]"));
        }
    }
    let mut entry = format!(".SS \"{}\"\n", roff_text(&synopsis));
    if let Some(about) = sub.get_about() {
        entry.push_str(&roff_text(&about.to_string()));
        entry.push('\n');
    }
    for a in args {
        let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
        entry.push_str(&format!(
            ".TP\n\\fB{}\\fR\n{}\n",
            roff_text(&arg_tag(a)),
            roff_text(&help)
        ));
    }
    entry
}
