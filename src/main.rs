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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Ctl(args)) = &cli.command {
        return portcullis::ctl::run(args);
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
            match portcullis::store::probe_blocking(&s.endpoint, bound) {
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
