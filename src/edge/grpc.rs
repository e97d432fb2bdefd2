//! gRPC over HTTP/2 passes through unchanged, trailers included (Pingora forwards
//! HTTP/2 trailers). For culling a gRPC call's outcome is its `grpc-status` (in the
//! trailers, or in the headers of a trailers-only response), not the HTTP status,
//! which is 200 for failed calls too.

use http::HeaderMap;

/// The `grpc-status` code in `headers`, if any.
pub fn status_of(headers: &HeaderMap) -> Option<u32> {
    headers
        .get(&crate::edge::headers::names::lookup::GRPC_STATUS)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// Whether a gRPC status is the server's fault, the codes gRPC maps to HTTP 5xx
/// (and Envoy's outlier detection counts): UNKNOWN (2), DEADLINE_EXCEEDED (4),
/// UNIMPLEMENTED (12), INTERNAL (13), UNAVAILABLE (14), DATA_LOSS (15). Client-side
/// codes (INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, ...) are not.
pub fn is_backend_error(code: u32) -> bool {
    matches!(code, 2 | 4 | 12 | 13 | 14 | 15)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_codes_are_errors_client_codes_are_not() {
        for c in [2, 4, 12, 13, 14, 15] {
            assert!(is_backend_error(c), "{c}");
        }
        for c in [0, 1, 3, 5, 6, 7, 8, 9, 10, 11, 16] {
            assert!(!is_backend_error(c), "{c}");
        }
    }

    #[test]
    fn status_is_read_from_the_header_map() {
        let mut h = HeaderMap::new();
        assert_eq!(status_of(&h), None);
        h.insert("grpc-status", http::HeaderValue::from_static("14"));
        assert_eq!(status_of(&h), Some(14));
        h.insert("grpc-status", http::HeaderValue::from_static("x"));
        assert_eq!(status_of(&h), None);
    }
}
