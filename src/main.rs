//! The `portcullis` binary: CLI → config → server → run.

use clap::{CommandFactory, Parser, Subcommand};

mod man;

// jemalloc instead of glibc malloc: Pingora allocates per request (headers,
// buffers) from several threads; BENCHMARKS.md has the A/B (jemalloc 0.85x
// the CPU per request of glibc, mimalloc 0.88x).
// The `system-alloc` feature (profiling only) keeps the system allocator.
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
use std::path::PathBuf;
use std::process::ExitCode;

/// HTTP edge proxy with load shedding, Redis-shared rate limiting and budgeted upstream culling.
#[derive(Parser, Debug)]
#[command(
    name = "portcullis",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// Configuration file (TOML).
    #[arg(short = 'c', long = "conf", default_value = "conf/portcullis.toml")]
    conf: PathBuf,
    /// Validate the configuration, print OK and exit.
    #[arg(long)]
    check: bool,
    /// Start as the new process of a zero-downtime upgrade: take over the
    /// listeners of the running process through `server.upgrade_sock`.
    #[arg(short = 'u', long = "upgrade")]
    upgrade: bool,
    /// Print the JSON Schema (draft 2020-12) of the configuration file and exit
    /// (conf/portcullis.schema.json is its output, for editors).
    #[arg(long, conflicts_with_all = ["check", "upgrade"])]
    print_config_schema: bool,
    /// Print the configuration reference (Markdown: every key with its type, default,
    /// allowed values and description) and exit (docs/src/reference/config.md is its
    /// output).
    #[arg(long, conflicts_with_all = ["check", "upgrade", "print_config_schema"])]
    print_config_reference: bool,
    /// Print a man page in roff and exit: portcullis (8), portcullis.toml (5) or
    /// portcullis-ctl (1) (docs/man/ holds their output).
    #[arg(long, value_name = "NAME", value_parser = man::NAMES,
          conflicts_with_all = ["check", "upgrade", "print_config_schema", "print_config_reference"])]
    print_man: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Control a running proxy through its admin API: list backends; drain, maintain,
    /// readmit or reweight one; claim one from the disruption budget (`ctl --help`).
    Ctl(portcullis::ctl::CtlArgs),
    /// Translate an HAProxy configuration into a portcullis one; one report line per
    /// directive on stderr (exit 0: all translated, 3: some approximated or unsupported,
    /// 2: unreadable or unparsable).
    ImportHaproxy(ImportArgs),
}

#[derive(clap::Args, Debug)]
struct ImportArgs {
    /// The HAProxy configuration (haproxy.cfg).
    file: PathBuf,
    /// Write the portcullis configuration here (and the `errorfile` page bodies in
    /// OUT's directory, under `errors/`) instead of stdout.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn import_haproxy(args: &ImportArgs) -> ExitCode {
    use portcullis::import::haproxy as hx;
    let text = match std::fs::read(&args.file) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => {
            eprintln!("{}: {e}", args.file.display());
            return ExitCode::from(2);
        }
    };
    // the `errorfile` page bodies go beside the output, named by absolute path in it
    let pages_dir = args.out.as_ref().map(|o| {
        let dir = o.parent().filter(|p| !p.as_os_str().is_empty());
        let errors = dir
            .map(|d| d.join("errors"))
            .unwrap_or_else(|| PathBuf::from("errors"));
        std::path::absolute(&errors)
            .unwrap_or(errors)
            .display()
            .to_string()
    });
    let read = |p: &str| std::fs::read(p).ok();
    let opts = hx::Options {
        read_file: &read,
        pages_dir,
    };
    let env = |n: &str| std::env::var(n).ok();
    let t = match hx::import(&text, &env, &opts) {
        hx::Outcome::Done(t) => t,
        hx::Outcome::Unparsable(e) => {
            eprintln!("{}: {e}", args.file.display());
            return ExitCode::from(2);
        }
    };
    for l in &t.report {
        eprintln!("{l}");
    }
    let (ok, approx, unsup) = hx::counts(&t.report);
    eprintln!("{ok} translated, {approx} approximated, {unsup} unsupported");
    for (path, body) in &t.pages {
        let p = std::path::Path::new(path);
        if let Some(d) = p.parent() {
            if let Err(e) = std::fs::create_dir_all(d) {
                eprintln!("{}: {e}", d.display());
                return ExitCode::from(2);
            }
        }
        if let Err(e) = std::fs::write(p, body) {
            eprintln!("{path}: {e}");
            return ExitCode::from(2);
        }
    }
    match &args.out {
        Some(o) => {
            if let Err(e) = std::fs::write(o, &t.toml) {
                eprintln!("{}: {e}", o.display());
                return ExitCode::from(2);
            }
        }
        None => print!("{}", t.toml),
    }
    ExitCode::from(hx::exit_code(&t))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Some(Command::Ctl(args)) => return portcullis::ctl::run(args),
        Some(Command::ImportHaproxy(args)) => return import_haproxy(args),
        None => {}
    }
    if cli.print_config_reference {
        print!("{}", portcullis::config::reference::markdown());
        return ExitCode::SUCCESS;
    }
    if let Some(name) = &cli.print_man {
        return match man::render(Cli::command(), name) {
            Ok(page) => {
                print!("{page}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        };
    }
    if cli.print_config_schema {
        print!("{}", portcullis::config::json_schema());
        return ExitCode::SUCCESS;
    }
    let config = match portcullis::state::resolve::load(&cli.conf) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if cli.check {
        // Cluster seeds and sentinels are asked, within a bound, whether they are what the
        // file says (a cluster; a sentinel knowing `master_name`). Unreachable: a warning.
        if let Some(s) = &config.store {
            let bound = s.timeout.clamp(
                std::time::Duration::from_millis(500),
                std::time::Duration::from_secs(2),
            );
            match portcullis_store::probe_blocking(&s.endpoint, bound) {
                Ok(None) => {}
                Ok(Some(note)) => eprintln!(
                    "warning: {}: {}",
                    cli.conf.display(),
                    portcullis::config::redact_note(&cli.conf, &note)
                ),
                Err((key, why)) => {
                    eprintln!("{}", portcullis::config::error_at(&cli.conf, &key, &why));
                    return ExitCode::from(2);
                }
            }
        }
        println!("OK");
        return ExitCode::SUCCESS;
    }
    portcullis::logging::init(config.log.format);
    portcullis::server::run(config, cli.conf, cli.upgrade);
    ExitCode::SUCCESS
}
