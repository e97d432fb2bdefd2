//! `early_request_filter`'s checks: a request that cannot be forwarded unambiguously
//! (framing, target, `Content-Length` lists, data past `Content-Length: 0`), a header block
//! over `max_request_header_bytes` and a declared body over `max_request_body_bytes` are
//! refused before any gate runs.

use pingora::proxy::Session;
use pingora::Result;

use super::request::{self, header_block_len, invalid_target};
use crate::config::ServerSettings;
use crate::edge;
use crate::respond::Refusal;

/// The refusal of the first check `session`'s request fails, if any. A `Content-Length`
/// list of one value (`5, 5`) is rewritten to that value: a list is never passed on.
pub(super) fn first_refusal(
    session: &mut Session,
    server: &ServerSettings,
) -> Result<Option<Refusal>> {
    const BAD: Refusal = Refusal::BadRequest("portcullis: bad request\n");
    let framing = crate::framing::check(&session.req_header().headers, || {
        session
            .as_downstream()
            .as_http1()
            .map(|h1| h1.get_headers_raw_bytes())
    });
    if framing.is_err() {
        return Ok(Some(BAD));
    }
    if invalid_target(session) {
        let why = "portcullis: invalid byte in request target\n";
        return Ok(Some(Refusal::BadRequest(why)));
    }
    let req = session.req_header();
    if crate::framing::asterisk_target_misused(&req.method, req.raw_path()) {
        let why = "portcullis: request target * is for OPTIONS only\n";
        return Ok(Some(Refusal::BadRequest(why)));
    }
    if crate::framing::target_form_invalid(&req.method, req.raw_path()) {
        let why = "portcullis: request target in no form of RFC 9112 section 3.2\n";
        return Ok(Some(Refusal::BadRequest(why)));
    }
    match crate::framing::content_length_list(&session.req_header().headers) {
        Ok(None) => {}
        Ok(Some(one)) => {
            session
                .req_header_mut()
                .insert_header(http::header::CONTENT_LENGTH, one)?;
        }
        Err(()) => return Ok(Some(BAD)),
    }
    if request::data_past_zero_length(session) {
        let why = "portcullis: body past content-length: 0\n";
        return Ok(Some(Refusal::BadRequest(why)));
    }
    if header_block_len(session) > server.max_request_header_bytes {
        return Ok(Some(Refusal::HeaderTooLarge));
    }
    let max_body = server.max_request_body_bytes;
    if edge::limits::declared_too_large(&session.req_header().headers, max_body) {
        return Ok(Some(Refusal::PayloadTooLarge));
    }
    Ok(None)
}
