//! The admin HTML status page (`GET /`): one self-contained page (inline CSS
//! and script, no external asset) that reads `/status` every two seconds and
//! renders it for an incident: state, in-flight against each class's cap,
//! the rate-limit store, every upstream and backend with its cull lease, the
//! culling tokens and the last cull decisions, and what HAProxy's stats page
//! shows per backend and per route (requests per second, the status mix, p50
//! and p99 latency, what is open now; the busiest routes, with a line summing them
//! all, as `/status` lists them), with why a failing backend is still in
//! rotation and a manual state with who and why when `/status` has one.
//! Values are inserted as text, never as HTML.

/// The page, served as is.
pub const PAGE: &str = include_str!("status.html");

#[cfg(test)]
mod tests {
    #[test]
    fn page_is_self_contained() {
        let p = super::PAGE;
        assert!(p.contains("fetch(\"/status\""));
        for external in ["src=\"http", "href=\"http", "@import", "<link"] {
            assert!(!p.contains(external), "external asset: {external}");
        }
        assert!(!p.contains("innerHTML"), "values go in as text");
    }
}
