//! Log setup: one line per event on stderr, filtered by `RUST_LOG`, with a rule
//! that holds whatever `RUST_LOG` says (CONTRACT §1, §7, §16).
//!
//! - **The format is `[log] format`**, chosen once at start ([`Format::choose`]): `json`
//!   (one JSON object per line), `text` (one readable line per event: time, level,
//!   target, message, then the same fields as `key=value`), or `auto`, text when
//!   stderr is a terminal (a person is reading) and JSON otherwise (a file, a pipe,
//!   journald, a container runtime). Both go through the same filter below.
//!
//! - **Pingora's crates are capped at info.** Their debug and trace lines print
//!   whole request headers and raw header buffers (API keys, query strings,
//!   `Authorization`, `Cookie`). The cap is a filter of its own, checked after
//!   `RUST_LOG`'s, so no directive (`pingora_proxy::proxy_h1=trace`, …) can
//!   lift it. Pingora logs through the `log` crate: its records reach tracing
//!   through `tracing-log`, whose events carry the real module in the
//!   `log.target` field; the cap reads it from there.
//!
//! A client hanging up is not an error: Pingora reads the request header before any
//! `ProxyHttp` hook runs, and the vendored pingora-proxy logs a client that leaves
//! mid-header at debug (vendor/patches, `header-phase-client-gone`), not at ERROR. The
//! abort is counted in `portcullis_client_aborts_total` by the edge stream, which sees the
//! client leave mid-header (`edge::stream::EdgeStream::count_aborts`); aborts later in
//! the request are counted from Pingora's error kind (`Proxy::fail_to_proxy`). Nothing
//! here reads a log line's text.

use crate::config::LogFormat;
use std::fmt;
use std::io::IsTerminal;
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{span, Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Filter, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry};

/// The most verbose level let through from Pingora's crates.
pub const PINGORA_CAP: Level = Level::INFO;

/// Whether `target` (a module path) belongs to one of Pingora's crates.
pub fn is_pingora(target: &str) -> bool {
    target.starts_with("pingora")
}

/// Whether an event of `level` from `target` passes the Pingora cap.
pub fn under_cap(target: &str, level: &Level) -> bool {
    !is_pingora(target) || *level <= PINGORA_CAP
}

/// The field of an event that the filter needs: the real target of a `log`-crate
/// record.
#[derive(Default)]
struct Fields {
    log_target: Option<String>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "log.target" {
            self.log_target = Some(value.to_string());
        }
    }

    fn record_debug(&mut self, _field: &Field, _value: &dyn fmt::Debug) {}
}

impl Fields {
    fn of(event: &Event<'_>) -> Self {
        let mut f = Fields::default();
        event.record(&mut f);
        f
    }

    fn target<'a>(&'a self, meta: &'a Metadata<'_>) -> &'a str {
        self.log_target.as_deref().unwrap_or(meta.target())
    }
}

/// `RUST_LOG` (an [`EnvFilter`]), then the cap on Pingora's crates. One filter
/// rather than two stacked ones: a second per-layer filter on the same layer did
/// not veto events.
struct CappedEnv {
    env: EnvFilter,
}

impl<S> Filter<S> for CappedEnv
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn enabled(&self, meta: &Metadata<'_>, cx: &Context<'_, S>) -> bool {
        under_cap(meta.target(), meta.level()) && Filter::<S>::enabled(&self.env, meta, cx)
    }

    fn event_enabled(&self, event: &Event<'_>, cx: &Context<'_, S>) -> bool {
        let meta = event.metadata();
        let fields = Fields::of(event);
        let target = fields.target(meta);
        under_cap(target, meta.level()) && Filter::<S>::event_enabled(&self.env, event, cx)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if !under_cap(meta.target(), meta.level()) {
            return Interest::never();
        }
        // `log` records share a few static callsites: decide per event.
        match Filter::<S>::callsite_enabled(&self.env, meta) {
            i if i.is_never() => i,
            _ => Interest::sometimes(),
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Filter::<S>::max_level_hint(&self.env)
    }

    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, cx: Context<'_, S>) {
        Filter::<S>::on_new_span(&self.env, attrs, id, cx)
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, cx: Context<'_, S>) {
        Filter::<S>::on_record(&self.env, id, values, cx)
    }

    fn on_enter(&self, id: &span::Id, cx: Context<'_, S>) {
        Filter::<S>::on_enter(&self.env, id, cx)
    }

    fn on_exit(&self, id: &span::Id, cx: Context<'_, S>) {
        Filter::<S>::on_exit(&self.env, id, cx)
    }

    fn on_close(&self, id: span::Id, cx: Context<'_, S>) {
        Filter::<S>::on_close(&self.env, id, cx)
    }
}

/// The format the process's own log lines are written in, once `auto` is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Text,
}

impl Format {
    /// `[log] format`, with `auto` decided by whether stderr is a terminal.
    pub fn choose(configured: LogFormat, stderr_is_terminal: bool) -> Self {
        match configured {
            LogFormat::Json => Format::Json,
            LogFormat::Text => Format::Text,
            LogFormat::Auto if stderr_is_terminal => Format::Text,
            LogFormat::Auto => Format::Json,
        }
    }
}

/// `RUST_LOG` (default `info`) under the Pingora cap.
fn capped_env() -> CappedEnv {
    let env = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    CappedEnv { env }
}

/// The sd-daemon(3) priority prefix of a line at `level` (`<3>` error, `<4>` warning,
/// `<6>` info, `<7>` debug and trace): journald reads it off each line of a stream and
/// stores the line at that priority, so `journalctl -p warning` shows warnings and worse.
pub fn priority_prefix(level: &Level) -> &'static [u8] {
    match *level {
        Level::ERROR => b"<3>",
        Level::WARN => b"<4>",
        Level::INFO => b"<6>",
        Level::DEBUG | Level::TRACE => b"<7>",
    }
}

/// Whether stderr is the journal's stream: `JOURNAL_STREAM` (`<device>:<inode>`, set by
/// systemd for a unit whose output goes to the journal) names stderr's own device and
/// inode, as sd-daemon(3) says to check (a child whose stderr was redirected inherits the
/// variable but not the stream).
pub fn stderr_is_journal(journal_stream: Option<&str>) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some((dev, ino)) = journal_stream.and_then(|v| v.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    std::fs::metadata("/proc/self/fd/2").is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

/// stderr, each event's line prefixed with its level's [`priority_prefix`] when `journal`.
#[derive(Clone, Copy)]
struct Stderr {
    journal: bool,
}

/// One event's writer: the prefix goes before its first byte.
struct PrefixedStderr {
    prefix: &'static [u8],
}

impl std::io::Write for PrefixedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        // One write of prefix and line (the formatter hands the whole line at once), so
        // that lines of two threads never interleave between prefix and text.
        let prefix = std::mem::take(&mut self.prefix);
        if prefix.is_empty() {
            return std::io::stderr().lock().write_all(buf);
        }
        let mut line = Vec::with_capacity(prefix.len() + buf.len());
        line.extend_from_slice(prefix);
        line.extend_from_slice(buf);
        std::io::stderr().lock().write_all(&line)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Stderr {
    type Writer = PrefixedStderr;

    fn make_writer(&'a self) -> Self::Writer {
        PrefixedStderr { prefix: b"" }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Self::Writer {
        PrefixedStderr {
            prefix: if self.journal {
                priority_prefix(meta.level())
            } else {
                b""
            },
        }
    }
}

/// Installs the subscriber (and the `log` bridge) writing `format` (`[log] format`) to
/// stderr. Call once, before Pingora starts; a reload does not change the format.
/// Under journald ([`stderr_is_journal`]) each line starts with its priority.
pub fn init(format: LogFormat) {
    let terminal = std::io::stderr().is_terminal();
    let stderr = Stderr {
        journal: stderr_is_journal(std::env::var("JOURNAL_STREAM").ok().as_deref()),
    };
    let layer: Box<dyn Layer<Registry> + Send + Sync> = match Format::choose(format, terminal) {
        Format::Json => Box::new(
            tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_writer(stderr)
                .with_filter(capped_env()),
        ),
        // Colours only for a terminal: `text` forced into a file stays plain.
        Format::Text => Box::new(
            tracing_subscriber::fmt::layer()
                .with_ansi(terminal)
                .with_writer(stderr)
                .with_filter(capped_env()),
        ),
    };
    let _ = tracing_subscriber::registry().with(layer).try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_holds_for_every_pingora_module() {
        for target in [
            "pingora",
            "pingora_core",
            "pingora_core::protocols::http::v1::server",
            "pingora_proxy::proxy_h1",
            "pingora_load_balancing::health_check",
        ] {
            assert!(under_cap(target, &Level::INFO), "{target}");
            assert!(under_cap(target, &Level::ERROR), "{target}");
            assert!(!under_cap(target, &Level::DEBUG), "{target}");
            assert!(!under_cap(target, &Level::TRACE), "{target}");
        }
        assert!(under_cap("portcullis::proxy", &Level::TRACE));
        assert!(under_cap("redis", &Level::DEBUG));
    }

    #[test]
    fn priorities_are_sd_daemons() {
        assert_eq!(priority_prefix(&Level::ERROR), b"<3>");
        assert_eq!(priority_prefix(&Level::WARN), b"<4>");
        assert_eq!(priority_prefix(&Level::INFO), b"<6>");
        assert_eq!(priority_prefix(&Level::DEBUG), b"<7>");
        assert_eq!(priority_prefix(&Level::TRACE), b"<7>");
    }

    #[test]
    fn journal_stream_must_name_stderr_itself() {
        use std::os::unix::fs::MetadataExt;
        assert!(!stderr_is_journal(None));
        assert!(!stderr_is_journal(Some("")));
        assert!(!stderr_is_journal(Some("x:y")));
        assert!(!stderr_is_journal(Some("1:2")));
        let Ok(m) = std::fs::metadata("/proc/self/fd/2") else {
            return;
        };
        let own = format!("{}:{}", m.dev(), m.ino());
        assert!(stderr_is_journal(Some(&own)));
        let other = format!("{}:{}", m.dev(), m.ino().wrapping_add(1));
        assert!(!stderr_is_journal(Some(&other)));
    }

    #[test]
    fn auto_is_text_on_a_terminal_and_json_otherwise() {
        assert_eq!(Format::choose(LogFormat::Auto, true), Format::Text);
        assert_eq!(Format::choose(LogFormat::Auto, false), Format::Json);
        for terminal in [true, false] {
            assert_eq!(Format::choose(LogFormat::Json, terminal), Format::Json);
            assert_eq!(Format::choose(LogFormat::Text, terminal), Format::Text);
        }
    }
}
