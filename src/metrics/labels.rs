//! The closed label values of the request, culling and edge metrics: every label a request
//! can put on a series comes from one of these enums (never from a request value).

/// Result of one cull decision (`portcullis_cull_decisions_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CullResult {
    Culled,
    NoToken,
    OverBudget,
    StoreError,
    DryRun,
    Systemic,
    Renewed,
    Readmitted,
}

impl CullResult {
    pub const ALL: [CullResult; 8] = [
        CullResult::Culled,
        CullResult::NoToken,
        CullResult::OverBudget,
        CullResult::StoreError,
        CullResult::DryRun,
        CullResult::Systemic,
        CullResult::Renewed,
        CullResult::Readmitted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CullResult::Culled => "culled",
            CullResult::NoToken => "no_token",
            CullResult::OverBudget => "over_budget",
            CullResult::StoreError => "store_error",
            CullResult::DryRun => "dry_run",
            CullResult::Systemic => "systemic",
            CullResult::Renewed => "renewed",
            CullResult::Readmitted => "readmitted",
        }
    }
}

/// What the edge refused (`portcullis_edge_refusals_total{reason}`): limits
/// and identity checks that answer before any gate (CONTRACT §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeRefusal {
    /// A connection beyond `max_connections`, closed at once.
    ConnectionLimit = 0,
    /// A PROXY-protocol listener's connection from an untrusted peer.
    ProxyUntrusted,
    /// A missing or malformed PROXY header.
    ProxyInvalid,
    /// A header block slower than `client_header_timeout_ms` (408).
    HeaderTimeout,
    /// A body pause longer than `client_body_timeout_ms` (408).
    BodyTimeout,
    /// A body over `max_request_body_bytes` (413).
    BodyTooLarge,
    // issue 40, item 8
    /// An HTTP/2 connection past `h2_max_glitches`: GOAWAY ENHANCE_YOUR_CALM, closed.
    H2Glitches,
}

impl EdgeRefusal {
    pub const ALL: [EdgeRefusal; 7] = [
        EdgeRefusal::ConnectionLimit,
        EdgeRefusal::ProxyUntrusted,
        EdgeRefusal::ProxyInvalid,
        EdgeRefusal::HeaderTimeout,
        EdgeRefusal::BodyTimeout,
        EdgeRefusal::BodyTooLarge,
        // issue 40, item 8
        EdgeRefusal::H2Glitches,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EdgeRefusal::ConnectionLimit => "connection_limit",
            EdgeRefusal::ProxyUntrusted => "proxy_untrusted",
            EdgeRefusal::ProxyInvalid => "proxy_invalid",
            EdgeRefusal::HeaderTimeout => "header_timeout",
            EdgeRefusal::BodyTimeout => "body_timeout",
            EdgeRefusal::BodyTooLarge => "body_too_large",
            // issue 40, item 8
            EdgeRefusal::H2Glitches => "h2_glitches",
        }
    }
}

/// The status class of a response (`code` label): `1xx`…`5xx`, or `none`
/// when no response was sent.
pub fn code_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "none",
    }
}
