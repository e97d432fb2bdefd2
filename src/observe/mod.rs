//! Observability beside the request path: the JSON access log
//! ([`access_log`]), W3C trace context ([`trace`]), the admin HTML status page
//! ([`status_page`]) and the journal of recent cull decisions it shows
//! ([`journal`]). Metrics live in [`crate::metrics`].

pub mod access_log;
pub mod journal;
pub mod request;
pub mod status_page;
pub mod time;
pub mod trace;

pub use access_log::{AccessLog, AccessRecord};
pub use journal::CullJournal;
pub use request::{finish, Finished, RequestObs};
pub use trace::TraceContext;

/// The observability state a [`crate::state::Shared`] holds.
pub struct Observe {
    pub access_log: AccessLog,
    pub culls: CullJournal,
}

impl Observe {
    pub fn new(settings: &crate::config::AccessLogSettings) -> Self {
        Self {
            access_log: AccessLog::new(settings),
            culls: CullJournal::default(),
        }
    }
}
