//! Log setup: one JSON line per event on stderr, filtered by `RUST_LOG`, with
//! two rules that hold whatever `RUST_LOG` says (CONTRACT §1, §7):
//!
//! - **Pingora's crates are capped at info.** Their debug and trace lines print
//!   whole request headers and raw header buffers (API keys, query strings,
//!   `Authorization`, `Cookie`). The cap is a filter of its own, checked after
//!   `RUST_LOG`'s, so no directive (`pingora_proxy::proxy_h1=trace`, …) can
//!   lift it. Pingora logs through the `log` crate: its records reach tracing
//!   through `tracing-log`, whose events carry the real module in the
//!   `log.target` field; the cap reads it from there.
//! - **A client hanging up is not an error.** Pingora 0.9.1 reads the request
//!   header before any `ProxyHttp` hook runs, and reports a client that hangs up
//!   mid-header only with an ERROR line ("Fail to proxy: … while reading request
//!   headers"): its error reaches no proxy phase. That line is dropped here. The
//!   abort is counted in `portcullis_client_aborts_total` (and logged at debug)
//!   by the edge stream, which sees the client leave mid-header
//!   (`edge::stream::EdgeStream::count_aborts`), not from this log text. Aborts
//!   later in the request are counted from Pingora's error kind
//!   (`Proxy::fail_to_proxy`).

use std::fmt;
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{span, Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Filter, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

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

/// Whether a Pingora log line reports a client that went away before its
/// request header was complete (or before the 400 for it could be written):
/// such a line is dropped (the abort is counted by the edge stream).
pub fn is_header_phase_abort(target: &str, level: &Level, message: &str) -> bool {
    target.starts_with("pingora_proxy")
        && *level == Level::ERROR
        && (message.contains("while reading request headers")
            || message.starts_with("failed to send error response to downstream"))
}

/// The fields of an event that the filters need: the real target of a
/// `log`-crate record and the message.
#[derive(Default)]
struct Fields {
    log_target: Option<String>,
    message: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "log.target" => self.log_target = Some(value.to_string()),
            "message" => self.message = value.to_string(),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
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

/// `RUST_LOG` (an [`EnvFilter`]), then the cap on Pingora's crates and the
/// drop of header-phase client aborts. One filter rather than two stacked
/// ones: a second per-layer filter on the same layer did not veto events.
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
        under_cap(target, meta.level())
            && !is_header_phase_abort(target, meta.level(), &fields.message)
            && Filter::<S>::event_enabled(&self.env, event, cx)
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

/// Installs the subscriber (and the `log` bridge). Call once, before Pingora starts.
pub fn init() {
    let env = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_writer(std::io::stderr)
        .with_filter(CappedEnv { env });
    let _ = tracing_subscriber::registry().with(fmt).try_init();
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
    fn header_phase_aborts_are_recognised() {
        // The exact text Pingora 0.9.1 logs (pingora-proxy src/lib.rs, handle_new_request).
        let msg = "Fail to proxy: Downstream ConnectionClosed context: while reading request headers, bytes already read: 113, downstream session type: h1";
        assert!(is_header_phase_abort("pingora_proxy", &Level::ERROR, msg));
        let reset = "Fail to proxy: Downstream ReadError context: while reading request headers cause: Connection reset by peer (os error 104), downstream session type: h1";
        assert!(is_header_phase_abort("pingora_proxy", &Level::ERROR, reset));
        assert!(is_header_phase_abort(
            "pingora_proxy",
            &Level::ERROR,
            "failed to send error response to downstream: WriteError"
        ));
        // an upstream failure stays an error
        let upstream = "Fail to proxy: Upstream ConnectionClosed context: while reading response headers, bytes already read: 0";
        assert!(!is_header_phase_abort(
            "pingora_proxy",
            &Level::ERROR,
            upstream
        ));
        assert!(!is_header_phase_abort(
            "portcullis::proxy",
            &Level::ERROR,
            msg
        ));
        assert!(!is_header_phase_abort("pingora_proxy", &Level::WARN, msg));
    }
}
